"""``Lag.loop_late_within``, the shedding's signal, asked on every heartbeat and claim: it
keeps its last answer until a sample comes or the oldest sample inside the window leaves
it, and answers as the plain maximum over the window would at every step."""

from __future__ import annotations

from scheduler.service.liveness import Lag


class Tick:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def plain(samples: list[tuple[float, float]], now: float, within: float) -> float:
    return max((x for t, x in samples if t >= now - within), default=0.0)


def test_the_kept_answer_is_the_windows_maximum_at_every_step() -> None:
    clock = Tick()
    lag = Lag(window_s=30.0, monotonic=clock)
    seen: list[tuple[float, float]] = []
    assert lag.loop_late_within(5.0) == 0.0  # nothing yet; kept until a sample comes
    steps = [(0.5, 0.0), (0.5, 0.7), (0.5, 0.1), (2.0, None), (3.0, None), (0.1, 0.2), (4.9, None),
             (0.2, None), (0.5, 1.5), (5.0, None), (0.01, None), (7.0, None)]
    for dt, late in steps:
        clock.t += dt
        if late is not None:
            lag.loop_late(late)
            seen.append((clock.t, late))
        for _ in range(3):  # asked again and again between samples, as the requests do
            assert lag.loop_late_within(5.0) == plain(seen, clock.t, 5.0), (clock.t, seen)
    # another window asked of the same Lag is answered for that window
    assert lag.loop_late_within(30.0) == plain(seen, clock.t, 30.0)
    assert lag.loop_late_within(5.0) == plain(seen, clock.t, 5.0)


def test_a_late_sample_is_seen_at_once() -> None:
    clock = Tick()
    lag = Lag(window_s=30.0, monotonic=clock)
    lag.loop_late(0.0)
    assert lag.loop_late_within(5.0) == 0.0
    clock.t += 0.5
    lag.loop_late(2.5)
    assert lag.loop_late_within(5.0) == 2.5
    clock.t += 5.0  # the late sample is exactly at the window's edge: still inside
    assert lag.loop_late_within(5.0) == 2.5
    clock.t += 0.01
    assert lag.loop_late_within(5.0) == 0.0
