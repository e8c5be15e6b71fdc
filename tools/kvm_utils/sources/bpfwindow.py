"""The start and the end of a bpftrace program's window, for every engine's program.

bpftrace's ``interval:ms:N`` probe is a perf cpu-clock event on one CPU, and a 14 s
window ended at 28.004 s under a full test suite: exactly twice, as the event
time-shared with another perf user on that CPU would make it. A rate over such a window
is half the real one. So the window is read from ``nsecs`` (the monotonic clock) at a
short tick, and ends at the first tick past it: at most a tick late, a few ticks when the
tick itself is slowed.
"""

from __future__ import annotations

TICK_MS = 100
READY = "kvm-utils-ready"  # the line every program prints once counting has started
T0 = "@kvmu_t0"  # the program's start, set in its BEGIN
CLEAR = f"clear({T0});"  # for END: bpftrace prints every map left at exit


def begin() -> str:
    """The program's BEGIN (which fires once every probe is attached): its start time,
    then the ``READY`` line callers wait for."""
    return f'BEGIN {{ {T0} = nsecs; printf("{READY}\\n"); }}'


def stop(duration: float | None, before_exit: str = "") -> list[str]:
    """The probe that ends the program ``duration`` seconds after its BEGIN (none
    without a duration: it runs until Ctrl-C), running ``before_exit`` first."""
    if duration is None:
        return []
    ns = max(1, int(duration * 1e9))
    return [f"interval:ms:{TICK_MS} {{ if (nsecs - {T0} >= {ns}) {{ {before_exit}exit(); }} }}"]
