"""Host registration, heartbeats, admin states, and the public view (free/used)."""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from datetime import datetime, timezone
from urllib.parse import urlsplit

import anyio.to_thread
from sqlalchemy.orm import Session

from api.layout import Layout
from api.states import AdminState, HostClass, HostState, RolloutHostState
from scheduler.db.engine import Store
from scheduler.db.models import Host
from scheduler.errors import BeatTooSoon, HostAdminOwned, HostAdminStale, HostNotYours, SchedulerError
from scheduler.metrics import Metrics
from scheduler.repo import audit as audit_repo
from scheduler.repo import batch as batch_repo
from scheduler.repo import days as days_repo
from scheduler.repo import hosts as host_repo
from scheduler.repo import pulse as pulse_repo
from scheduler.repo import rollouts as rollout_repo
from scheduler.repo import stats as stats_repo
from scheduler.repo import vms as vm_repo
from scheduler.resources import HostRes, Usage
from scheduler.schemas.fleet import FleetHostsPublic, HostDaysIn, PagesOut
from scheduler.schemas.hosts import (AdminChange, HeartbeatOut, HostDiskOut, HostPublic, HostRegister, HostsPublic,
                                     HostStatsIn, HostStatsPublic, NodeOut, PfOut, PoolOut, StatsBucketOut,
                                     TargetGroup)
from scheduler.service.claimq import ClaimQueue
from scheduler.service.fleet import check_day
from scheduler.service.hostcache import HostCache
from scheduler.service.rollouts import check_fence
from scheduler.service.rollouts import owner_of as rollout_owner

log = logging.getLogger(__name__)
HOST_ROWS_CHUNK = 2000  # host rows a transaction: the shared row is written between them when due


@dataclass(frozen=True)
class RegisterItem:
    """A registration checked on the request's side (its layout parsed and checked, so a
    bad one is refused before it queues), ready for the registration thread."""

    body: HostRegister
    actor: str
    admin: bool
    bound_host: str | None
    parsed: Layout


class HostService:
    def __init__(self, *, store: Store, cache: HostCache, heartbeat_timeout_s: float,
                 clock: Callable[[], float] = time.time, stats_bucket_s: int = 300,
                 stats_retention_days: float = 14.0, heartbeat_flush_s: float = 0.0,
                 heartbeat_write_s: float = 0.0, heartbeat_min_interval_s: float = 0.0,
                 history_days: float = 400.0, metrics: Metrics | None = None,
                 on_draining: Callable[[], None] | None = None, register_batch: int = 64):
        """``on_draining``: called after a host is set draining (the drain loop's wake-up,
        so a drain starts now rather than at the loop's next interval). ``register_batch``:
        the most registrations written in one transaction by the registration thread
        (``register_async``); 0: each in a transaction of its own on its request's thread."""
        self.store = store
        self.register_batch = register_batch
        self.registrations = ClaimQueue(self.register_many, max_batch=max(1, register_batch), name="registrations")
        self.on_draining = on_draining
        self.bucket_s = stats_bucket_s
        self.retention_s = stats_retention_days * 86400
        self.cache = cache
        self.timeout = heartbeat_timeout_s
        self.clock = clock
        # Heartbeats are checked on a read and written in batches, one transaction per
        # ``heartbeat_flush_s`` (0: each flushed at once, as it comes): at fleet scale (700-10,000
        # a second) a write transaction each took SQLite's writer lock from the claims.
        self.flush_s = heartbeat_flush_s
        self.write_s = heartbeat_write_s
        self.min_interval_s = heartbeat_min_interval_s
        self._last_beat: dict[str, float] = {}  # host -> its last beat taken (the rate limit)
        self._days: dict[tuple[str, str], dict] = {}  # (host, day) -> its latest summary, unwritten
        self.history_days = history_days
        self.metrics = metrics
        self._days_expired = 0.0
        self._written: dict[str, float] = {}  # host -> the beat time this replica last wrote
        self._flush_took: dict[str, float] = {}  # the last flush's parts (s), for the slow-flush log
        self._slow_logged = float("-inf")
        self._shared_at: float | None = None  # when this replica's shared row was last written (monotonic)
        self._was_down: set[str] = set()  # beaten since the last flush while down (``cache.pulse``)
        # host -> its last beat since the flush, and the stats of those that sent some: a
        # float a beat, no list or tuple (objects the cyclic GC tracks and walks, 2 a beat)
        self._beats: dict[str, float] = {}
        self._stats: dict[str, list[HostStatsIn]] = {}
        # the beats' maps and, with the shared liveness, the pulse's: one lock a beat's record
        # takes (``_record``), the pulse's own, so its maps are changed under it as well
        self._beats_lock = cache.pulse.lock if cache.pulse is not None else threading.Lock()
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        self._refresher: threading.Thread | None = None
        self._expired = 0.0
        self.lag: Any = None  # service.liveness.Lag: told how late this replica's shared row comes

    async def register_async(self, body: HostRegister, *, actor: str, admin: bool,
                             bound_host: str | None) -> tuple[HostPublic, bool]:
        """``register`` through the registration thread: the registrations that queued
        meanwhile are written with it in one transaction (``register_many``), each
        answered with its own result or error. The layout is checked here first, so a bad
        one is refused (BadLayout, naming the field) before it queues. With
        ``register_batch`` 0, ``register`` on a worker thread (a transaction each)."""
        if self.register_batch <= 0:
            return await anyio.to_thread.run_sync(  # the worker threads the sync route ran on
                functools.partial(self.register, body, actor=actor, admin=admin, bound_host=bound_host))
        parsed = host_repo.check_layout(body.layout, body.cpu_siblings)
        item = RegisterItem(body, actor, admin, bound_host, parsed)
        return await self.registrations.submit(item, asyncio.get_running_loop())  # type: ignore[no-any-return]

    def register_many(self, items: list[RegisterItem], more: Callable[[], list[RegisterItem]] | None = None
                      ) -> list[tuple[HostPublic, bool] | BaseException]:
        """Register ``items`` in one write transaction (and those ``more`` hands over once
        it is open: on SQLite, holding the writer lock they queued behind). A
        registration refused (another principal's host, a layout that would take resources
        from running VMs) changes nothing and is answered its error, the others are
        written. One result per item, in order. A batch that cannot commit (a lost
        connection, a deadlock between replicas' batches, another replica's insert of
        the same new host) leaves nothing written and is redone one registration at a
        time, each answered by its own transaction."""
        items = list(items)
        now = self.clock()
        out: list[Any] = []
        denied: list[tuple[RegisterItem, HostNotYours]] = []
        try:
            with self.store.batch_write() as s:
                beat_id = pulse_repo.BeatIdSource(s)
                stamp: list[int] = []

                def seq() -> int:
                    """The batch's one change stamp (PostgreSQL: its transaction id, a round
                    trip each time it was asked), taken when a registration first needs it."""
                    if not stamp:
                        stamp.append(host_repo.next_seq(s))
                    return stamp[0]
                batch_repo.defer_inserts(session=s)  # the audit rows, written together at the end
                rows: dict[str, Host | None] = {}
                while True:
                    new = sorted({it.body.name for it in items[len(out):]} - rows.keys())  # one read for them all
                    rows.update(dict.fromkeys(new))
                    rows.update((h.name, h) for h in host_repo.hosts_by_name(session=s, names=new))
                    beat_id.reserve(sum(1 for n in new if rows[n] is None))
                    for it in items[len(out):]:
                        got = self._register_in(s, it, now, rows, beat_id, seq)
                        out.append(got)
                        if isinstance(got, HostNotYours):
                            denied.append((it, got))
                    got_more = more() if more is not None else []
                    if not got_more:
                        break
                    items.extend(got_more)
                s.flush()  # every new or changed host's row
                for table, _cols, _json, deferred in batch_repo.take_deferred(session=s):
                    if table == "audit":
                        audit_repo.insert_rows(session=s, rows=deferred)
        except Exception as e:  # noqa: BLE001 - nothing of the batch was written: each alone
            log.warning("registration batch of %d not written (%s); registering one at a time", len(items), e)
            return [self._register_alone(it) for it in items]
        if self.metrics is not None:
            self.metrics.register_batch.observe(len(items))
        for it, e in denied:
            log.warning("host host.register denied principal=%s host=%s: %s", it.actor, it.body.name, e.message)
        for it, got in zip(items, out):
            if isinstance(got, tuple):
                log.info("host %s name=%s address=%s", "registered" if got[1] else "re-registered",
                         got[0].name, got[0].address)
        return out

    def _register_in(self, s: Session, it: RegisterItem, now: float, rows: dict[str, Host | None],
                     beat_id: Callable[[], int], seq: Callable[[], int]) -> Any:
        """One registration of a batch: (public view, created), or the error that refused
        it (a refusal for another principal's host audited in the batch). Every refusal
        is decided before the registration changes anything (``host_repo.upsert_host``),
        so a refused one leaves the batch as it found it without a savepoint (a savepoint
        a registration made SQLAlchemy flush each host's row alone: a fifth of a
        replica's CPU). Any other error fails the batch, which is then redone one
        registration at a time. ``rows``: the batch's hosts as read at its start, and as
        it writes them; their rows are flushed together at its end."""
        b = it.body
        known = rows.get(b.name, host_repo.LOOKUP)
        try:
            self._may_act(s, b.name, actor=it.actor, admin=it.admin, bound_host=it.bound_host, known=known)
            h, created = self._upsert(s, b, now, actor=it.actor, admin=it.admin, parsed=it.parsed, known=known,
                                      beat_id=beat_id, flush=False, seq=seq)
        except HostNotYours as e:
            audit_repo.record(session=s, principal=it.actor, action="host.register.denied", target=b.name, now=now,
                              detail={"reason": e.message, "address": b.address, "rack": b.rack})
            return e
        except SchedulerError as e:
            return e
        rows[b.name] = h
        return self._public(s, h, now, 0 if created else None, parsed=it.parsed), created

    def _register_alone(self, it: RegisterItem) -> tuple[HostPublic, bool] | BaseException:
        try:
            return self.register(it.body, actor=it.actor, admin=it.admin, bound_host=it.bound_host, parsed=it.parsed)
        except Exception as e:  # noqa: BLE001 - handed to the request
            return e

    def _upsert(self, s: Session, b: HostRegister, now: float, *, actor: str, admin: bool,
                parsed: Layout | None, known: Any = host_repo.LOOKUP,
                beat_id: Callable[[], int] | None = None, flush: bool = True,
                seq: Callable[[], int] | None = None) -> tuple[Host, bool]:
        """The host's row and its audit entry, in ``s`` (``known``, ``beat_id``, ``flush``,
        ``seq``: as ``host_repo.upsert_host``)."""
        h, created = host_repo.upsert_host(
            session=s, name=b.name, address=b.address, rack=b.rack, labels=b.labels,
            layout=b.layout, siblings=b.cpu_siblings, pf_min_rate=b.pf_min_rate,
            disk_classes=b.disk_classes, now=now, owner="" if admin else actor, heartbeat_timeout_s=self.timeout,
            scrape={k: getattr(b, k) for k in host_repo.SCRAPE_FIELDS}, parsed=parsed, known=known,
            beat_id=beat_id, flush=flush, seq=seq)
        audit_repo.record(session=s, principal=actor, action="host.register" if created else "host.update",
                          target=h.name, now=now, detail={"address": h.address, "layout_rev": h.layout_rev})
        return h, created

    def register(self, body: HostRegister, *, actor: str, admin: bool,
                 bound_host: str | None, parsed: Layout | None = None) -> tuple[HostPublic, bool]:
        """``actor`` registers ``body.name``: refused (403, audited) when its token is bound
        to another host, or when another principal registered the host (admins may). Who
        the caller is (``actor``, ``admin``, ``bound_host``) has no default. One write
        transaction (``register_async`` batches them)."""
        now = self.clock()
        if parsed is None:
            parsed = host_repo.check_layout(body.layout, body.cpu_siblings)  # outside the writer lock
        try:
            with self.store.write() as s:
                self._may_act(s, body.name, actor=actor, admin=admin, bound_host=bound_host)
                h, created = self._upsert(s, body, now, actor=actor, admin=admin, parsed=parsed)
                out = self._public(s, h, now, 0 if created else None, parsed=parsed)
        except HostNotYours as e:
            self._audit_denied(actor, "host.register", body.name, e, address=body.address, rack=body.rack)
            raise
        log.info("host %s name=%s address=%s", "registered" if created else "re-registered", h.name, h.address)
        return out, created

    def beat_now(self, name: str, *, actor: str, admin: bool, bound_host: str | None,
                 stats: HostStatsIn | None = None) -> tuple[str, int, float] | None:
        """The steady-state heartbeat, answered from memory on the caller's thread: who may
        beat for the host and what to answer come from the placement index (kept current
        from the change feed, which carries registrations, owners and admin states from
        every replica), the beat is recorded for the flusher. No database read or write.
        Returns (state, generation, last_heartbeat), what ``api/wire.beat_json`` renders.
        None when the database must answer: the index is cold or does not know the host
        (404, or registered a moment ago on another replica), or the caller may not beat
        for it (refused and audited by ``heartbeat``), or beats are written through
        (``heartbeat_flush_s = 0``)."""
        if self.flush_s <= 0 or self.cache.cold:
            return None
        got = self.cache.who(name)
        if got is None:
            return None
        owner, state, generation = got
        if not admin and ((bound_host is not None and bound_host != name) or (owner and owner != actor)):
            return None
        now = self.clock()
        self._record(name, now, stats)
        return state, generation, now

    def heartbeat_shed(self, name: str, *, actor: str, admin: bool, bound_host: str | None) -> bool:
        """A beat this replica sheds (``service.shed``) still counts: its host's liveness is
        kept from memory as ``beat_now`` keeps it (its stats are dropped). False when
        memory cannot say who may beat for the host (nothing kept: the caller's refusal
        stands alone). BeatTooSoon as for any beat."""
        if self.cache.cold:
            return False
        got = self.cache.who(name)
        if got is None:
            return False
        owner = got[0]
        if not admin and ((bound_host is not None and bound_host != name) or (owner and owner != actor)):
            return False
        self._record(name, self.clock(), None)
        return True

    def heartbeat(self, name: str, *, actor: str, admin: bool, bound_host: str | None,
                  stats: HostStatsIn | None = None) -> HeartbeatOut:
        """``actor`` says host ``name`` is alive, under the same rule as ``register``: a
        caller who forgets who it is gets a TypeError, never an admin's rights. Checked
        against the database (``beat_now`` is the same from memory)."""
        now = self.clock()
        try:
            with self.store.read() as s:  # no writer lock: the check, and 404 for an unknown host
                self._may_act(s, name, actor=actor, admin=admin, bound_host=bound_host)
                h = host_repo.get_host(session=s, name=name)
                out = HeartbeatOut(name=h.name, state=h.admin_state, generation=h.generation, last_heartbeat=now)
        except HostNotYours as e:
            self._audit_denied(actor, "host.heartbeat", name, e)
            raise
        self._record(name, now, stats)
        if self.flush_s <= 0:
            self.flush()  # write-through: the same statements, at once
        return out

    def record_days(self, name: str, body: HostDaysIn, *, actor: str, admin: bool, bound_host: str | None) -> int:
        """``actor`` sends host ``name``'s day summaries (the heartbeat's rule for who may);
        kept for the flusher (the latest of a day replaces the earlier). A day more than
        a day ahead of the scheduler's UTC date is refused, naming it."""
        now = self.clock()
        for i, d in enumerate(body.days):
            check_day(d.day, now=now, field=f"days[{i}].day")
        try:
            with self.store.read() as s:
                self._may_act(s, name, actor=actor, admin=admin, bound_host=bound_host)
                host_repo.get_host(session=s, name=name)
        except HostNotYours as e:
            self._audit_denied(actor, "host.days", name, e)
            raise
        with self._beats_lock:
            for d in body.days:
                self._days[(name, d.day.isoformat())] = days_repo.row_of(name, d)
            self._start_flusher()
        if self.flush_s <= 0:
            self.flush()
        return len(body.days)

    def _record(self, name: str, now: float, stats: HostStatsIn | None) -> None:
        """Keep the beat for the flusher; BeatTooSoon (429, nothing kept) when the host beat
        less than ``min_interval_s`` ago."""
        with self._beats_lock:
            last = self._last_beat.get(name)
            if last is not None and 0 <= now - last < self.min_interval_s:
                raise BeatTooSoon(f"{name} beat {now - last:.3f} s ago; at most one beat per "
                                  f"{self.min_interval_s:g} s a host (placement.heartbeat_min_interval_s)",
                                  field="name", extra={"retry_after_s": round(self.min_interval_s - (now - last), 3)})
            self._last_beat[name] = now
            if self.metrics is not None:
                self.metrics.heartbeats.inc()
            pulse = self.cache.pulse
            if pulse is not None:
                # down as the shared liveness has it, or as the index last judged (a host no
                # replica heard from within the rows kept, ``prev`` None, is there if down)
                prev = pulse.beat_held(name, now)  # ``_beats_lock`` is the pulse's lock
                if (prev is not None and host_repo.is_down(prev, now=now, heartbeat_timeout_s=self.timeout)) \
                        or self.cache.is_down(name):
                    self._was_down.add(name)
                else:
                    self._written.setdefault(name, now)  # up: its row is due ``write_s`` from now
            if stats:
                kept = self._stats.get(name)
                if kept is None:
                    self._stats[name] = [stats]
                else:
                    kept.append(stats)  # the list is this dict's alone (flush swaps the dict out)
            self._beats[name] = now
            if self._flusher is None:
                self._start_flusher()

    def _start_flusher(self) -> None:
        """The flusher and the index's refresher beside it, started by the first beat or
        day this replica keeps (a day sent before any beat was kept unwritten until a beat
        came). Under ``_beats_lock``."""
        if self._flusher is None and self.flush_s > 0:
            self._flusher = threading.Thread(target=self._flush_loop, name="heartbeats", daemon=True)
            self._flusher.start()
            self._refresher = threading.Thread(target=self._refresh_loop, name="index-refresh", daemon=True)
            self._refresher.start()

    def _expire_days(self, s: Session) -> None:
        """Day rows older than ``history_days``, at most once an hour."""
        now = self.clock()
        if now - self._days_expired > 3600:
            cut = dt.datetime.fromtimestamp(now - self.history_days * 86400, dt.timezone.utc).date().isoformat()
            days_repo.expire(session=s, before_day=cut)
            self._days_expired = now

    def _expire(self, s: Session) -> None:
        """Retention, at most once per window (an index on the bucket makes it a range delete)."""
        now = self.clock()
        if now - self._expired > self.bucket_s:
            stats_repo.expire(session=s, before=now - self.retention_s)
            self._expired = now

    def flush(self) -> int:
        """Write the heartbeats received since the last flush; how many hosts. A host's
        liveness (``last_heartbeat``) is written only when this replica last wrote it
        ``write_s`` or more ago: the database's cost per host is bounded whatever the beat
        rate, and the recorded liveness lags the last beat by at most ``write_s`` (plus a
        flush). A host deleted meanwhile is skipped. The shared row (``_share``) goes
        first and again between chunks of host rows: peers allow for it a flush late at
        most, and 100,000 hosts back from down at once are seconds of host rows."""
        with self._beats_lock:
            beats, self._beats = self._beats, {}
            kept_stats, self._stats = self._stats, {}
            days, self._days = self._days, {}
            was_down, self._was_down = self._was_down, set()
        t0 = time.monotonic()
        self._share()
        t1 = time.monotonic()
        if days:
            with self.store.write() as s:
                days_repo.upsert_many(session=s, rows=list(days.values()))
                self._expire_days(s)
        t2 = time.monotonic()
        self._flush_took = {"shared row": t1 - t0, "days": t2 - t1, "host rows": 0.0}
        if not beats:
            return 0
        buckets: dict[tuple[str, int], dict] = {}
        for name, stats in kept_stats.items():
            for st in stats:
                stats_repo.fold(buckets, name, st, self.bucket_s)
        pulse = self.cache.pulse
        # without the shared liveness (written through) the rows are all there is: each beat's
        write_s = self.write_s if pulse is not None else 0.0
        due = {n: at for n, at in beats.items()
               if n in was_down or at - self._written.get(n, float("-inf")) >= write_s}
        if not due and not buckets:
            return len(beats)
        gone: set[str] = set()
        names = list(due)
        for i in range(0, len(names), HOST_ROWS_CHUNK):
            part = {n: due[n] for n in names[i:i + HOST_ROWS_CHUNK]}
            with self.store.write() as s:
                gone.update(host_repo.heartbeat_many(session=s, beats=part, heartbeat_timeout_s=self.timeout,
                                                     was_down=None if pulse is None else was_down & part.keys()))
            self._written.update(part)
            self._share()
        with self.store.write() as s:
            stats_repo.add_many(session=s, rows={k: v for k, v in buckets.items() if k[0] not in gone})
            self._expire(s)
        self._flush_took["host rows"] = time.monotonic() - t2
        if self.metrics is not None:
            self.metrics.liveness_rows.inc(len(due))
        return len(beats)

    def _share(self) -> None:
        """This replica's shared row, when its period is over (and the peers' rows read).
        How late it comes, past a period and the flush's own tick, is the flush lag that
        holds the liveness checks (``Lag``): peers judge from the row, allowing for it a
        flush late. The host rows' writes are not part of it: they are not what peers
        judge from."""
        pulse = self.cache.pulse
        if pulse is None or not pulse.due(self.clock()):
            return
        with self.store.write() as s:
            if pulse.write(s, self.clock()) and self.metrics is not None:
                self.metrics.liveness_rows.inc()
            pulse.read(s)
        mono = time.monotonic()
        if self.lag is not None and self._shared_at is not None:
            self.lag.flush_late(max(0.0, mono - self._shared_at - pulse.period_s - self.flush_s))
        self._shared_at = mono

    def _flush_loop(self) -> None:
        """Each ``flush_s``: the beats kept to the database, this replica's shared row
        first. A flush over its period logs what it spent its time on."""
        while not self._stop.wait(self.flush_s):
            began = time.monotonic()
            try:
                n = self.flush()
            except Exception:  # noqa: BLE001 - the next round retries what is pending again
                log.exception("heartbeat flush failed")
                continue
            took = time.monotonic() - began
            if took > self.flush_s and began - self._slow_logged >= 10.0:
                self._slow_logged = began
                parts = ", ".join(f"{k} {v:.2f} s" for k, v in self._flush_took.items())
                log.warning("heartbeat flush took %.2f s, over its %g s period: %s; %d hosts' beats",
                            took, self.flush_s, parts, n)

    def _refresh_loop(self) -> None:
        """Keeps the index, which ``beat_now`` answers from, current when no placement
        refreshes it. On a thread of its own: on the flusher's, reading the change feed
        after the fleet's rows changed (100,000 hosts back from down: 3.45 s) made the
        shared row seconds late, and the replica held its liveness checks for a lag of
        its own making."""
        while not self._stop.wait(self.flush_s):
            try:
                self.cache.refresh(self.store, now=self.clock())
            except Exception:  # noqa: BLE001 - the next round reads the feed again
                log.exception("index refresh failed")

    def close(self) -> None:
        self.registrations.close()
        self._stop.set()
        for t in (self._flusher, self._refresher):
            if t is not None:
                t.join(timeout=5)
        try:
            self.flush()
            if self.cache.pulse is not None:  # a replica stopped, not dead: its last period too
                with self.store.write() as s:
                    self.cache.pulse.write(s, self.clock(), force=True)
        except Exception:  # noqa: BLE001 - shutting down
            log.exception("last heartbeat flush failed")

    @staticmethod
    def _may_act(s: Session, name: str, *, actor: str, admin: bool, bound_host: str | None,
                 known: Any = host_repo.LOOKUP) -> None:
        """``known``: the host's row (None: no such host) when the caller read it."""
        if admin:
            return
        if bound_host is not None and bound_host != name:
            raise HostNotYours(f"{actor} is bound to host {bound_host!r}, not {name!r}", field="name")
        owner = host_repo.owner_of(session=s, name=name) if known is host_repo.LOOKUP else \
            (None if known is None else known.owner)
        if owner and owner != actor:
            raise HostNotYours(f"{name} was registered by another principal; {actor} may not act for it",
                               field="name")

    def _audit_denied(self, actor: str, action: str, name: str, e: HostNotYours, **detail: str) -> None:
        """In a transaction of its own: the refused one rolled back."""
        with self.store.write() as s:
            audit_repo.record(session=s, principal=actor, action=f"{action}.denied", target=name, now=self.clock(),
                              detail={"reason": e.message, **detail})
        log.warning("host %s denied principal=%s host=%s: %s", action, actor, name, e.message)

    def stats(self, name: str, *, since: float | None, until: float | None) -> HostStatsPublic:
        with self.store.read() as s:
            host_repo.get_host(session=s, name=name)  # 404 for an unknown host
            rows = stats_repo.history(session=s, host=name, since=since, until=until)
            items = [StatsBucketOut(
                start=r.bucket, heartbeats=r.heartbeats, samples=r.samples,
                **{k: getattr(r, k) / r.heartbeats for k in stats_repo.SUMS},
                **{k: getattr(r, k) for k in stats_repo.MAXIMA + ("foreign_cpu_s", "throttled_periods",
                                                                  "probe_ok", "probe_failed")},
                psi_stall=r.psi_stall / r.psi_n if r.psi_n else None) for r in rows]
        return HostStatsPublic(host=name, bucket_s=self.bucket_s, items=items)

    def scrape_targets(self) -> list[TargetGroup]:
        """Prometheus http_sd: one target group per host that registered a metrics address,
        labelled with its rack, name, state (as ``GET /v1/hosts`` says it: down after
        ``heartbeat_timeout_s`` of silence), carved policy digest and hostd version (each
        left out when the host did not register it). One query, whatever the fleet's size."""
        now = self.clock()
        with self.store.read() as s:
            rows = host_repo.scrape_targets(session=s)
        out = []
        for r in rows:
            u = urlsplit(r.metrics_url)
            labels = {"__scheme__": u.scheme, "__metrics_path__": u.path, "host": r.name, "rack": r.rack,
                      "state": host_repo.effective_state(r, now=now, heartbeat_timeout_s=self.timeout,
                                                         pulse=self.cache.pulse)}
            if r.carved_policy is not None:
                labels["carved_policy"] = r.carved_policy
            if r.hostd_version is not None:
                labels["hostd_version"] = r.hostd_version
            out.append(TargetGroup(targets=[u.netloc], labels=labels))
        return out

    def set_state(self, name: str, state: str, *, actor: str, change: AdminChange) -> HostPublic:
        """``actor`` sets host ``name``'s admin state. The hold's owner is derived, never
        taken from the request: the actor, or ``rollout:<name>`` when the actor's
        ``change.fence`` is that rollout's live lease (refused as a controller's write
        is otherwise, and for a host not in the rollout). A host that another owner
        holds out of "active" is refused (HostAdminOwned, nothing written) unless
        ``change.force``, which must name the owner it overrides (``expect_owner``: a
        compare-and-set, HostAdminStale when someone else holds it now); so two
        operators (or an operator and a fleet rollout) cannot undo each other's cordons
        unknowingly. A host with no recorded owner is anyone's. The same owner may repeat
        or move between cordoned and draining: the hold keeps its start and, when no
        reason is given, its reason. "active" ends the hold. The rollout's row (share)
        and then the host's are locked first (PostgreSQL), so two changes at once are
        judged one after the other, and none passes a take of the lease."""
        now = self.clock()
        with self.store.write() as s:
            owner, fence = actor, None
            if change.rollout is not None and change.fence is not None:
                rollout_repo.get_rollout(session=s, name=change.rollout, lock="share")
                fence = check_fence(s, change.rollout, change.fence, actor=actor, now=now).fence
                rollout_repo.get_host(session=s, rollout=change.rollout, name=name)  # its own hosts only
                owner = rollout_owner(change.rollout)
            h = host_repo.get_host(session=s, name=name, lock=True)
            before, held_by = h.admin_state, h.admin_owner
            holder_now = held_by if before != AdminState.ACTIVE else ""
            if change.expect_owner is not None and change.expect_owner != holder_now:
                raise HostAdminStale(f"expected {change.expect_owner or 'nobody'} to hold host {name}, but "
                                     + (_held_message(h) if holder_now else f"it is {before} (no owner holds it)"),
                                     field="expect_owner")
            overrides = before != AdminState.ACTIVE and held_by not in ("", owner)
            if overrides and not change.force:
                raise HostAdminOwned(_held_message(h) + f"; only {held_by} may change its admin state, or send "
                                     f'{{"force": true, "expect_owner": "{held_by}"}} to override', field="owner")
            if state == AdminState.ACTIVE:
                hold: tuple[str, str, float | None] = ("", "", None)
            elif before != AdminState.ACTIVE and held_by == owner:
                hold = (owner, change.reason or h.admin_reason, h.admin_since)
            else:
                hold = (owner, change.reason, now)
            host_repo.set_admin_state(session=s, name=name, state=state, now=now, owner=hold[0], reason=hold[1],
                                      since=hold[2])
            detail = {"from": before, "owner": owner, "reason": change.reason, "forced": overrides,
                      "previous_owner": held_by}
            audit_repo.record(session=s, principal=actor, action=f"host.{state}", target=name, now=now,
                              detail=detail if fence is None else {**detail, "fence": fence})
            out = self._public(s, h, now)
        log.log(logging.WARNING if overrides else logging.INFO,
                "host state name=%s %s -> %s owner=%s by=%s previous_owner=%s forced=%s reason=%r",
                name, before, state, owner, actor, held_by, overrides, change.reason)
        if state == AdminState.DRAINING and self.on_draining is not None:
            self.on_draining()
        return out

    def get(self, name: str) -> HostPublic:
        now = self.clock()
        with self.store.read() as s:
            return self._public(s, host_repo.get_host(session=s, name=name), now)

    def list(self, *, rack: str | None = None, state: str | None = None, limit: int | None = None,
             after: str = "") -> HostsPublic:
        """Every host, or a page of ``limit`` by name after ``after``. ``next`` is the name
        to ask after when more may follow; ``state`` (which depends on the time of the
        last heartbeat) filters a page after it is read, so a page may hold fewer."""
        now = self.clock()
        with self.store.read() as s:
            counts = vm_repo.count_live_by_host(session=s)
            rows = host_repo.list_hosts(session=s, rack=rack, limit=limit, after=after)
            items = [self._public(s, h, now, counts.get(h.name, 0)) for h in rows]
        nxt = rows[-1].name if limit is not None and len(rows) == limit else None
        return HostsPublic(items=[h for h in items if state is None or h.state == state], next=nxt)

    def summary(self) -> FleetHostsPublic:
        """Every host counted by state and by class, and the free capacity, in one read
        and without building each host's public view (``list``'s cost per host)."""
        now = self.clock()
        acc = _Summary()
        with self.store.read() as s:
            in_rollout = rollout_repo.active_host_states(session=s)
            for h in host_repo.summary_rows(session=s):
                state = host_repo.effective_state(h, now=now, heartbeat_timeout_s=self.timeout,
                                                  pulse=self.cache.pulse)
                acc.add(state, host_class(state, h.admin_state, bool(h.carved_policy), in_rollout.get(h.name, "")),
                        live=state == HostState.ACTIVE and h.admin_state == AdminState.ACTIVE, res=self.cache.res(s, h),
                        u=Usage.from_dict(h.usage))
        return acc.public()

    def state_counts(self) -> dict[str, int]:
        """Hosts by state as the views say it (down after ``heartbeat_timeout_s`` of silence)."""
        now = self.clock()
        with self.store.read() as s:
            rows = host_repo.state_rows(session=s)
        out = dict.fromkeys(HostState, 0)
        for r in rows:
            out[host_repo.effective_state(r, now=now, heartbeat_timeout_s=self.timeout, pulse=self.cache.pulse)] += 1
        return out

    def _public(self, s: Session, h: Host, now: float, vms: int | None = None,
                parsed: Layout | None = None) -> HostPublic:
        """``vms``: its live VMs, when known (0 for a host just created); ``parsed``: its
        layout, when the caller parsed it."""
        res = self.cache.res(s, h, parsed)
        u = Usage.from_dict(h.usage)
        if vms is None:
            vms = len(vm_repo.live_on_host(session=s, host=h.name))
        carve = {n.get("node"): n for n in (h.layout or {}).get("nodes", ()) if isinstance(n, dict)}
        nodes = [NodeOut(node=n.node, io_cpus=sorted(carve.get(n.node, {}).get("io_cpus", ())),
                         host_cpus=sorted(carve.get(n.node, {}).get("host_cpus", ())),
                         vm_cpus=sorted(n.cpus), used_cpus=sorted(n.cpus & u.cpus),
                         free_cpus=len(n.cpus - u.cpus),
                         hugepages=[PoolOut(size_kb=sz, total=c, used=u.pages.get((n.node, sz), 0),
                                            free=c - u.pages.get((n.node, sz), 0)) for sz, c in n.hugepages])
                 for n in res.nodes]
        pfs = [PfOut(name=p.name, node=p.node, vfs_total=len(p.slots),
                     vfs_used=u.vfs_on(p.name), bandwidth_mbps=p.bandwidth_mbps,
                     reserved_mbps=u.reserved_mbps.get(p.name, 0), min_tx_rate_supported=p.min_rate_supported)
               for p in res.pfs]
        disks = [HostDiskOut(name=d.name, id=d.id, node=d.node, cls=d.cls, size_bytes=d.size_bytes,
                             bytes_sec=d.bytes_sec, iops=d.iops, used=d.name in u.disks,
                             atomic_write_bytes=d.atomic_write_bytes, atomic_note=d.atomic_note) for d in res.disks]
        held = h.admin_state != AdminState.ACTIVE
        return HostPublic(name=h.name, address=h.address, rack=h.rack, labels=h.labels,
                          state=host_repo.effective_state(h, now=now, heartbeat_timeout_s=self.timeout,
                                                          pulse=self.cache.pulse),
                          admin_state=h.admin_state, admin_owner=h.admin_owner if held else None,
                          admin_reason=h.admin_reason if held else None, admin_since=h.admin_since if held else None,
                          down_since=h.down_since, generation=h.generation,
                          last_heartbeat=h.last_heartbeat if self.cache.pulse is None
                          else self.cache.pulse.seen(h.name, h.last_heartbeat),
                          vms=vms, nodes=nodes, pfs=pfs, disks=disks, metrics_url=h.metrics_url,
                          hostd_version=h.hostd_version, carved_policy=h.carved_policy)


def _held_message(h: Host) -> str:
    """Who holds ``h`` out of "active", since when and why."""
    since = ("an unknown time" if h.admin_since is None
             else datetime.fromtimestamp(h.admin_since, timezone.utc).isoformat(timespec="seconds"))
    why = f"reason {h.admin_reason!r}" if h.admin_reason else "no reason given"
    return f"host {h.name} is {h.admin_state}, held by {h.admin_owner or '(no owner recorded)'} since {since} ({why})"


def host_class(state: str, admin_state: str, carved: bool, rollout_state: str) -> HostClass:
    """What an operator asks of a host first (``HostClass``): down; failed by its
    active rollout; converting (in an active rollout, between pending and verified);
    cordoned or draining; else carved or unconverted."""
    if state == HostState.DOWN:
        return HostClass.DOWN
    if rollout_state == RolloutHostState.FAILED:
        return HostClass.FAILED
    if rollout_state and rollout_state not in (RolloutHostState.VERIFIED, RolloutHostState.PENDING,
                                               RolloutHostState.SKIPPED, RolloutHostState.ROLLED_BACK):
        return HostClass.CONVERTING
    if admin_state != AdminState.ACTIVE:
        return HostClass.CORDONED
    return HostClass.CARVED if carved else HostClass.UNCONVERTED


class _Summary:
    """The sums behind ``FleetHostsPublic``: free over hosts that take VMs, totals over
    every host (pages: over hosts that take VMs, as the fleet page always showed)."""

    def __init__(self) -> None:
        self.hosts = 0
        self.states: dict[str, int] = dict.fromkeys(HostState, 0)
        self.classes: dict[str, int] = dict.fromkeys(HostClass, 0)
        self.cpus_free = self.cpus_total = self.vfs_free = self.vfs_total = self.tx_free = 0
        self.disks_free = self.disks_total = self.iops_free = 0
        self.pages: dict[int, list[int]] = {}

    def add(self, state: str, cls: str, *, live: bool, res: HostRes, u: Usage) -> None:
        self.hosts += 1
        self.states[state] = self.states.get(state, 0) + 1
        self.classes[cls] += 1
        for n in res.nodes:
            self.cpus_total += len(n.cpus)
            if live:
                self.cpus_free += len(n.cpus - u.cpus)
                for size, count in n.hugepages:
                    got = self.pages.setdefault(size, [0, 0])
                    got[0] += count - u.pages.get((n.node, size), 0)
                    got[1] += count
        for p in res.pfs:
            self.vfs_total += len(p.slots)
            if live:
                self.vfs_free += len(p.slots) - u.vfs_on(p.name)
                self.tx_free += p.bandwidth_mbps - u.reserved_mbps.get(p.name, 0)
        self.disks_total += len(res.disks)
        if live:
            free = [d for d in res.disks if d.name not in u.disks]
            self.disks_free += len(free)
            self.iops_free += sum(d.iops or 0 for d in free)

    def public(self) -> FleetHostsPublic:
        return FleetHostsPublic(
            hosts=self.hosts, states=self.states, classes=self.classes, cpus_free=self.cpus_free,
            cpus_total=self.cpus_total, pages=[PagesOut(size_kb=k, free=f, total=t)
                                               for k, (f, t) in sorted(self.pages.items())],
            vfs_free=self.vfs_free, vfs_total=self.vfs_total, tx_free_mbps=self.tx_free,
            disks_free=self.disks_free, disks_total=self.disks_total, disk_iops_free=self.iops_free)
