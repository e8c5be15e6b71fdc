"""Which silent hosts are marked down (scheduler/liveness_rule.py, pure): one by one, except
when a large share of a rack or of the fleet went silent at once. The replicas' shared
liveness rows' host sets, and when a replica's own lag forbids judging."""

from __future__ import annotations

import random

from scheduler.liveness_rule import Rules, decode_ids, encode_ids, judge, lag_reason, silent_allowance

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


def test_host_sets_round_trip_dense_sparse_and_empty() -> None:
    rng = random.Random(39)
    for ids in ([], [0], [7, 8, 9], list(range(1, 100_001)), sorted(rng.sample(range(1, 100_001), 300)),
                sorted(rng.sample(range(1, 100_001), 60_000)), [1, 2**31 - 1]):
        assert decode_ids(encode_ids(ids)) == ids


def test_a_host_set_takes_the_smaller_encoding_and_stays_small_at_fleet_scale() -> None:
    rng = random.Random(39)
    everyone = encode_ids(range(1, 100_001))  # a replica that heard the whole fleet
    half = encode_ids(rng.sample(range(1, 100_001), 50_000))  # one of two replicas
    few = encode_ids(rng.sample(range(1, 100_001), 100))
    assert everyone[:1] == b"B" and len(everyone) < 200
    assert half[:1] == b"B" and len(half) < 12_600  # about a bit per host: a bitmap's
    assert few[:1] == b"D" and len(few) < 250  # a bitmap of 100,000 would be 12.5 kB
    assert encode_ids([3, 1, 3]) == encode_ids([1, 3])


def test_a_lagging_replica_says_why_and_the_allowance_covers_a_period_twice() -> None:
    assert lag_reason(loop_lag_s=0.1, flush_late_s=0.3, bound_s=2) is None
    assert lag_reason(loop_lag_s=2.5, flush_late_s=0, bound_s=2) == "event loop 2.50 s late (bound 2 s)"
    assert lag_reason(loop_lag_s=0, flush_late_s=3, bound_s=2) == "heartbeat flush 3.00 s late (bound 2 s)"
    # the shipped timings: 10 s beats, 5 s periods, 1 s flushes, 25 s timeout
    assert 10 + silent_allowance(period_s=5, flush_s=1) < 25
