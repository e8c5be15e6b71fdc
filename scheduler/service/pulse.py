"""The fleet's liveness shared between replicas without a write per beat.

Each replica keeps, in memory, the time of the last beat it answered for each host
(``beat``). Once per ``period_s`` it writes ONE row (``repo.pulse.write_period``) naming
the hosts it heard from in that period, as a compressed set over their ``beat_id``
(``liveness_rule.encode_ids``: a few kB for 100,000 hosts), and reads the rows the other
replicas wrote since its last read. So the database's cost is one row per replica and
period whatever the beat rate, and every replica knows within about two periods what
every other heard.

``last(name)``: when ``name`` was last heard by any replica as this one knows it: its
own last beat, or the end of the newest peer period naming it (at most one period
after the beat, known here once the row is read). ``hosts.last_heartbeat`` is only a
floor under this (written at registration, when a host comes back from down, and on the slow ``heartbeat_write_s``
cadence): every judgement of "down" takes the newer of the two (``seen``).

A replica that dies loses the beats of its unwritten period; the hosts that beat to it
beat to another replica within one beat interval, and ``liveness_rule.silent_allowance``
bounds how stale a live host can look (the heartbeat timeout must exceed a beat
interval plus that). Rows are deleted ``keep_s`` after their period ended (a dead replica's too).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy.orm import Session

from scheduler.liveness_rule import decode_ids, encode_ids
from scheduler.repo import pulse as pulse_repo

log = logging.getLogger(__name__)


class Pulse:
    def __init__(self, *, replica: str, period_s: float, keep_s: float, clock: Callable[[], float] = time.time):
        self.replica = replica
        self.period_s = period_s
        self.keep_s = keep_s
        self.clock = clock
        # ``lock``: what a beat's record holds; the heartbeat service holds it for its own
        # maps too (``HostService._record``: one lock a beat, ``beat_held``)
        self.lock = threading.Lock()
        self._own: dict[str, float] = {}  # host -> the last beat this replica answered
        self._period: set[str] = set()  # heard in the period being collected
        self._start = clock()
        self._peers: dict[int, float] = {}  # beat_id -> the newest peer period end naming it
        self._decoded: set[tuple[str, float]] = set()  # (replica, period_start) of the rows applied
        self._ids: dict[str, int] = {}
        self._names: dict[int, str] = {}
        self._read_to = float("-inf")  # newest period end read
        self.read_at: float | None = None  # when the rows were last read (None: never)
        self.created = clock()
        # When beats first reached this replica after it started: its first own beat, or the
        # first peer period begun since (None: not yet). The liveness grace counts from here.
        self.flowing_since: float | None = None
        # this replica's first own beat: its rows claim hearing from here on, not from its
        # creation (a replica starting, its index's first pass under way, hears nothing)
        self._first_heard: float | None = None
        self.rows_written = 0
        # the periods of the rows read (every replica's, this one's too): where they join
        # up without a gap, some replica was hearing the fleet (``heard_since``)
        self._covered: list[tuple[float, float]] = []
        # why this replica cannot vouch for a period now (its ``Lag.reason``): written in its
        # row, so its peers hold their checks too; set by the app
        self.lag_reason: Callable[[], str | None] = lambda: None
        self._peer_lag: dict[str, tuple[float, str | None]] = {}  # replica -> (its newest row's end, lag)

    def beat(self, name: str, now: float) -> float | None:
        """Record a beat; returns when the host was last heard before it (None: unknown)."""
        with self.lock:
            return self.beat_held(name, now)

    def beat_held(self, name: str, now: float) -> float | None:
        """``beat`` by a caller that holds ``lock``."""
        prev = self._last(name)
        if self.flowing_since is None:
            self.flowing_since = now
        if self._first_heard is None:
            self._first_heard = now
        self._own[name] = now
        self._period.add(name)
        return prev

    def last(self, name: str) -> float | None:
        with self.lock:
            return self._last(name)

    def _last(self, name: str) -> float | None:
        own = self._own.get(name)
        i = self._ids.get(name)
        peer = self._peers.get(i) if i is not None else None
        if own is None:
            return peer
        return own if peer is None or own >= peer else peer

    def seen(self, name: str, recorded: float) -> float:
        """The newer of a host's recorded ``last_heartbeat`` and what the pulse knows."""
        got = self.last(name)
        return recorded if got is None or got < recorded else got

    def seen_all(self, recorded: dict[str, float]) -> dict[str, float]:
        """``seen`` of many hosts (name -> its recorded ``last_heartbeat``): a liveness pass
        over the fleet from memory. The maps are copied under the lock and walked outside
        it: the lock is every beat's (``beat_held``), and a walk of 100,000 hosts under it
        (~40 ms) was the beats' p99."""
        with self.lock:
            own, ids, peers = dict(self._own), self._ids, dict(self._peers)  # ids: replaced, never changed
        out: dict[str, float] = {}
        for name, rec in recorded.items():
            t = own.get(name)
            best = rec if t is None or t < rec else t
            i = ids.get(name)
            if i is not None:
                p = peers.get(i)
                if p is not None and p > best:
                    best = p
            out[name] = best
        return out

    def forget(self, name: str) -> None:
        with self.lock:
            self._own.pop(name, None)

    def due(self, now: float) -> bool:
        return now - self._start >= self.period_s

    def write(self, session: Session, now: float, *, force: bool = False) -> bool:
        """In the caller's write transaction: this replica's row for the period now over
        (nothing while it is not over, or when nothing was heard), then the expired rows.
        Hosts without a ``beat_id`` yet (registered on another replica a moment ago) are
        looked up first. ``force``: the period so far, over or not (a replica stopping)."""
        if not force and not self.due(now):
            return False
        with self.lock:
            heard, self._period = self._period, set()
            start, self._start = self._start, now
            first = self._first_heard
        if not heard:
            return False
        if first is not None and first > start:  # its first period: heard from its first beat
            start = first
        if any(n not in self._ids for n in heard):
            self._load_ids(session)
        ids = [self._ids[n] for n in heard if n in self._ids]
        pulse_repo.write_period(session=session, replica=self.replica, start=start, end=now, hosts=encode_ids(ids),
                                lag=self.lag_reason())
        pulse_repo.expire_periods(session=session, before=now - self.keep_s)
        self.rows_written += 1
        return True

    def read(self, session: Session) -> int:
        """The other replicas' rows since the last read (overlapping it by two periods: a
        row committed late with an older end is not missed); how many rows."""
        now = self.clock()
        rows = pulse_repo.periods_since(session=session, after=max(self._read_to - 2 * self.period_s,
                                                                  now - self.keep_s))
        peers = [r for r in rows if r.replica != self.replica and (r.replica, r.period_start) not in self._decoded]
        if peers:
            decoded = [(r.period_end, decode_ids(r.hosts)) for r in peers]
            fresh = [r.period_start for r in peers if r.period_start >= self.created]
            if fresh and self.flowing_since is None:
                self.flowing_since = min(fresh)
            if any(i not in self._names for _, ids in decoded for i in ids):
                self._load_ids(session)
            with self.lock:
                got = self._peers
                for end, ids in decoded:
                    for i in ids:
                        if got.get(i, float("-inf")) < end:
                            got[i] = end
            self._decoded = {k for k in self._decoded if k[1] > now - self.keep_s - self.period_s} \
                | {(r.replica, r.period_start) for r in peers}
        if rows:
            self._read_to = max(self._read_to, rows[-1].period_end)
            with self.lock:
                self._covered = sorted({x for x in self._covered if x[1] > now - self.keep_s - self.period_s}
                                       | {(r.period_start, r.period_end) for r in rows})
                for r in rows:
                    if r.replica != self.replica and r.period_end >= self._peer_lag.get(r.replica, (-1.0, None))[0]:
                        self._peer_lag[r.replica] = (r.period_end, r.lag)
                for k in [k for k, (end, _) in self._peer_lag.items() if end < now - self.keep_s]:
                    del self._peer_lag[k]
        self.read_at = now
        return len(peers)

    def peer_lag(self, now: float, *, within_s: float) -> str | None:
        """Why a peer could not vouch for its newest row, if that row ended within the
        last ``within_s`` (the lag window): a host whose beats sit unread at a lagging
        peer is missing from its rows, so this replica must not judge it silent either.
        A peer that stops writing while it lags (stuck, or dead) is held for that long."""
        with self.lock:
            lagging = [(end, replica, why) for replica, (end, why) in self._peer_lag.items()
                       if why is not None and end >= now - within_s]
        if not lagging:
            return None
        _, replica, why = max(lagging)
        return f"replica {replica} lags ({why})"

    def heard_since(self, now: float, *, late_s: float) -> float | None:
        """Since when the rows read show the fleet heard without a gap up to now (None: they
        do not reach now). Each replica's rows follow each other (a row starts where its
        last period ended) unless it heard nothing in a period or stopped, so where the
        rows' periods join up some replica was answering beats all along; the newest may
        end up to ``late_s`` ago (written at its period's end, read at the next check).
        A replica restarted while its peers heard the fleet has lost nothing but its own
        unwritten period, which ``liveness_rule.silent_allowance`` covers already, so it
        can judge from the rows it read; after an outage of every replica (a gap) the
        grace counts again (``LivenessWatch``). Gaps under half a period are clock skew
        between replicas' machines."""
        with self.lock:
            covered = list(self._covered)
        if not covered:
            return None
        tol = self.period_s / 2
        start, end = covered[0]
        for s, e in covered[1:]:
            if s > end + tol:  # a gap: nobody wrote a period covering it
                start = s
            end = max(end, e)
        return start if end >= now - late_s else None

    def _load_ids(self, session: Session) -> None:
        ids = pulse_repo.beat_ids(session=session)
        with self.lock:
            self._ids = ids
            self._names = {i: n for n, i in ids.items()}
