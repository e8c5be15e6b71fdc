"""One owner per host change, against real hostd processes (tools/dev/fleetsim.py) and a
real scheduler: what two operators of one fleet do to each other, and a scheduler that
goes away in the middle of a rollout.

- Two rollouts with different policies over the same hosts, each with its own state
  file, started together; then two started 2.5 s apart from one state file under two
  names. Each host is taken by one of them (its cordon, owned by ``rollout:<name>``); the
  other skips it, naming the holder. Nothing is left cordoned, and every host carries
  the carve of the rollout that says it verified it (hostd's compare-and-set records
  the operation; the rollout reads it back).
- An operator re-carves a converted host by hand; the rollout's rollback leaves that
  carve alone and says who made it.
- The scheduler stopped while the canary soaks: the gate passes, the uncordon gets no
  answer, the rollout pauses with the reason (exit 3), the host held where it was;
  after the scheduler is back, `resume` finishes with every host active.

Not yet here (issue 27's next part): the scheduler keeping rollouts (`/v1/rollouts`),
which refuses the second rollout at plan instead of letting it skip hosts."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from rollout_cli import BIN, rollout_env
from rollout_cli import rollout as cli
from tools.dev.fleetsim import POLICY, SimFleet

from api import hostd_pb2 as pb
from tools.fleet_rollout.spec import policy_digest

pytestmark = pytest.mark.slow
SETS = {"a": 4, "b": 2, "c": 2}  # hosts per test, by the label `set`
OTHER = POLICY.replace("count_per_node = 2048", "count_per_node = 1024")
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
unreachable_s = 5
[steps]
baseline_s = 0  # the gate: ceilings over the soak (this fleet just started)
soak_s = 4
[gate]
min_samples = 3
controls = 0
# a busy 2-CPU machine: the trees' animator catches up in bursts (test_rollout_fleet.py)
probe_p99_rise_pct = 400
psi_rise_pct = 400
foreign_cpu_max = 0.9
"""


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
        yield f
    finally:
        f.stop()


def spec(work: Path, name: str, policy: str, hosts: str) -> str:
    work.mkdir(exist_ok=True)
    (work / f"{name}.toml").write_text(SPEC.format(name=name, policy=work.parent / policy, set=hosts))
    return f"{name}.toml"


def start(sched: dict, work: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([BIN, *args, "--json"], cwd=work, env=rollout_env(sched, work), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(p: subprocess.Popen) -> tuple[int, dict]:
    out, err = p.communicate(timeout=240)
    assert out, err[-2000:]
    return p.returncode, json.loads(out)


def carve_of(f: SimFleet, host: str) -> pb.HostInfo:
    stub, ch = f.stub(host, "fleet-rollout")
    try:
        return stub.GetHostInfo(pb.GetHostInfoRequest(), timeout=10)
    finally:
        ch.close()


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


def check_partition(f: SimFleet, sched: dict, runs: list[tuple[Path, str, str]], hosts: list[str]) -> dict[str, str]:
    """Each host verified by exactly one rollout and carrying its carve; skipped by the
    other, naming the holder; nothing held. Returns host -> the rollout that has it."""
    owner: dict[str, str] = {}
    for work, name, policy in runs:
        digest = policy_digest((work.parent / policy).read_text())
        for host, st in host_states(sched, work, name).items():
            if st["state"] == "verified":
                assert host not in owner, (host, owner)
                owner[host] = name
                info = carve_of(f, host)
                assert (info.carved_policy_digest, info.carve_operation) == (digest, f"rollout/{name}/{host}/carve")
            else:
                assert st["state"] == "skipped", (name, host, st)
                assert "by rollout:" in st["detail"]["reason"] or "carved with" in st["detail"]["reason"], st
    assert sorted(owner) == sorted(hosts)
    assert set(admin(f).values()) == {("active", None)}
    return owner


def names(f: SimFleet, hosts: str) -> list[str]:
    return [h.name for h in f.hosts if h.labels["set"] == hosts]


def test_two_rollouts_started_together_split_the_hosts_and_a_rollback_keeps_to_its_own(fleet, sched) -> None:  # type: ignore[no-untyped-def]
    w = sched["dir"]
    runs = [(w / "op-a", "conv-a", "policy.toml"), (w / "op-b", "conv-b", "other.toml")]
    procs = [start(sched, work, "run", spec(work, name, policy, "a")) for work, name, policy in runs]
    results = [finish(p) for p in procs]
    for rc, st in results:
        assert rc == 0 and st["state"] == "done", st
    owner = check_partition(fleet, sched, runs, names(fleet, "a"))
    assert set(owner.values()) <= {"conv-a", "conv-b"}

    # an operator carves one of conv-a's hosts by hand (a compare-and-set on conv-a's carve)
    work_a = runs[0][0]
    mine = sorted(h for h, r in owner.items() if r == "conv-a")
    if not mine:
        pytest.skip("conv-b took every host: nothing of conv-a's to change")  # never seen: the canaries race
    hand = mine[0]
    stub, ch = fleet.stub(hand, "fleet-rollout")
    try:
        stub.Carve(pb.CarveRequest(policy_toml=OTHER, policy_digest=policy_digest(OTHER),
                                   expected_digest=carve_of(fleet, hand).carved_policy_digest,
                                   operation_id="ticket-4711"), timeout=60)
    finally:
        ch.close()
    r = cli(sched, work_a, "rollback", "conv-a", "--json")
    assert r.returncode == 3, r.stderr[-2000:]
    st = json.loads(r.stdout)
    assert st["state"] == "halted" and hand in st["reason"], st
    why = next(p for p in st["problems"] if p["host"] == hand)["rollback"]
    assert "(operation ticket-4711), not this rollout's carve" in why, why
    assert carve_of(fleet, hand).carve_operation == "ticket-4711"  # left alone
    for h in mine[1:]:
        assert carve_of(fleet, h).carved_policy_digest == ""  # its own: undone
    for h, r2 in owner.items():
        if r2 == "conv-b":
            assert carve_of(fleet, h).carve_operation == f"rollout/conv-b/{h}/carve"  # the other's: kept
    assert set(admin(fleet).values()) == {("active", None)}


def test_two_rollouts_2_5_s_apart_from_one_state_file(fleet, sched) -> None:  # type: ignore[no-untyped-def]
    w = sched["dir"] / "op-shared"
    first = start(sched, w, "run", spec(w, "conv-1", "policy.toml", "b"))
    time.sleep(2.5)
    second = start(sched, w, "run", spec(w, "conv-2", "other.toml", "b"))
    for rc, st in (finish(first), finish(second)):
        assert rc == 0 and st["state"] == "done", st
    check_partition(fleet, sched, [(w, "conv-1", "policy.toml"), (w, "conv-2", "other.toml")], names(fleet, "b"))


def test_a_scheduler_outage_after_a_passed_gate_pauses_and_resume_finishes(fleet, sched) -> None:  # type: ignore[no-untyped-def]
    w = sched["dir"] / "op-outage"
    s = sched["sched"]
    p = start(sched, w, "run", spec(w, "conv-out", "policy.toml", "c"))
    try:
        deadline = time.monotonic() + 120
        while not any(st["state"] == "soaking" for st in _states(sched, w, "conv-out").values()):
            assert time.monotonic() < deadline and p.poll() is None, "the canary never soaked"
            time.sleep(0.3)
        s.stop()  # the canary's gate passes; its uncordon gets no answer
        rc, st = finish(p)
    finally:
        if s.proc is None or s.proc.poll() is not None:
            s.start()
    assert rc == 3 and st["state"] == "paused", st
    assert st["reason"].startswith("no answer for 5 s: scheduler POST /v1/hosts/"), st
    held = _states(sched, w, "conv-out")
    assert [h for h, x in held.items() if x["state"] == "restoring"], held  # the verdict kept
    assert not [h for h, x in held.items() if x["state"] in ("failed", "rolling_back")], held
    r = cli(sched, w, "resume", "conv-out", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["state"] == "done"
    assert {x["state"] for x in _states(sched, w, "conv-out").values()} == {"verified"}
    assert set(admin(fleet).values()) == {("active", None)}


def _states(sched: dict, work: Path, name: str) -> dict[str, dict]:
    if not (work / "rollouts.db").exists():
        return {}
    r = cli(sched, work, "status", name, "--json", "--transitions")
    return host_states(sched, work, name) if r.returncode == 0 else {}
