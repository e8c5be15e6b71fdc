"""Which silent hosts are marked down (scheduler/liveness_rule.py, pure): one by one, except
when a large share of a rack or of the fleet went silent at once."""

from __future__ import annotations

from scheduler.liveness_rule import Rules, judge

SIZES = {"r1": 10, "r2": 10, "r3": 2, "r4": 40}


def test_a_few_silent_hosts_are_marked_each_once() -> None:
    got = judge({"a": "r1", "b": "r2", "c": "r2"}, marked={"a"}, sizes=SIZES)
    assert got.mark == ["b", "c"] and got.held == {} and got.events == []


def test_most_of_a_rack_at_once_is_one_event_and_marks_nobody_there() -> None:
    silent = {f"r1-{i}": "r1" for i in range(6)} | {"r2-0": "r2"}
    got = judge(silent, marked=set(), sizes=SIZES)
    assert got.mark == ["r2-0"]
    assert got.events == ["rack r1: 6 of 10 hosts went silent at once (over 50%); not marked down one by one"]
    assert set(got.held) == {f"r1-{i}" for i in range(6)}


def test_a_small_rack_never_makes_an_event() -> None:
    assert judge({"x": "r3", "y": "r3"}, marked=set(), sizes=SIZES).mark == ["x", "y"]


def test_a_fifth_of_the_fleet_at_once_is_a_fleet_event() -> None:
    silent = ({f"r1-{i}": "r1" for i in range(3)} | {f"r2-{i}": "r2" for i in range(3)}
              | {f"r4-{i}": "r4" for i in range(8)})  # 14 of 62, no rack over half
    got = judge(silent, marked=set(), sizes=SIZES)
    assert got.mark == [] and len(got.held) == 14
    assert got.events == ["fleet: 14 of 62 hosts went silent at once (over 20%); not marked down one by one"]


def test_hosts_marked_before_do_not_count_towards_an_event() -> None:
    silent = {f"r1-{i}": "r1" for i in range(6)}
    got = judge(silent, marked={f"r1-{i}" for i in range(5)}, sizes=SIZES)  # one new of ten
    assert got.mark == ["r1-5"] and got.events == []


def test_the_shares_are_configurable() -> None:
    silent = {f"r1-{i}": "r1" for i in range(3)}
    assert judge(silent, marked=set(), sizes=SIZES, rules=Rules(rack_share=0.25, fleet_share=0.9)).mark == []
