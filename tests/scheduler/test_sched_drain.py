"""The drain planner (scheduler/drain_plan.py), pure: what a drain may do to each VM now,
under the VMs' on_maintenance and their groups' disruption budgets. A simulated drain
applies the steps one at a time, as the scheduler's loop does, until nothing moves, and
checks the budget at every step. The scheduler's drain loop (scheduler/service/drains.py)
acts on these steps; tests/scheduler/test_sched_drain_loop.py drives it against real
hostd servers."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from scheduler.drain_plan import NOT_MOVED, DrainVm, Step, budget_problem, plan


def vm(i: int, *, group: str = "web", on: str = "replace", budget: int = 1, host: str = "h1",
       status: str = "running") -> DrainVm:
    return DrainVm(f"v{i}", f"web-{i}", host, status, on, group, budget)


def actions(steps: list[Step]) -> dict[str, str]:
    return {s.name: s.action for s in steps}


def test_a_budget_of_one_moves_one_vm_at_a_time_and_says_what_the_others_wait_for() -> None:
    vms = [vm(1), vm(2), vm(3), vm(9, host="h2")]  # web-9 serves elsewhere
    steps = plan({"h1"}, vms)
    assert actions(steps) == {"web-1": "replace", "web-2": "wait", "web-3": "wait"}
    assert steps[1].why == "group web: 1 of its VMs unavailable, max_unavailable = 1"
    new = DrainVm("n1", "web-1", "h3", "creating", "replace", "web", 1, replaces="v1")
    steps = plan({"h1"}, [*vms, new])
    assert actions(steps) == {"web-1": "wait", "web-2": "wait", "web-3": "wait"}
    assert steps[0].why == "its replacement n1 is creating on h3"
    steps = plan({"h1"}, [*vms, replace(new, status="running")])
    assert actions(steps) == {"web-1": "delete_old", "web-2": "wait", "web-3": "wait"}
    # the old one deleted, its replacement a member like any other: the next one moves
    assert actions(plan({"h1"}, [*vms[1:], replace(new, status="running", replaces="")])) == {
        "web-2": "replace", "web-3": "wait"}


def test_a_member_down_elsewhere_uses_the_budget() -> None:
    vms = [vm(1), vm(9, host="h2", status="stopped")]
    assert plan({"h1"}, vms)[0].why == "group web: 1 of its VMs unavailable, max_unavailable = 1"
    assert actions(plan({"h1"}, [vm(1, budget=2), vm(9, host="h2", status="stopped", budget=2)])) == {"web-1": "replace"}


def test_what_holds_nothing_is_done_and_what_is_being_created_waits() -> None:
    vms = [vm(1, status="failed"), vm(2, status="stopped"), vm(3, status="creating"), vm(4, on="block", status="pending")]
    steps = {s.name: s for s in plan({"h1"}, vms)}
    assert {n: s.action for n, s in steps.items()} == {"web-1": "done", "web-2": "done", "web-3": "wait", "web-4": "wait"}
    assert steps["web-3"].why == "it is creating: the drain moves it once it runs"
    assert steps["web-4"].why.startswith("on_maintenance = block")


def test_a_stop_under_way_goes_on_and_holds_its_budget() -> None:
    """A VM marked ``deleting`` is a drain's stop that has not finished (a scheduler
    restarted in the middle): it is stopped again, and it keeps the group's budget."""
    steps = plan({"h1"}, [vm(1, on="stop", status="deleting"), vm(2, on="stop")])
    assert [(s.name, s.action, s.why) for s in steps] == [
        ("web-1", "stop", "being stopped for the drain"),
        ("web-2", "wait", "group web: 1 of its VMs unavailable, max_unavailable = 1")]


def test_block_and_stop_and_no_group() -> None:
    vms = [vm(1, on="block", group=""), vm(2, on="stop", group=""), vm(3, group=""), vm(4, group="",
                                                                                        status="stopped", on="stop")]
    steps = {s.name: s for s in plan({"h1"}, vms)}
    assert steps["web-1"].action == "wait" and steps["web-1"].why == "on_maintenance = block: its owner moves or deletes it"
    assert steps["web-2"].action == "stop" and steps["web-3"].action == "replace"
    assert steps["web-4"].action == "done"


def test_a_failed_replacement_is_deleted_and_made_again_keeping_the_budget() -> None:
    new = DrainVm("n1", "web-1", None, "failed", "replace", "web", 1, replaces="v1",
                  reason="h2: CreateVM on localhost:1: failed to connect")
    steps = plan({"h1"}, [vm(1), vm(2), new])
    assert [(s.name, s.action) for s in steps] == [("web-1", "retry"), ("web-2", "wait")]
    assert steps[0].why == "its replacement n1 failed (h2: CreateVM on localhost:1: failed to connect): deleted, " \
                           "and replaced again"
    # deleted: the next round replaces it again
    assert actions(plan({"h1"}, [vm(1), vm(2)])) == {"web-1": "replace", "web-2": "wait"}


def test_a_live_move_holds_its_group_budget_until_the_vm_runs_on_its_target() -> None:
    """Under a budget of one, one ``migrate`` VM moves at a time: the one moving counts as
    unavailable (its ``moving_to`` set) until its record runs on the target."""
    vms = [vm(1, on="migrate"), vm(2, on="migrate"), vm(3, on="migrate"), vm(9, host="h2", on="migrate")]
    steps = plan({"h1"}, vms)
    assert [(s.name, s.action) for s in steps] == [("web-1", "migrate"), ("web-2", "wait"), ("web-3", "wait")]
    assert steps[0].why == "on_maintenance = migrate"
    assert steps[1].why == "group web: 1 of its VMs unavailable, max_unavailable = 1"
    moving = [replace(vms[0], moving_to="h3"), *vms[1:]]
    steps = plan({"h1"}, moving)
    assert [(s.name, s.action, s.why) for s in steps] == [
        ("web-1", "wait", "moving live to h3"),
        ("web-2", "wait", "group web: 1 of its VMs unavailable, max_unavailable = 1"),
        ("web-3", "wait", "group web: 1 of its VMs unavailable, max_unavailable = 1")]
    # it runs on h3 now (the record moved): a member like any other, the next one moves
    arrived = [replace(vms[0], host="h3"), *vms[1:]]
    assert actions(plan({"h1"}, arrived)) == {"web-2": "migrate", "web-3": "wait"}
    # a move of a group member elsewhere (by hand) holds the budget too
    assert actions(plan({"h1"}, [*vms[:3], replace(vms[3], moving_to="h4")])) == {
        "web-1": "wait", "web-2": "wait", "web-3": "wait"}
    # a budget of two: two at once
    two = [replace(v, max_unavailable=2) for v in vms]
    assert actions(plan({"h1"}, two)) == {"web-1": "migrate", "web-2": "migrate", "web-3": "wait"}


def test_a_budget_of_zero_never_moves_live() -> None:
    vms = [vm(1, on="migrate", budget=0), vm(2, on="migrate", budget=0)]
    for _ in range(3):  # round after round
        steps = plan({"h1"}, vms)
        assert [(s.action, s.why) for s in steps] == [
            ("wait", "group web: 0 of its VMs unavailable, max_unavailable = 0")] * 2
    assert budget_problem(vms[0], vms) == "group web: 0 of its VMs unavailable, max_unavailable = 0"


def test_a_failed_move_is_shown_and_tried_again() -> None:
    failed = vm(1, on="migrate", group="")
    failed = replace(failed, reason=f"{NOT_MOVED}: to h2 (tried 2026-11-29T01:00:00Z): hyb.migration.failed ...")
    [s] = plan({"h1"}, [failed])
    assert s.action == "migrate" and s.why == f"on_maintenance = migrate; {failed.reason}"


def test_the_budget_rule_for_a_move_by_hand() -> None:
    vms = [vm(1, on="block", host="h2"), vm(2, on="block", host="h3")]
    assert budget_problem(vms[0], vms) == ""  # the VM itself is not counted against itself
    assert budget_problem(vms[0], [vms[0], replace(vms[1], moving_to="h4")]) == \
        "group web: 1 of its VMs unavailable, max_unavailable = 1"
    assert budget_problem(vms[0], [vms[0], replace(vms[1], status="stopped")]).startswith("group web: 1 of")
    assert budget_problem(replace(vms[0], group=""), vms) == ""


@pytest.mark.parametrize("seed", range(20))
def test_a_simulated_drain_never_exceeds_the_budget_and_finishes(seed: int) -> None:
    rnd = random.Random(seed)
    budgets = {"a": 1, "b": 2, "c": 0}
    fleet = [DrainVm(f"v{i}", f"vm-{i}", rnd.choice(["h1", "h1", "h2"]), "running",
                     rnd.choice(["replace", "stop", "migrate"]), g, budgets[g])
             for i, g in enumerate(rnd.choice("aabbc") for _ in range(12))]
    n = len(fleet)
    for _ in range(200):
        steps = [s for s in plan({"h1"}, fleet) if s.action not in ("wait", "done")]
        starting = [k for k, v in enumerate(fleet) if (v.replaces and v.status == "creating") or v.moving_to]
        if not steps and not starting:
            break
        if not steps:
            k = rnd.choice(starting)
            fleet[k] = arrive(fleet[k])
            continue
        s = rnd.choice(steps)  # the loop acts on one step at a time, in any order
        i = next(k for k, v in enumerate(fleet) if v.id == s.vm)
        if s.action == "replace":
            fleet.append(DrainVm(f"n{n}", fleet[i].name, "h3", "creating", "replace", fleet[i].group,
                                 fleet[i].max_unavailable, replaces=fleet[i].id))
            n += 1
        elif s.action == "stop":
            fleet[i] = replace(fleet[i], status="stopped")
        elif s.action == "migrate":  # runs on h1 until it runs on h3
            fleet[i] = replace(fleet[i], moving_to="h3")
        elif s.action == "delete_old":  # the old one goes; its replacement is a member like any other
            j = next(k for k, v in enumerate(fleet) if v.replaces == fleet[i].id)
            fleet[j] = replace(fleet[j], replaces="")
            del fleet[i]
        # replacements come up and moves arrive one by one, at random
        starting = [k for k, v in enumerate(fleet) if (v.replaces and v.status == "creating") or v.moving_to]
        if starting and rnd.random() < 0.5:
            k = rnd.choice(starting)
            fleet[k] = arrive(fleet[k])
        for g, cap in budgets.items():
            moving = {v.replaces for v in fleet if v.replaces and v.status != "running"}
            down = sum(1 for v in fleet if v.group == g and not v.replaces
                       and (v.status != "running" or v.id in moving or v.moving_to))
            assert down <= cap, (g, down, cap)
    # what is left waits on a full budget (members stopped for the maintenance hold it)
    for step in plan({"h1"}, fleet):
        assert step.action == "done" or step.action == "wait" and "max_unavailable" in step.why, step


def arrive(v: DrainVm) -> DrainVm:
    """A replacement runs, or a live move ends with the VM running on its target."""
    if v.moving_to:
        return replace(v, host=v.moving_to, moving_to="")
    return replace(v, status="running")
