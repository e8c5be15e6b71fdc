"""Marks silent hosts down, once, in every replica's background (``[liveness]``).

Every ``check_s``: the hosts silent for longer than ``placement.heartbeat_timeout_s``
(an indexed query: the silent hosts, not the fleet) and the rack sizes are read, and
``scheduler.liveness_rule.judge`` says which to mark. Marking is a conditional update (not
marked yet, and still the same last beat), so with several replicas a host is marked
once; it is audited (``host.down``, with how many VMs were flagged) and its running VMs
get the reason "host <name> silent since <time>: marked down". A beat or registration
clears both (``repo.hosts.back_up``). An event (a rack or the fleet newly silent at
once, counting the hosts that missed a beat and are not past the timeout yet: a group
silenced at once crosses the timeout over a beat interval) is logged and audited once
while it lasts, and its hosts are left unmarked.

No false alarms after a restart: nothing is marked until ``grace_s`` after this
replica started (hosts whose beats went to a scheduler that was down or paused beat
again meanwhile; their liveness is in the database); with the shared liveness, until
``grace_s`` after beats began to reach the replicas again since it started (its first
beat, or a peer's first period since: ``Pulse.flowing_since``). A replica's start
(migrations, the index's first pass: a minute at 100,000 hosts) does not eat into the
time the fleet has to beat again (a host's first beat since may sit in another
replica's unwritten period for up to one period: the grace counts from the beats).
Where the shared rows show the fleet heard without a gap up to now (``Pulse.
heard_since``: a replica restarted while its peers answered the beats), the grace counts
from the start of that stretch: the restart hid nothing, and the replica judges from its
first read of the rows instead of a timeout later.

A host's last beat is the newer of its row's ``last_heartbeat`` and the replicas' shared
liveness (``service.pulse``, read at each check). No false alarms from this replica's own
lag: a replica behind on its own work (its event loop late to run a timer, its
shared row late: CPU starved or stolen, a slow database) may have left beats unanswered or
unshared, so while its lag (``lag``) exceeds ``lag_bound_s`` it marks nothing, logs why
and ``/readyz`` answers 503 with the reason. Nor from a peer's: a replica's shared row
says why it lagged (``host_beats.lag``), and while a peer's newest row says so, within
the lag window, this replica marks nothing either (the peer's unread beats are missing
from its rows).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from scheduler.config import LivenessConfig
from scheduler.db.engine import Store
from scheduler.liveness_rule import Judgement, Rules, Survey, judge, lag_reason
from scheduler.repo import audit as audit_repo
from scheduler.repo import hosts as host_repo
from scheduler.service.hostcache import HostCache
from scheduler.service.pulse import Pulse

log = logging.getLogger(__name__)


class Lag:
    """How far behind this replica is on its own work: the event loop's lateness (a
    periodic asyncio timer, ``watch_loop``) and its shared row's (``flush_late``: how
    late the flusher wrote it, past a period and a flush), each the worst seen over the
    last ``window_s``."""

    def __init__(self, *, window_s: float = 30.0, monotonic: Callable[[], float] = time.monotonic):
        self.window_s = window_s
        self.monotonic = monotonic
        self._loop: list[tuple[float, float]] = []  # (when, how late)
        self._flush: list[tuple[float, float]] = []
        self._shed: dict[int, int] = {}  # whole monotonic second -> requests turned away (``service.shed``)
        self._shed_silencing: dict[int, int] = {}  # the same, of those whose host may look silent for it
        self._lock = threading.Lock()
        # loop_late_within's last answer: (within_s, worst, good until): every request the
        # shedding checks asks it, and it changes only when a sample comes (every 0.5 s)
        # or the oldest sample it saw leaves the window
        self._within: tuple[float, float, float] | None = None

    def _note(self, into: list[tuple[float, float]], late: float) -> None:
        now = self.monotonic()
        with self._lock:
            into.append((now, late))
            while into and into[0][0] < now - self.window_s:
                into.pop(0)
            if into is self._loop:
                self._within = None

    def loop_late(self, late: float) -> None:
        self._note(self._loop, late)

    def flush_late(self, late: float) -> None:
        self._note(self._flush, late)

    def shed(self, *, silences: bool) -> None:
        """A request turned away for overload. ``silences``: its host may look silent for
        it (a registration: the host does not beat until it is registered), so no host is
        judged for the window after. A shed beat does not: it is counted as a served
        beat's, and its Retry-After lands the host's next beat before the timeout."""
        sec = int(self.monotonic())
        with self._lock:
            for into in (self._shed, self._shed_silencing) if silences else (self._shed,):
                into[sec] = into.get(sec, 0) + 1
                if len(into) > 2 * self.window_s + 2:
                    for k in [k for k in into if k < sec - self.window_s - 1]:
                        del into[k]

    def shed_lately(self, *, silencing: bool = False) -> int:
        """Requests turned away within the window (``silencing``: only those that may
        leave a live host looking silent)."""
        now = self.monotonic()
        with self._lock:
            got = self._shed_silencing if silencing else self._shed
            return sum(n for k, n in got.items() if k + 1 >= now - self.window_s)

    def loop_late_within(self, within_s: float) -> float:
        """The event loop's worst lateness over the last ``within_s`` (the shedding's signal)."""
        now = self.monotonic()
        got = self._within
        if got is not None and got[0] == within_s and now <= got[2]:
            return got[1]
        with self._lock:
            inside = [(t, x) for t, x in self._loop if t >= now - within_s]
            worst = max((x for _, x in inside), default=0.0)
            # the same answer until the oldest sample inside leaves the window (a new
            # sample clears it); none inside: until a sample comes
            self._within = (within_s, worst, inside[0][0] + within_s if inside else float("inf"))
            return worst

    def worst(self) -> tuple[float, float]:
        """(event loop, flush) lateness, the worst within the window (s)."""
        now = self.monotonic()
        with self._lock:
            return (max((x for t, x in self._loop if t >= now - self.window_s), default=0.0),
                    max((x for t, x in self._flush if t >= now - self.window_s), default=0.0))

    def reason(self, bound_s: float) -> str | None:
        """Why this replica must not judge silences now (None: it may)."""
        loop, flush = self.worst()
        return lag_reason(loop_lag_s=loop, flush_late_s=flush, bound_s=bound_s,
                          shed=self.shed_lately(silencing=True))

    async def watch_loop(self, every_s: float = 0.5) -> None:
        """Runs on the server's event loop until cancelled: how late each timer fires."""
        import asyncio
        while True:
            t = self.monotonic()
            await asyncio.sleep(every_s)
            self.loop_late(max(0.0, self.monotonic() - t - every_s))


class LivenessWatch:
    def __init__(self, *, store: Store, cfg: LivenessConfig, heartbeat_timeout_s: float,
                 clock: Callable[[], float] = time.time, pulse: Pulse | None = None, lag: Lag | None = None,
                 cache: HostCache | None = None, missed_beat_s: float | None = None,
                 heard_late_s: float | None = None):
        self.store = store
        self.cfg = cfg
        self.timeout = heartbeat_timeout_s
        # silent longer than this: a missed beat (``liveness_rule.missed_beat_after``),
        # counted towards an event before the timeout; None: only the hosts past it count
        self.missed_beat_s = missed_beat_s
        # how old the newest shared row may be while the fleet still counts as heard up to
        # now (``liveness_rule.silent_allowance``); None: the grace always counts in full
        self.heard_late_s = heard_late_s
        self.clock = clock
        self.pulse = pulse
        self.cache = cache
        self.lag = lag if lag is not None else Lag()
        self.held_for_lag = 0  # checks that marked nothing because this replica lagged
        self.started = clock()
        self.rules = Rules(cfg.rack_share, cfg.fleet_share, cfg.min_hosts)
        self._events: set[str] = set()  # the events reported, while they last
        self._stop = threading.Event()
        self._t: threading.Thread | None = None

    def check(self) -> Judgement | None:
        """One check; None while in the grace period after start."""
        now = self.clock()
        grace = self.cfg.grace_s if self.cfg.grace_s > 0 else self.timeout
        since = self.started
        if self.pulse is not None:
            if self.pulse.flowing_since is None:
                return None
            since = max(since, self.pulse.flowing_since)
            # the rows show the fleet heard without a gap since then: this replica's own
            # start (a restart beside its peers) hid no beat from it
            heard = None if self.heard_late_s is None else self.pulse.heard_since(now, late_s=self.heard_late_s)
            if heard is not None:
                since = min(since, heard)
        if now - since < grace:
            return None
        why = self.lag.reason(self.cfg.lag_bound_s)
        if why is not None:
            self.held_for_lag += 1
            log.warning("liveness check skipped: this replica lags (%s); no host marked down", why)
            return None
        if self.pulse is not None and (why := self.pulse.peer_lag(now, within_s=self.lag.window_s)) is not None:
            self.held_for_lag += 1
            log.warning("liveness check skipped: %s; no host marked down", why)
            return None
        down = host_repo.down_before(now=now, heartbeat_timeout_s=self.timeout)
        # the hosts past the timeout, and those that missed a beat and will be past it
        # soon: a group silenced at once crosses the timeout over a beat interval, and is
        # judged whole at the check that would mark its first (``liveness_rule``)
        missed_before = down if self.missed_beat_s is None else max(down, now - self.missed_beat_s)
        sv = self.survey(now, missed_before)
        past = {n: r for n, r in sv.silent.items() if sv.last[n] < down}
        got = judge(past, sv.marked, sv.sizes, self.rules,
                    missed={n: r for n, r in sv.silent.items() if n not in past})
        marks = {n: sv.last[n] for n in got.mark
                 if self.pulse is None or self.pulse.seen(n, sv.recorded[n]) < down}  # not beaten here since
        events = set(got.events) - self._events
        for why in events:
            log.error("liveness event: %s", why)
        if marks or events:
            with self.store.write() as s:  # one transaction, a few statements however many hosts
                flagged = host_repo.mark_down(session=s, hosts=marks, before=down, now=now)
                audit_repo.record_many(session=s, rows=[dict(
                    principal="scheduler", action="host.down", target=n, now=now,
                    detail={"silent_since": marks[n], "silent_s": round(now - marks[n], 1), "vms_flagged": k})
                    for n, k in flagged.items()] + [dict(
                        principal="scheduler", action="fleet.silence", target="-", now=now,
                        detail={"event": why, "hosts": sorted(h for h, w in got.held.items() if w == why)[:100]})
                        for why in sorted(events)])
            if self.cache is not None and flagged:
                self.cache.marked_down(dict.fromkeys(flagged, now))
            for n, k in flagged.items():  # another replica did the others, or they beat meanwhile
                log.warning("host down name=%s silent_s=%.1f vms_flagged=%d", n, now - marks[n], k)
        self._events = set(got.events)
        return got

    def survey(self, now: float, down: float) -> Survey:
        """What the check judges (``liveness_rule.Survey``). With the shared liveness and
        the index (a serving replica): from memory, ``HostCache.survey``, after the index's
        change feed is read (O(changed hosts): one statement when nothing changed) and the
        replicas' rows written since the last read (one statement: a row per replica and
        period, whatever the fleet's size). Without (written
        through: every beat writes its row, the rows are the liveness): the silent rows,
        an indexed query, and the rack sizes."""
        if self.cache is not None and self.pulse is not None:
            self.cache.refresh(self.store, now=now, fresh=True)
            with self.store.read() as s:
                self.pulse.read(s)
            return self.cache.survey(before=down)
        with self.store.read() as s:
            if self.pulse is not None:
                self.pulse.read(s)
            rows = [r for r in host_repo.silent(session=s, before=down)
                    if self.pulse is None or self.pulse.seen(r.name, r.last_heartbeat) < down]
            sizes = host_repo.rack_sizes(session=s) if rows else {}
        last = {r.name: r.last_heartbeat if self.pulse is None else self.pulse.seen(r.name, r.last_heartbeat)
                for r in rows}
        return Survey(silent={r.name: r.rack for r in rows}, marked={r.name for r in rows if r.down_since is not None},
                      sizes=sizes, recorded={r.name: r.last_heartbeat for r in rows}, last=last)

    def start(self) -> LivenessWatch:
        self._t = threading.Thread(target=self._run, name="liveness", daemon=True)
        self._t.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.cfg.check_s):
            try:
                self.check()
            except Exception:  # noqa: BLE001 - the next check tries again (a database away)
                log.exception("liveness check failed")

    def stop(self) -> None:
        self._stop.set()
        if self._t is not None:
            self._t.join(10)
