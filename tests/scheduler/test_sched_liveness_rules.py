"""Which silent hosts are marked down (scheduler/liveness_rule.py, pure): one by one, except
when a large share of a rack or of the fleet went silent at once. The replicas' shared
liveness rows' host sets, and when a replica's own lag forbids judging."""

from __future__ import annotations

import random

from scheduler.liveness_rule import (Rules, decode_ids, encode_ids, judge, lag_reason, missed_beat_after,
                                     silent_allowance)

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


def test_hosts_that_missed_a_beat_count_towards_an_event_but_are_never_marked() -> None:
    """A group silenced at once crosses the timeout over a beat interval: the check that
    would mark its first ones counts the rest (missed a beat, not past the timeout yet)."""
    past = {"r4-0": "r4", "r4-1": "r4"}  # 2 of 62: alone, marked
    assert judge(past, marked=set(), sizes=SIZES).mark == ["r4-0", "r4-1"]
    missed = {f"r4-{i}": "r4" for i in range(2, 13)} | {"r1-0": "r1"}  # with these, 14 of 62
    got = judge(past, marked=set(), sizes=SIZES, missed=missed)
    assert got.mark == [] and set(got.held) == set(past)  # the missed are not the check's to mark
    assert got.events == ["fleet: 14 of 62 hosts went silent at once (over 20%); not marked down one by one"]
    # a rack: 2 past and 4 missed of 10 is over half
    got = judge({"r1-0": "r1", "r1-1": "r1"}, marked=set(), sizes=SIZES,
                missed={f"r1-{i}": "r1" for i in range(2, 6)})
    assert got.mark == [] and got.events == [
        "rack r1: 6 of 10 hosts went silent at once (over 50%); not marked down one by one"]
    # no event where nothing would be marked: missed beats alone (the next check judges them)
    assert judge({}, marked=set(), sizes=SIZES, missed=missed) == judge({}, marked=set(), sizes=SIZES)
    assert judge({"r2-0": "r2"}, marked=set(), sizes=SIZES, missed={f"r1-{i}": "r1" for i in range(8)}).events == []
    # marked hosts count for neither
    assert judge(past, marked={f"r4-{i}" for i in range(2, 13)}, sizes=SIZES, missed=missed).mark == list(past)


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
    # the shipped timings: 10 s beats, 2 s periods, 1 s flushes, 22 s timeout; a host is
    # marked at most a period (a peer's row), the timeout and a check (2 s) after its last
    # beat: 26 s, under the 30 s asked
    from scheduler.config import LivenessConfig, PlacementConfig, StatsConfig
    p, lv, st = PlacementConfig(), LivenessConfig(), StatsConfig()
    assert (lv.beat_interval_s, p.heartbeat_period_s, st.heartbeat_flush_s, p.heartbeat_timeout_s) == (10, 2, 1, 22)
    assert missed_beat_after(interval_s=10, period_s=2, flush_s=1) == 10 + silent_allowance(period_s=2, flush_s=1) == 15
    assert 15 < 22 and 2 + 22 + lv.check_s <= 26


def test_the_lag_window_lasts_until_every_live_host_has_beaten_again() -> None:
    """With the shipped timings: a beat interval (10 s), the allowance for a peer's row
    (2 periods of 2 s and a 1 s flush), and a shed registration's retry (1 s and half
    again): 16.5 s, where a fixed 30 s held the checks after a restart at 100,000 hosts."""
    from scheduler.config import Settings
    from api.bounds import RETRY_AFTER_JITTER
    from scheduler.liveness_rule import lag_window
    cfg = Settings()
    missed = missed_beat_after(interval_s=cfg.liveness.beat_interval_s, period_s=cfg.placement.heartbeat_period_s,
                               flush_s=cfg.stats.heartbeat_flush_s)
    assert missed == 15.0
    assert lag_window(missed_beat_s=missed, retry_s=cfg.server.shed_retry_s, jitter=RETRY_AFTER_JITTER) == 16.5
