"""The engine's state machine on an in-memory fleet (fakefleet.py), its rollouts kept by
a real scheduler app on SQLite (conftest.py): waves, budgets, rollback, gates, owners,
outages, and a controller that dies after every possible side effect and is resumed by
a new one. The same paths on real hostd processes are in tests/fleet/."""

from __future__ import annotations

import threading
import time

import pytest
from fakefleet import Crash, FakeFleet
from rich.console import Console

from api.states import RolloutHostState
from tools.fleet_rollout import render
from tools.fleet_rollout.engine import Engine, Options
from tools.fleet_rollout.inventory import Host
from tools.fleet_rollout.plan import make_plan
from tools.fleet_rollout.render import status_dict
from tools.fleet_rollout.spec import parse_spec, policy_digest
from tools.fleet_rollout.store import Store, StoreError

NAMES = [f"h{i}" for i in range(8)]
SPEC = {"name": "r1", "policy": "p", "policy_text": "[io_service]\ncpus = \"0\"\n",
        "waves": {"canary": 1, "percent": [50, 100], "max_failures": [0, 1]},
        "limits": {"concurrency": 4, "per_rack": 2, "unreachable_s": 1.0},
        "steps": {"baseline_s": 0.3, "soak_s": 0.3},  # fake samples every 0.05 s: 6 a window
        "gate": {"min_samples": 5, "controls": 2, "alpha": 0.05}}
# A lease no test lets lapse: its renewer runs every ttl/3, and a loaded machine starved
# it past a 5 s lease (the run ends "lost"); expiry is tested in the store's own tests.
OPTS = Options(lease_ttl_s=60, poll_s=0.01, stats_wait_s=1)


def rollout(rollouts, fleet: FakeFleet, holder: str = "c1", **over) -> tuple[Store, Engine]:  # type: ignore[no-untyped-def]
    store = rollouts(holder=holder)
    spec = parse_spec({**SPEC, **over})
    if "r1" not in store.rollouts():
        store.create(spec, make_plan([Host(n, f"{n}:7443", f"r{i % 3}") for i, n in enumerate(NAMES)], spec))
    return store, Engine(store, "r1", fleet, fleet, OPTS)  # type: ignore[arg-type]


def states(store: Store) -> dict[str, str]:
    return {h.name: h.state for h in store.hosts("r1")}


def test_every_host_converted_and_another_owners_hosts_left_alone(rollouts) -> None:  # type: ignore[no-untyped-def]
    fleet = FakeFleet(NAMES)
    fleet.admin["h5"], fleet.admin_owner["h5"] = "cordoned", "alice"  # an operator's: not ours to take
    fleet.admin["h6"] = "draining"  # a hold with no owner recorded (an older client's): not ours either
    store, eng = rollout(rollouts, fleet)
    assert eng.run() == "done"
    assert states(store) == {**dict.fromkeys(NAMES, "verified"), "h5": "skipped", "h6": "skipped"}
    assert [h.carves for h in fleet.hosts.values()] == [1, 1, 1, 1, 1, 0, 0, 1]
    assert fleet.admin == {**dict.fromkeys(NAMES, "active"), "h5": "cordoned", "h6": "draining"}
    assert fleet.admin_owner["h5"] == "alice"
    skip = next(t for t in store.transitions("r1", "h5") if t["to"] == "skipped")
    assert skip["detail"]["reason"] == "the host is cordoned by alice"
    assert "2 hosts skipped (another owner's): h5, h6" in store.rollout("r1").reason
    assert store.lease("r1") is None  # released


def test_a_degraded_host_fails_its_gate_and_is_rolled_back(rollouts) -> None:  # type: ignore[no-untyped-def]
    fleet = FakeFleet(NAMES)
    store, eng = rollout(rollouts, fleet)
    bad = store.hosts("r1", wave=1)[0].name
    fleet.hosts[bad].degraded_after_carve = True
    assert eng.run() == "done"  # wave 1's budget is 1 failure
    assert states(store)[bad] == "rolled_back"
    assert fleet.hosts[bad].digest == "" and fleet.hosts[bad].uncarves == 1
    fail = next(t for t in store.transitions("r1", bad) if t["to"] == "failed")
    assert "psi_some_avg10" in fail["detail"]["reason"]
    assert fail["detail"]["verdict"]["numbers"]["psi_some_avg10/baseline"]["p"] < 0.05


def test_a_rise_across_the_fleet_during_the_canarys_soak_is_not_the_canarys(rollouts) -> None:  # type: ignore[no-untyped-def]
    """Every host's PSI goes from 1 to 3 when the canary is carved (the fleet's load
    changed, not the carve): the canary rose over its own baseline, but its controls rose
    alike over the same windows and it is no worse than they are now, so it passes, and
    its gate says why. Each host after it soaks against a baseline already at 3."""
    fleet = FakeFleet(NAMES)
    fleet.fleet_rise_at_carve = 3.0
    store, eng = rollout(rollouts, fleet)
    canary = store.hosts("r1", wave=0)[0].name
    assert eng.run() == "done"
    assert states(store)[canary] == "verified", store.transitions("r1", canary)
    soaked = next(t for t in store.transitions("r1", canary) if t["to"] == "restoring")["detail"]
    assert soaked["controls_baseline_samples"] > 0
    nums = soaked["verdict"]["numbers"]
    assert nums.get("psi_some_avg10/fleet", {}).get("rise", 0) > 2, store.transitions("r1", canary)
    assert any("psi_some_avg10 rose over its baseline" in r and "as its controls did" in r
               for r in soaked["verdict"]["reasons"]), soaked["verdict"]


def test_a_policy_upgrade_rolls_a_failed_host_back_to_its_earlier_policy(rollouts) -> None:  # type: ignore[no-untyped-def]
    fleet = FakeFleet(NAMES)
    for h in fleet.hosts.values():
        h.digest, h.policy = policy_digest("old"), "old"
    store, eng = rollout(rollouts, fleet, kind="policy", policy_text="[hugepages]\nio_floor_percent = 9\n")
    bad = store.hosts("r1", wave=1)[0].name
    fleet.hosts[bad].degraded_after_carve = True
    assert eng.run() == "done"
    assert (fleet.hosts[bad].digest, fleet.hosts[bad].policy, fleet.hosts[bad].uncarves) == \
        (policy_digest("old"), "old", 0)
    assert states(store)[bad] == "rolled_back"
    new = store.rollout("r1").spec.policy_digest
    assert all(h.digest == new for n, h in fleet.hosts.items() if n != bad)


def test_a_failure_over_the_budget_halts_before_the_next_wave(rollouts) -> None:  # type: ignore[no-untyped-def]
    fleet = FakeFleet(NAMES)
    store, eng = rollout(rollouts, fleet)
    canary = store.hosts("r1", wave=0)[0].name
    fleet.hosts[canary].broken_carve = True
    assert eng.run() == "halted"
    r = store.rollout("r1")
    assert "wave 0: 1 failed hosts, over its budget of 0" in r.reason
    assert states(store)[canary] == "rolled_back"
    assert all(h.carves == 0 for h in fleet.hosts.values())  # wave 1 never started


def test_an_unreachable_host_pauses_the_rollout_where_it_is_and_resume_finishes(rollouts) -> None:  # type: ignore[no-untyped-def]
    fleet = FakeFleet(NAMES)
    store, eng = rollout(rollouts, fleet)
    h = store.hosts("r1", wave=1)[2].name
    fleet.hosts[h].unreachable = True
    assert eng.run() == "paused"
    r = store.rollout("r1")
    assert r.reason.startswith("no answer for 1 s: ") and h in r.reason
    assert states(store)[h] == "pending" and "failed" not in states(store).values()
    fleet.hosts[h].unreachable = False
    store.set_rollout("r1", "running", "resumed", fenced=False, expect="paused")
    assert Engine(store, "r1", fleet, fleet, OPTS).run() == "done"  # type: ignore[arg-type]
    assert set(states(store).values()) == {"verified"}


def test_a_scheduler_outage_after_a_passed_gate_pauses_and_keeps_the_verdict(rollouts) -> None:  # type: ignore[no-untyped-def]
    """The uncordon after a passed gate gets no answer: the host is held in `restoring`
    (not failed, not rolled back), the rollout pauses, and resume uncordons without
    soaking again."""
    fleet = FakeFleet(NAMES)
    store, eng = rollout(rollouts, fleet)
    canary = store.hosts("r1", wave=0)[0].name
    orig = fleet.set_state

    def down_at_uncordon(name: str, state: str, **kw) -> None:  # type: ignore[no-untyped-def]
        if state == "active":
            fleet.scheduler_down = True
        orig(name, state, **kw)
    fleet.set_state = down_at_uncordon  # type: ignore[method-assign]
    assert eng.run() == "paused"
    assert states(store)[canary] == "restoring" and fleet.admin[canary] == "cordoned"
    assert "scheduler" in store.rollout("r1").reason
    fleet.scheduler_down = False
    fleet.set_state = orig  # type: ignore[method-assign]
    store.set_rollout("r1", "running", "resumed", fenced=False, expect="paused")
    assert Engine(store, "r1", fleet, fleet, OPTS).run() == "done"  # type: ignore[arg-type]
    assert set(states(store).values()) == {"verified"} and set(fleet.admin.values()) == {"active"}
    assert [t["to"] for t in store.transitions("r1", canary)].count("restoring") == 1  # one soak, one verdict
    assert all(h.carves == 1 for h in fleet.hosts.values())


def test_a_second_rollout_over_hosts_of_an_active_one_is_refused_naming_it(rollouts) -> None:  # type: ignore[no-untyped-def]
    """The scheduler keeps every rollout: a second one over any host of an active one is
    refused at create, naming the other rollout and the hosts, and nothing is stored;
    once the first is done, its hosts are free again."""
    fleet = FakeFleet(NAMES)
    store, eng = rollout(rollouts, fleet)
    other = parse_spec({**SPEC, "name": "r2", "policy_text": "[io_service]\ncpus = \"0-1\"\n"})
    with pytest.raises(StoreError) as e:
        store.create(other, make_plan([Host(n, f"{n}:7443", "r0") for n in ("h3", "h9")], other))
    assert "hyb.rollout.overlap" in str(e.value) and "r1" in str(e.value) and "h3" in str(e.value)
    assert store.rollouts() == ["r1"]
    assert eng.run() == "done"
    store.create(other, make_plan([Host(n, f"{n}:7443", "r0") for n in ("h3", "h9")], other))
    assert store.rollouts() == ["r1", "r2"]


def test_a_rollback_leaves_a_carve_someone_else_made_and_says_who(rollouts) -> None:  # type: ignore[no-untyped-def]
    fleet = FakeFleet(NAMES)
    store, eng = rollout(rollouts, fleet)
    assert eng.run() == "done"
    other = policy_digest("[io_service]\ncpus = \"0-3\"\n")
    fleet.carve("h3:7443", "other", other, expected=fleet.hosts["h3"].digest, operation="ticket-9")
    store.set_rollout("r1", "rolling_back", "test", fenced=False, expect="done")
    assert Engine(store, "r1", fleet, fleet, OPTS).run() == "halted"  # type: ignore[arg-type]
    row = store.host("r1", "h3")
    assert row.state == "failed" and "(operation ticket-9), not this rollout's carve" in row.data["rollback_failed"]
    assert fleet.hosts["h3"].digest == other and fleet.hosts["h3"].uncarves == 0
    assert fleet.admin["h3"] == "active"  # the rollout's own hold ended anyway
    assert all(fleet.hosts[n].digest == "" for n in NAMES if n != "h3")
    assert "could not roll back: h3" in store.rollout("r1").reason


def test_a_host_that_comes_back_within_the_grace_continues(rollouts) -> None:  # type: ignore[no-untyped-def]
    fleet = FakeFleet(NAMES)
    store, eng = rollout(rollouts, fleet)
    h = store.hosts("r1", wave=1)[0].name
    fleet.hosts[h].unreachable = True  # a hostd restarting under systemd
    threading.Timer(0.6, lambda: setattr(fleet.hosts[h], "unreachable", False)).start()
    assert eng.run() == "done"
    assert states(store)[h] == "verified" and fleet.hosts[h].carves == 1


def test_rollback_undoes_every_host_last_wave_first(rollouts) -> None:  # type: ignore[no-untyped-def]
    fleet = FakeFleet(NAMES)
    store, eng = rollout(rollouts, fleet)
    assert eng.run() == "done"
    store.set_rollout("r1", "rolling_back", "test", fenced=False, expect="done")
    assert Engine(store, "r1", fleet, fleet, OPTS).run() == "rolled_back"  # type: ignore[arg-type]
    assert all(h.digest == "" and h.uncarves == 1 for h in fleet.hosts.values())
    order = [t["host"] for t in store.transitions("r1") if t["to"] == "rolled_back" and t["host"] != "-"]
    wave = {h.name: h.wave for h in store.hosts("r1")}
    assert [wave[n] for n in order] == sorted((wave[n] for n in order), reverse=True)


@pytest.mark.parametrize("crash_at", range(1, 30, 2))
def test_a_controller_killed_after_any_side_effect_resumes_without_redoing_one(rollouts,  # type: ignore[no-untyped-def]
                                                                               crash_at: int) -> None:
    fleet = FakeFleet(NAMES)
    fleet.crash_at = crash_at
    store, _ = rollout(rollouts, fleet)
    bad = store.hosts("r1", wave=1)[1].name
    fleet.hosts[bad].degraded_after_carve = True
    # The lease is not what this proves: the crashed controller's run releases it on the way
    # out (Crash unwinds through run's finally), so the next one takes it at once whatever
    # its TTL, and a lease still held would fail the acquire with LeaseHeld, not wait. The
    # TTL is one a loaded machine cannot overrun: the renewer wakes every TTL/3 on real
    # time, and a short lease lapses whenever it is starved that long, ending the run
    # "lost" in a test about resuming.
    resume_opts = Options(lease_ttl_s=60, poll_s=0.01, stats_wait_s=1)
    runs = 0
    while True:
        runs += 1
        try:
            final = Engine(rollouts(holder=f"c{runs}"), "r1", fleet, fleet, resume_opts).run()  # type: ignore[arg-type]
            break
        except Crash:
            fleet.dead = False
            fleet.crash_at = None  # one crash; the next controller finishes
    assert runs == (2 if crash_at <= fleet.effects else 1)
    assert final == "done"
    for name, h in fleet.hosts.items():
        if name == bad:
            assert (h.carves, h.uncarves, h.digest) == (1, 1, "")
            assert states(store)[name] == "rolled_back"
        else:
            assert (h.carves, h.uncarves) == (1, 0), name
            assert states(store)[name] == "verified"


def _run_until(store: Store, eng: Engine, cond, then_state: str) -> str:  # type: ignore[no-untyped-def]
    """Run the engine; when ``cond(states)`` holds, an operator sets ``then_state``."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        fut = ex.submit(eng.run)
        while not fut.done():
            if cond(states(store)):
                store.set_rollout("r1", then_state, "operator", fenced=False, expect="running")
                break
            time.sleep(0.01)
        return fut.result(timeout=60)


def test_pause_stops_at_a_step_boundary_and_resume_finishes(rollouts) -> None:  # type: ignore[no-untyped-def]
    fleet = FakeFleet(NAMES)
    store, eng = rollout(rollouts, fleet)
    got = _run_until(store, eng, lambda st: list(st.values()).count("verified") >= 2, "paused")
    assert got == "paused"
    mid = states(store)
    # stopped before the end (on a loaded machine the last wave may have started every
    # host before the pause was seen: none is still pending, but none goes further)
    assert set(mid.values()) != {"verified"}, mid
    store.set_rollout("r1", "running", "resumed", fenced=False, expect="paused")
    assert Engine(store, "r1", fleet, fleet, OPTS).run() == "done"  # type: ignore[arg-type]
    assert set(states(store).values()) == {"verified"}
    assert all(h.carves == 1 for h in fleet.hosts.values())


def test_abort_rolls_back_hosts_mid_change_and_keeps_converted_ones(rollouts) -> None:  # type: ignore[no-untyped-def]
    fleet = FakeFleet(NAMES)
    store, eng = rollout(rollouts, fleet)
    got = _run_until(store, eng, lambda st: "soaking" in st.values() and "verified" in st.values(), "aborting")
    assert got == "aborted"
    final = states(store)
    assert set(final.values()) <= {"verified", "rolled_back", "pending"}
    assert "rolled_back" in final.values() and "verified" in final.values()
    for n, st in final.items():
        assert bool(fleet.hosts[n].digest) == (st == "verified"), n


def test_a_host_converted_by_someone_else_after_the_plan_is_skipped(rollouts) -> None:  # type: ignore[no-untyped-def]
    """Kind convert: a host carved with another policy between the plan and its turn (by
    another rollout that finished with it) is not converted again."""
    fleet = FakeFleet(NAMES)
    store, eng = rollout(rollouts, fleet)
    other = policy_digest("[io_service]\ncpus = \"0-3\"\n")
    fleet.carve("h4:7443", "other", other, expected="", operation="rollout/b/h4/carve")
    assert eng.run() == "done"
    assert states(store)["h4"] == "skipped" and fleet.hosts["h4"].digest == other
    why = next(t for t in store.transitions("r1", "h4") if t["to"] == "skipped")["detail"]["reason"]
    assert why.startswith("converted since the plan: the host is carved with ") and "rollout/b/h4/carve" in why


def test_a_rollback_drains_no_host_another_rollout_carved_since(rollouts) -> None:  # type: ignore[no-untyped-def]
    """Rollout r1 (one operator) done, then r2 (another operator, another policy) done
    over the same hosts: rolling r1 back finds every carve r2's. Whose carve it is is
    read before any drain, so no host is drained (a drain would move its VMs away for
    nothing) and none is touched at all; each is reported with the carve it carries."""
    fleet = FakeFleet(NAMES)
    store, eng = rollout(rollouts, fleet)
    assert eng.run() == "done"
    other = rollouts(holder="c2")
    spec2 = parse_spec({**SPEC, "name": "r2", "kind": "policy", "policy_text": "[hugepages]\nio_floor_percent = 9\n"})
    other.create(spec2, make_plan([Host(n, f"{n}:7443", f"r{i % 3}") for i, n in enumerate(NAMES)], spec2))
    assert Engine(other, "r2", fleet, fleet, OPTS).run() == "done"  # type: ignore[arg-type]
    carved = {n: (h.digest, h.operation, h.carves, h.uncarves) for n, h in fleet.hosts.items()}
    assert {op for _, op, _, _ in carved.values()} == {f"rollout/r2/{n}/carve" for n in NAMES}
    changes = len(fleet.admin_log)
    store.set_rollout("r1", "rolling_back", "test", fenced=False, expect="done")
    assert Engine(store, "r1", fleet, fleet, OPTS).run() == "halted"  # type: ignore[arg-type]
    assert fleet.admin_log[changes:] == []  # no drain, no cordon, no uncordon: left alone
    assert {n: (h.digest, h.operation, h.carves, h.uncarves) for n, h in fleet.hosts.items()} == carved
    for n in NAMES:
        row = store.host("r1", n)
        assert row.state == "failed" and row.data["rollback_failed"].startswith("not rolled back: the host is carved "
                                                                               "with "), row.data
        assert f"(operation rollout/r2/{n}/carve), not this rollout's carve" in row.data["rollback_failed"]
        tried = [t for t in store.transitions("r1", n) if t["to"] == "rolling_back"]
        assert len(tried) == 1, tried  # tried once in the run, not again at once


def test_status_lists_hosts_skipped_at_plan_time_and_at_run_time(rollouts) -> None:  # type: ignore[no-untyped-def]
    """`status --json`: ``skipped`` holds every host left out, whether the plan left it
    out or it was skipped when its turn came (another owner's hold); the latter are under
    ``problems`` too, with their state."""
    fleet = FakeFleet(NAMES)
    fleet.admin["h5"], fleet.admin_owner["h5"] = "cordoned", "alice"
    store = rollouts()
    spec = parse_spec(SPEC)
    hosts = [Host(n, f"{n}:7443", f"r{i % 3}") for i, n in enumerate(NAMES + ["h9"])]
    store.create(spec, make_plan(hosts, spec, {"h9": "PlanCarve refused: no IO cores"}))
    assert Engine(store, "r1", fleet, fleet, OPTS).run() == "done"  # type: ignore[arg-type]
    st = status_dict(store, "r1")
    wave = store.host("r1", "h5").wave
    assert st["skipped"] == [{"host": "h9", "reason": "PlanCarve refused: no IO cores", "at": "plan"},
                             {"host": "h5", "reason": "the host is cordoned by alice", "at": "run", "wave": wave}]
    assert [(p["host"], p["state"], p["reason"]) for p in st["problems"]] == [
        ("h5", "skipped", "the host is cordoned by alice")]
    assert st["lease"] is None
    console = Console(record=True, width=300)
    render.render_status(st, console)
    text = console.export_text()
    header = next(ln for ln in text.splitlines() if "wave" in ln and "pending" in ln)
    assert all(str(x).replace("_", " ") in header for x in RolloutHostState), header  # draining too
    assert "1 hosts skipped at plan time" in text, text
