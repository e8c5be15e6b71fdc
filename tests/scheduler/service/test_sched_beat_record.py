"""A beat's record (``HostService._record``) under one lock, the pulse's: beats recorded
from many threads at once, while the pulse closes periods and the flusher swaps its maps
out, are all recorded: each in the period written or the one being collected, in the
pulse's last-heard times, in the beats kept for the flusher (this flush or the next),
and in the heartbeats counter (a plain int under that lock)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from scheduler.db.engine import Store
from scheduler.liveness_rule import decode_ids
from scheduler.metrics import Metrics
from scheduler.repo import pulse as pulse_repo
from scheduler.service.hostcache import HostCache
from scheduler.service.hosts import HostService
from scheduler.service.pulse import Pulse

THREADS, HOSTS, ROUNDS = 6, 500, 1  # one beat a host: a beat lost is a host in no period


@pytest.fixture
def fast_switches():  # type: ignore[no-untyped-def]
    """Threads switch as often as the interpreter lets them: a lost update shows."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def test_concurrent_beats_are_all_recorded(tmp_path: Path, monkeypatch, fast_switches) -> None:
    names = [f"h{t}-{i}" for t in range(THREADS) for i in range(HOSTS)]
    pulse = Pulse(replica="r1", period_s=0.0, keep_s=60.0)
    pulse._ids = {n: i for i, n in enumerate(names)}  # as read from the hosts' rows
    pulse._names = {i: n for n, i in pulse._ids.items()}
    periods: list[set[str]] = []
    monkeypatch.setattr(pulse_repo, "write_period", lambda *, session, replica, start, end, hosts, lag=None:
                        periods.append({pulse._names[i] for i in decode_ids(hosts)}))
    monkeypatch.setattr(pulse_repo, "expire_periods", lambda *, session, before: 0)
    def beat_held(name: str, now: float) -> float | None:
        """``Pulse.beat_held``, with the thread switch the interpreter may make between
        reading the period's set and adding to it made every time (a sleep): a period
        closed meanwhile by a thread that does not wait for the record's lock loses it."""
        period = pulse._period
        time.sleep(0.0002)
        prev = pulse._last(name)
        pulse.flowing_since = pulse.flowing_since or now
        pulse._own[name] = now
        period.add(name)
        return prev
    monkeypatch.setattr(pulse, "beat_held", beat_held)
    cache = HostCache(heartbeat_timeout_s=60.0, pulse=pulse)
    metrics = Metrics()
    svc = HostService(store=Store.from_url(f"sqlite:///{tmp_path}/unused.db"), cache=cache, heartbeat_timeout_s=60.0,
                      heartbeat_flush_s=3600.0, metrics=metrics)
    svc._start_flusher = lambda: None  # type: ignore[method-assign]  # the test swaps the beats out itself
    kept: dict[str, int] = {}
    done = threading.Event()

    def beat(t: int) -> None:
        for _ in range(ROUNDS):
            for i in range(HOSTS):
                svc._record(f"h{t}-{i}", time.time(), None)

    def close_periods() -> None:  # what the flusher does once a period and once a flush
        while not done.is_set():
            pulse.write(None, time.time(), force=True)  # type: ignore[arg-type]
            with svc._beats_lock:
                beats, svc._beats = svc._beats, {}
            for n in beats:
                kept[n] = kept.get(n, 0) + 1
    closer = threading.Thread(target=close_periods)
    closer.start()
    threads = [threading.Thread(target=beat, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    done.set()
    closer.join()
    heard = set().union(*periods) | pulse._period
    assert heard == set(names), f"{len(set(names) - heard)} hosts in no period"
    assert set(kept) | set(svc._beats) == set(names)
    assert all(pulse.last(n) is not None for n in names)
    assert set(svc._last_beat) == set(names)
    assert metrics.heartbeats.value == THREADS * HOSTS * ROUNDS
    assert len(periods) > 1, "the periods were closed while the beats came"
