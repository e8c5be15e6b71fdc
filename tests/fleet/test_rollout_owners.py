"""One owner per host change, against real hostd processes (tools/dev/fleetsim.py) and a
real scheduler, which keeps the rollouts: what two operators of one fleet do to each
other, and a scheduler that goes away in the middle of a rollout.

- Two operators start rollouts with different policies over the same hosts, together,
  and 2.5 s apart: the second is refused, naming the first and the hosts; the first
  converts them all. Nothing is left cordoned, and every host carries the carve of the
  rollout that says it verified it (hostd's compare-and-set records the operation; the
  rollout reads it back). (Hosts held by another owner are skipped by a rollout the
  scheduler did accept: tests/tools/fleet_rollout/test_engine.py.)
- An operator re-carves a converted host by hand; the rollout's rollback leaves that
  carve alone and says who made it.
- The scheduler stopped while the canary soaks: the controller can neither uncordon
  nor write, so it stops with one line (exit 3), the rollout held where it was; after
  the scheduler is back, `resume` finishes with every host active.
- A conversion that would strand running VMs: hostd refuses the carve, the rollout
  drains the host, the scheduler's drain replaces the VMs (on_maintenance = replace,
  a disruption budget of 1) one at a time on the other host, and the carve goes on.
- Rollout X done, then rollout Y (another operator, another policy) done over the same
  hosts, a VM that a drain would replace on one of them: X's rollback names Y's carve
  on every host and drains none (the VM stays, the same VM)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from rollout_cli import BIN, LENIENT_GATE, rollout_env
from rollout_cli import rollout as cli
from tools.dev.fleetsim import POLICY, SimFleet

from api import hostd_pb2 as pb
from tools.fleet_rollout.spec import policy_digest

pytestmark = pytest.mark.slow
SETS = {"a": 2, "b": 2, "c": 1, "d": 2, "e": 2}  # hosts per test, by the label `set`
OTHER = POLICY.replace("count_per_node = 2048", "count_per_node = 1024")
STRAND = POLICY.replace('cpus = "1"', 'cpus = "1-2"', 1)  # the host OS takes VM CPU 2
SPEC = """name = "{name}"
kind = "convert"
policy = "{policy}"
[inventory]
source = "scheduler"
select = "set={set}"
[waves]
canary = 1
percent = [100]
max_failures = [0, 1]
[limits]
concurrency = 4
per_rack = 4
rpc_timeout_s = 5
unreachable_s = 3
[steps]
baseline_s = 0  # the gate: ceilings over the soak (this fleet just started)
soak_s = 4
""" + LENIENT_GATE


def labels(i: int, n: int) -> dict[str, str]:
    sets = [s for s, k in SETS.items() for _ in range(k)]
    return {"set": sets[i]}


@pytest.fixture(scope="module")
def fleet(sched):  # type: ignore[no-untyped-def]
    s, w = sched["sched"], sched["dir"]
    f = SimFleet(w / "owners", sum(SETS.values()), 2, scheduler_url=s.url, host_token=sched["host_token"],
                 admin_token=sched["admin"], certs=sched["certs"], prefix="own", labels=labels)
    try:
        f.start(timeout_s=300)
        (w / "policy.toml").write_text(f.policy_text)
        (w / "other.toml").write_text(OTHER)
        (w / "strand.toml").write_text(STRAND)
        yield f
    finally:
        f.stop()


def spec(work: Path, name: str, policy: str, hosts: str, steps: str = "", soak_s: int = 4,
         kind: str = "convert") -> str:
    work.mkdir(exist_ok=True)
    text = SPEC.format(name=name, policy=work.parent / policy, set=hosts).replace("[steps]\n", f"[steps]\n{steps}")
    text = text.replace('kind = "convert"', f'kind = "{kind}"')
    text = text.replace("soak_s = 4\n", f"soak_s = {soak_s}\n")
    (work / f"{name}.toml").write_text(text)
    return f"{name}.toml"


def start(sched: dict, work: Path, *args: str) -> subprocess.Popen:
    work.mkdir(exist_ok=True)
    return subprocess.Popen([BIN, *args, "--json"], cwd=work, env=rollout_env(sched, work), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)



def admin(f: SimFleet) -> dict[str, tuple[str, str | None]]:
    with f.api() as api:
        return {x["name"]: (x["admin_state"], x["admin_owner"]) for x in api.get("/v1/hosts").json()["items"]
                if x["name"].startswith("own-")}


def host_states(sched: dict, work: Path, name: str) -> dict[str, dict]:
    r = cli(sched, work, "status", name, "--json", "--transitions")
    assert r.returncode == 0, r.stderr
    out: dict[str, dict] = {}
    for t in json.loads(r.stdout)["transitions"]:
        if t["host"] != "-":
            out[t["host"]] = {"state": t["to"], "detail": t["detail"]}
    return out


def one_refused(sched: dict, procs: list[tuple[subprocess.Popen, Path, str, str]], hosts: list[str]) -> tuple:
    """Exactly one rollout ran and converted every host (each carrying its carve, read
    back); the other was refused, naming it and the hosts. Returns the winner's
    (work, name, policy)."""
    results = [(p.communicate(timeout=240), p.returncode, work, name, policy) for p, work, name, policy in procs]
    ran = [r for r in results if r[1] == 0]
    refused = [r for r in results if r[1] != 0]
    assert len(ran) == 1 and len(refused) == 1, [(r[1], r[0][1][-800:]) for r in results]
    (_, err), rc, _, _, _ = refused[0]
    _, _, work, name, policy = ran[0]
    # (2.5 s later the first's canary may be converted: the second's plan leaves it out)
    assert rc == 1 and "hyb.rollout.overlap" in err and f"{name} (running) holds" in err, err
    assert any(h in err.split("holds", 1)[1] for h in hosts), err
    digest = policy_digest((work.parent / policy).read_text())
    assert {h: st["state"] for h, st in host_states(sched, work, name).items()} == dict.fromkeys(hosts, "verified")
    return work, name, policy, digest


def names(f: SimFleet, hosts: str) -> list[str]:
    return [h.name for h in f.hosts if h.labels["set"] == hosts]


def test_two_rollouts_started_together_one_is_refused_and_a_rollback_keeps_to_its_own(fleet, sched) -> None:  # type: ignore[no-untyped-def]
    w = sched["dir"]
    runs = [(w / "op-a", "conv-a", "policy.toml"), (w / "op-b", "conv-b", "other.toml")]
    procs = [(start(sched, work, "run", spec(work, name, policy, "a")), work, name, policy)
             for work, name, policy in runs]
    hosts = names(fleet, "a")
    work_a, name, _, digest = one_refused(sched, procs, hosts)
    for h in hosts:
        info = fleet.info(h)
        assert (info.carved_policy_digest, info.carve_operation) == (digest, f"rollout/{name}/{h}/carve")
    assert set(admin(fleet).values()) == {("active", None)}

    # an operator carves one of the hosts by hand (a compare-and-set on the rollout's carve)
    mine = sorted(hosts)
    hand = mine[0]
    stub, ch = fleet.stub(hand, "fleet-rollout")
    try:
        stub.Carve(pb.CarveRequest(policy_toml=OTHER, policy_digest=policy_digest(OTHER),
                                   expected_digest=fleet.info(hand).carved_policy_digest,
                                   operation_id="ticket-4711"), timeout=60)
    finally:
        ch.close()
    r = cli(sched, work_a, "rollback", name, "--json")
    assert r.returncode == 3, r.stderr[-2000:]
    st = json.loads(r.stdout)
    assert st["state"] == "halted" and hand in st["reason"], st
    why = next(p for p in st["problems"] if p["host"] == hand)["rollback"]
    assert "(operation ticket-4711), not this rollout's carve" in why, why
    assert fleet.info(hand).carve_operation == "ticket-4711"  # left alone
    for h in mine[1:]:
        assert fleet.info(h).carved_policy_digest == ""  # its own: undone
    assert set(admin(fleet).values()) == {("active", None)}


def test_a_second_rollout_2_5_s_later_is_refused(fleet, sched) -> None:  # type: ignore[no-untyped-def]
    w = sched["dir"]
    # The first soaks 8 s a wave: the second's start (a Python process, then each host's
    # preflight) took over 4 s beside a busy machine, by when both hosts were converted
    # and its plan fitted none, before its create could be refused.
    first = start(sched, w / "op-c", "run", spec(w / "op-c", "conv-1", "policy.toml", "b", soak_s=8))
    time.sleep(2.5)
    second = start(sched, w / "op-d", "run", spec(w / "op-d", "conv-2", "other.toml", "b"))
    work, name, _, digest = one_refused(sched, [(first, w / "op-c", "conv-1", "policy.toml"),
                                                (second, w / "op-d", "conv-2", "other.toml")], names(fleet, "b"))
    assert name == "conv-1"
    for h in names(fleet, "b"):
        assert fleet.info(h).carved_policy_digest == digest
    assert set(admin(fleet).values()) == {("active", None)}


def test_a_scheduler_outage_after_a_passed_gate_pauses_and_resume_finishes(fleet, sched) -> None:  # type: ignore[no-untyped-def]
    w = sched["dir"] / "op-outage"
    s = sched["sched"]
    # The canary's state read straight from the scheduler's API, not by `fleet-rollout
    # status` (a Python start: up to seconds each beside a busy CPU, once long enough that
    # the 12 s soak was over when the scheduler stopped).
    p = start(sched, w, "run", spec(w, "conv-out", "policy.toml", "c", soak_s=12))
    try:
        deadline = time.monotonic() + 120
        with fleet.api() as api:
            while not any(h["state"] == "soaking" for h in
                          api.get("/v1/rollouts/conv-out/hosts", params={"brief": True}).json().get("items", ())):
                assert time.monotonic() < deadline and p.poll() is None, "the canary never soaked"
                time.sleep(0.2)
        s.stop()  # the canary's gate passes; neither its uncordon nor the record gets an answer
        _, err = p.communicate(timeout=120)
    finally:
        if s.proc is None or s.proc.poll() is not None:
            s.start()
    assert p.returncode == 3, err[-2000:]
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"fleet-rollout: rollout state at {s.url}: scheduler ") and line.endswith(
        "the rollout stays where it was (`fleet-rollout resume conv-out` continues it)"), err[-2000:]
    held = _states(sched, w, "conv-out")
    assert [h for h, x in held.items() if x["state"] in ("soaking", "restoring")], held  # held where it was
    assert not [h for h, x in held.items() if x["state"] in ("failed", "rolling_back")], held
    r = cli(sched, w, "resume", "conv-out", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["state"] == "done"
    assert {x["state"] for x in _states(sched, w, "conv-out").values()} == {"verified"}
    assert set(admin(fleet).values()) == {("active", None)}


def _states(sched: dict, work: Path, name: str) -> dict[str, dict]:
    r = cli(sched, work, "status", name, "--json", "--transitions")
    return host_states(sched, work, name) if r.returncode == 0 else {}


def test_a_conversion_that_would_strand_vms_drains_the_host_and_moves_them_one_at_a_time(fleet, sched) -> None:  # type: ignore[no-untyped-def]
    w = sched["dir"] / "op-drain"
    d = sorted(names(fleet, "d"))
    web = {"vcpus": 1, "memory_mib": 128, "image": "smoke", "host_labels": {"set": "d"},
           "on_maintenance": "replace", "disruption_budget": {"group": "web", "max_unavailable": 1}}
    with fleet.api() as api:
        for n in ("web-1", "web-2"):
            r = api.post("/v1/vms", json=web | {"name": n}, headers={"Idempotency-Key": n})
            assert r.status_code == 202, r.text
        vms = [v for v in api.get("/v1/vms").json()["items"] if v["name"].startswith("web-")]
        for v in vms:
            v.update(_wait_running(api, v["id"]))
    assert {v["host"] for v in vms} == {d[0]}  # pack: both on the first
    assert 2 in {c for v in vms for c in v["placement"]["cpus"]}, vms  # so the new carve strands one
    r = cli(sched, w, "run", spec(w, "conv-strand", "strand.toml", "d", "drain_timeout_s = 120\n"), "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    states = host_states(sched, w, "conv-strand")
    assert {h: x["state"] for h, x in states.items()} == dict.fromkeys(d, "verified")
    digest = policy_digest(STRAND)
    for h in d:
        assert fleet.info(h).carved_policy_digest == digest
    res = cli(sched, w, "status", "conv-strand", "--json", "--transitions")
    drained = {t["host"] for t in json.loads(res.stdout)["transitions"] if t["to"] == "draining"}
    assert d[0] in drained, res.stdout[-3000:]
    with fleet.api() as api:
        vms = [v for v in api.get("/v1/vms").json()["items"] if v["name"].startswith("web-")]
        audit = api.get("/v1/audit", params={"limit": 1000}).json()["items"]
    assert sorted(v["name"] for v in vms) == ["web-1", "web-2"]
    assert all(v["status"] == "running" and v["host"] in d and v["replaces"] is None for v in vms), vms
    # one at a time: each drain created a replacement and deleted its old VM before the next
    for h in drained:
        steps = [a["action"] for a in sorted(audit, key=lambda a: a["id"]) if a["principal"] == f"drain:{h}"]
        assert steps == ["vm.create", "vm.delete"] * 2, (h, steps)
    assert set(admin(fleet).values()) == {("active", None)}


def test_a_rollback_drains_no_host_that_a_later_rollout_carved(fleet, sched) -> None:  # type: ignore[no-untyped-def]
    w = sched["dir"]
    e = sorted(names(fleet, "e"))
    web = {"name": "keep-1", "vcpus": 1, "memory_mib": 128, "image": "smoke", "host_labels": {"set": "e"},
           "on_maintenance": "replace"}
    with fleet.api() as api:
        r = api.post("/v1/vms", json=web, headers={"Idempotency-Key": "keep-1"})
        assert r.status_code == 202, r.text
        vm = _wait_running(api, r.json()["id"])
    x, y = w / "op-x", w / "op-y"
    r = cli(sched, x, "run", spec(x, "conv-x", "policy.toml", "e"), "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    r = cli(sched, y, "run", spec(y, "conv-y", "other.toml", "e", kind="policy"), "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    for h in e:
        assert fleet.info(h).carve_operation == f"rollout/conv-y/{h}/carve"
    with fleet.api() as api:
        seen = max(a["id"] for a in api.get("/v1/audit", params={"limit": 1}).json()["items"])
    r = cli(sched, x, "rollback", "conv-x", "--json")
    assert r.returncode == 3, r.stderr[-3000:]
    st = json.loads(r.stdout)
    assert st["state"] == "halted", st
    for h in e:
        why = next(p for p in st["problems"] if p["host"] == h)["rollback"]
        assert why.startswith("not rolled back: the host is carved with ") and f"rollout/conv-y/{h}/carve" in why, why
        assert fleet.info(h).carve_operation == f"rollout/conv-y/{h}/carve"  # left alone
    with fleet.api() as api:
        since = [a for a in api.get("/v1/audit", params={"limit": 1000}).json()["items"] if a["id"] > seen]
        after = api.get(f"/v1/vms/{vm['id']}").json()
    changes = [(a["principal"], a["action"], a["target"]) for a in since if a["action"].startswith(("host.", "vm."))
               and a["action"] not in ("host.register", "host.update")]
    assert changes == [], changes  # no drain, no cordon, no uncordon, no VM moved
    assert (after["status"], after["host"]) == ("running", vm["host"]), after  # the same VM, where it was
    assert set(admin(fleet).values()) == {("active", None)}


def _wait_running(api, vm_id: str) -> dict:  # type: ignore[no-untyped-def]
    end = time.monotonic() + 60
    while time.monotonic() < end:
        v = api.get(f"/v1/vms/{vm_id}").json()
        if v["status"] in ("running", "failed"):
            assert v["status"] == "running", v
            return v
        time.sleep(0.2)
    raise AssertionError(f"{vm_id} never ran")
