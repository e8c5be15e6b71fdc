"""How the tools stop: SIGINT (Ctrl-C) and SIGTERM alike, the summary printed and tracing
state removed either way.

Both signals are caught even when they were ignored at start, as perf and bpftrace do: a
non-interactive shell starts a background job (`kvm-utils exits &`, `make test &`) with
SIGINT ignored, Python then leaves it ignored, and `kill -INT` would do nothing.

A stop signal raises KeyboardInterrupt (SIGTERM: its subclass Terminated) in the main
thread, which the loops catch where they wait (sleep, select, a child's output). Two
things keep it from landing where it would lose counts: statements that take counts and
add them up run `deferred()` (the signals are blocked, not lost, and arrive right after),
and a loop that handles every event (record) takes the signal as a request it polls
(`stop_requests`) instead. Threads the tools start call `block_in_this_thread()`, so the
signals always reach the main thread and `deferred()` holds for the whole process.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C so summaries print and tracing state is cleaned up."""


def _interrupt(signum, frame):
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


@contextmanager
def _handlers(handler) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():   # only the main thread may set them
        yield
        return
    old = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextmanager
def stop_signals_interrupt() -> Iterator[None]:
    """SIGINT and SIGTERM raise KeyboardInterrupt (SIGTERM: Terminated) in the main thread."""
    with _handlers(_interrupt):
        yield


@contextmanager
def stop_requests(on_stop: Callable[[], None]) -> Iterator[None]:
    """SIGINT and SIGTERM call `on_stop()` (which only records the request) instead of
    raising: the caller polls it, finishes the event in hand and drains what is buffered."""
    with _handlers(lambda signum, frame: on_stop()):
        yield


@contextmanager
def deferred() -> Iterator[None]:
    """A stop signal that arrives inside waits (blocked, pending) until the block ends."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def block_in_this_thread() -> None:
    """For a thread the tools start: stop signals go to the main thread, never here."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
