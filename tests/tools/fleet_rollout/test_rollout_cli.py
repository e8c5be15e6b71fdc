"""The `fleet-rollout` command against a real `scheduler serve` (conftest.py), which keeps
the rollouts: bad input names the field and touches nothing; operator commands act on
the stored rollout; a second run is refused with the holder's name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.fleet_rollout.cli import main
from tools.fleet_rollout.clients import Scheduler
from tools.fleet_rollout.inventory import Host
from tools.fleet_rollout.plan import make_plan
from tools.fleet_rollout.spec import load_spec
from tools.fleet_rollout.store import Store

INI = "[rack_r1]\ns1 ansible_host=127.0.0.1 disk=nvme\n[rack_r2]\ns2 ansible_host=127.0.0.1 disk=hdd\n"


@pytest.fixture
def work(tmp_path: Path, sched_url: tuple[str, Path]) -> Path:
    (tmp_path / "policy.toml").write_text('[io_service]\ncpus = "0"\n')
    (tmp_path / "hosts.ini").write_text(INI)
    (tmp_path / "sched").write_text("\n".join((sched_url[0], str(sched_url[1]))))
    return tmp_path


def store(work: Path, holder: str | None = None) -> Store:
    url, token = (work / "sched").read_text().split("\n")
    return Store(Scheduler(url, Path(token).read_text()), holder=holder)


def spec(work: Path, extra: str = "", select: str = "disk=nvme") -> Path:
    p = work / "r.toml"
    p.write_text(f'name = "r1"\npolicy = "policy.toml"\n[inventory]\nsource = "hosts.ini"\n'
                 f'select = "{select}"\n{extra}')
    return p


def run(work: Path, *args: str) -> int:
    url, token = (work / "sched").read_text().split("\n")
    return main(["--scheduler-url", url, "--token-file", token, "--plaintext", *args])


def test_plan_from_an_inventory_file(work: Path, capsys: pytest.CaptureFixture) -> None:
    assert run(work, "plan", str(spec(work)), "--json", "--no-preflight") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["waves"] == [["s1"]] and len(out["policy_digest"]) == 64


@pytest.mark.parametrize("extra, select, field", [
    ("[waves]\npercent = [120]\n", "disk=nvme", "waves.percent"),
    ("[limits]\nparallel = 3\n", "disk=nvme", "limits.parallel"),
    ("", "disk=ssd", "inventory.select"),
])
def test_bad_input_names_the_field_and_creates_nothing(work: Path, capsys: pytest.CaptureFixture,
                                                       extra: str, select: str, field: str) -> None:
    assert run(work, "run", str(spec(work, extra, select))) == 1
    assert f"fleet-rollout: {field}:" in capsys.readouterr().err
    st = store(work)
    assert st.rollouts() == []
    st.api.close()


def test_operator_commands_and_a_held_lease(work: Path, capsys: pytest.CaptureFixture) -> None:
    s = load_spec(spec(work))
    other = store(work, holder="ops@ctl-7:4242")
    other.create(s, make_plan([Host("s1", "127.0.0.1:1", "r1")], s))
    other.acquire("r1", 60)  # another controller runs it
    assert run(work, "run", str(work / "r.toml")) == 1
    assert "rollout r1 is being run by rollout-admi's controller ops@ctl-7:4242 (fence 1," in capsys.readouterr().err
    assert run(work, "pause", "r1") == 0  # pause reaches a running controller through the store
    assert other.rollout("r1").state == "paused"
    assert run(work, "pause", "r1") == 1
    assert "pause applies to running" in capsys.readouterr().err
    assert run(work, "status", "r1", "--json") == 0
    st = json.loads(capsys.readouterr().out)
    assert st["state"] == "paused" and st["lease"]["holder"] == "ops@ctl-7:4242"
    assert st["waves"] == [{"pending": 1}]
    # a spec changed under the same name is refused: a new rollout needs a new name
    spec(work, "[limits]\nconcurrency = 3\n")
    assert run(work, "run", str(work / "r.toml")) == 1
    assert "exists with a different spec" in capsys.readouterr().err
    other.api.close()


def test_a_rollback_refused_by_a_halted_rollout_says_how_to_free_its_hosts(work: Path,
                                                                         capsys: pytest.CaptureFixture) -> None:
    """x is done; y, over the same host, halted: `fleet-rollout rollback x` is refused
    (exit 1, x stays done), naming y as halted and the command that frees the host."""
    base = load_spec(spec(work))
    ops = store(work, holder="ops@ctl-8:1")
    for name in ("x", "y"):
        s = base.model_copy(update={"name": name})
        ops.create(s, make_plan([Host("s9", "127.0.0.1:1", "r1")], s))
        ops.acquire(name, 60)
        ops.set_rollout(name, "done" if name == "x" else "halted", "test", expect="running")
        ops.release(name)
    assert run(work, "rollback", "x") == 1
    err = capsys.readouterr().err
    assert err.strip() == (
        "fleet-rollout: scheduler POST /v1/rollouts/x/rollback: hyb.rollout.overlap: rollout x shares hosts with "
        "another active rollout (a host belongs to at most one): y (halted) holds s9 (a halted rollout keeps its "
        "hosts until it is aborted: `fleet-rollout abort y` frees them, or `hybctl rollout abort y` for its "
        "controller to act on)"), err
    assert ops.rollout("x").state == "done"
    ops.api.close()


def test_a_run_that_fits_no_host_names_the_rollout_that_holds_them(work: Path,
                                                                  capsys: pytest.CaptureFixture) -> None:
    """A run whose preflight refuses every selected host (here: no hostd answers on the
    hosts' port) says which other active rollout holds them, and how to see or end it,
    instead of only the first host's reason; with nobody holding them it says the reason.
    Nothing is created either way."""
    import socket
    with socket.socket() as sk:  # a port nothing listens on: the preflight is refused at once
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    (work / "hosts.ini").write_text(f"[rack_r1]\nf1 ansible_host=127.0.0.1 hostd_port={port} disk=nvme\n"
                                    f"f3 ansible_host=127.0.0.1 hostd_port={port} disk=nvme\n")
    path = spec(work, extra="[limits]\nrpc_timeout_s = 2\n")
    # the module's scheduler keeps the other tests' rollouts (r1 holds s1): names of its own
    path.write_text(path.read_text().replace('name = "r1"', 'name = "r-fits"'))
    s = load_spec(path)
    assert run(work, "run", str(path)) == 1
    err = capsys.readouterr().err
    assert "policy: fits none of the 2 selected hosts; e.g. f1: preflight:" in err and "holds" not in err, err
    ops = store(work, holder="ops@ctl-9:1")
    other = s.model_copy(update={"name": "conv-a"})
    ops.create(other, make_plan([Host("f1", "127.0.0.1:1", "r1"), Host("f2", "127.0.0.1:1", "r1")], other))
    assert run(work, "run", str(path)) == 1
    err = capsys.readouterr().err
    assert "fleet-rollout: rollout r-fits fits none of the 2 selected hosts; e.g. f1: preflight:" in err, err
    assert err.rstrip().endswith(
        "and another active rollout holds 1 of them (a host belongs to at most one): conv-a (running) holds f1 "
        "(`fleet-rollout status conv-a` shows it; it keeps them until it ends, or `fleet-rollout abort conv-a`)"), err
    assert "r-fits" not in ops.rollouts() and "conv-a" in ops.rollouts()
    ops.api.close()


def test_a_fits_none_refusal_stands_when_the_scheduler_cannot_say_who_holds(tmp_path: Path) -> None:
    """The holders are asked after the plan failed; a scheduler that stops answering in
    that moment (here: a port nothing listens on) leaves the plan's own refusal, not a
    StoreUnavailable whose hint would resume a rollout never created."""
    import socket

    from tools.fleet_rollout.cli import _refuse_held
    from tools.fleet_rollout.plan import FitsNone
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    dead = Store(Scheduler(f"http://127.0.0.1:{port}", "t"), holder="ops@x:1", retry_s=0.2)
    assert _refuse_held(dead, "r-x", FitsNone("fits none of the 1 selected hosts", ["h1"])) is None


def test_several_holders_are_each_named(work: Path) -> None:
    """Two rollouts holding the asked hosts: both named, the sentence in the plural."""
    from tools.fleet_rollout.cli import _refuse_held
    from tools.fleet_rollout.plan import FitsNone
    from tools.fleet_rollout.store import StoreError
    ops = store(work, holder="ops@ctl-9:2")
    base = load_spec(spec(work))
    for name, host in (("hold-a", "g1"), ("hold-b", "g2")):
        s = base.model_copy(update={"name": name})
        ops.create(s, make_plan([Host(host, "127.0.0.1:1", "r1")], s))
    with pytest.raises(StoreError) as e:
        _refuse_held(ops, "r-g", FitsNone("fits none of the 3 selected hosts", ["g1", "g2", "g3"]))
    msg = str(e.value)
    assert msg.startswith("rollout r-g fits none of the 3 selected hosts, and 2 other active rollouts hold 2 "
                          "of them (a host belongs to at most one): "), msg
    assert "hold-a (running) holds g1 (`fleet-rollout status hold-a`" in msg
    assert "hold-b (running) holds g2 (`fleet-rollout status hold-b`" in msg
    for name in ("hold-a", "hold-b"):
        ops.acquire(name, 60)
        ops.set_rollout(name, "done", "test", expect="running")
        ops.release(name)
    ops.api.close()
