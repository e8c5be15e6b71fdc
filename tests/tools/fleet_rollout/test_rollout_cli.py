"""The `fleet-rollout` command: bad input names the field and touches nothing; operator
commands act on the stored rollout; a second run is refused with the holder's name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.fleet_rollout.cli import main
from tools.fleet_rollout.inventory import Host
from tools.fleet_rollout.plan import make_plan
from tools.fleet_rollout.spec import load_spec
from tools.fleet_rollout.store import Store

INI = "[rack_r1]\ns1 ansible_host=127.0.0.1 disk=nvme\n[rack_r2]\ns2 ansible_host=127.0.0.1 disk=hdd\n"


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "policy.toml").write_text('[io_service]\ncpus = "0"\n')
    (tmp_path / "hosts.ini").write_text(INI)
    return tmp_path


def spec(work: Path, extra: str = "", select: str = "disk=nvme") -> Path:
    p = work / "r.toml"
    p.write_text(f'name = "r1"\npolicy = "policy.toml"\n[inventory]\nsource = "hosts.ini"\n'
                 f'select = "{select}"\n{extra}')
    return p


def run(work: Path, *args: str) -> int:
    return main(["--db", str(work / "r.db"), "--plaintext", *args])


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
    assert Store(work / "r.db").rollouts() == []


def test_operator_commands_and_a_held_lease(work: Path, capsys: pytest.CaptureFixture) -> None:
    s = load_spec(spec(work))
    store = Store(work / "r.db", holder="ops@ctl-7:4242")
    store.create(s, make_plan([Host("s1", "127.0.0.1:1", "r1")], s))
    store.acquire("r1", 60)  # another controller runs it
    assert run(work, "run", str(work / "r.toml")) == 1
    assert "rollout r1 is being run by ops@ctl-7:4242" in capsys.readouterr().err
    assert run(work, "pause", "r1") == 0  # pause reaches a running controller through the store
    assert store.rollout("r1").state == "paused"
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
