"""Claim: walk the free-capacity index (service/index.py) for a few candidates, then one
short write transaction per attempt that reads the host row (row-locked on PostgreSQL),
re-checks the allocation against the fresh usage (re-fitting that host if the index was
stale), and bumps the host generation (``UPDATE ... WHERE generation = :seen``). A lost
race (0 rows, or the host no longer fits) moves to the next candidate, then re-walks; bounded by
``claim_retries`` -> 409 ``hyb.concurrent_update``. Unlike Nova, the claim *is* the
placement decision: nothing is decided that is not also durably claimed.

Batches (``claim_many``, what the API's claim thread runs): the requests that queued
while the previous batch ran are claimed in *one* write transaction, each against the
index as the batch left it (the index learns every claim as it is made and is reloaded
from the database if the batch rolls back). One commit, one change stamp and one
claim-lock turn per batch instead of per claim. The claim lock (``placement.claim_lock
= "store"``, and always on SQLite) lets one claim transaction at a time run across all
replicas: SQLite's writer lock, PostgreSQL's advisory lock (``repo.pg.lock_claims``).
After taking it a batch reads the change feed, and its index is then exact for the
hosts it claims on: no row reads, no lost races. With ``claim_lock = "rows"``
(PostgreSQL), batches of different replicas run at once and take host rows with ``FOR
UPDATE SKIP LOCKED`` (a row another replica's batch holds is a lost race for this
candidate, never a wait, so two batches cannot deadlock). Anti-affinity requests run
alone (with row locks, their group lock must not be held across a batch).

Release is the mirror image: subtract the allocation, bump the generation."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from api.states import HostState
from scheduler.db.engine import Store
from scheduler.db.models import Vm
from scheduler.errors import ConcurrentUpdate, NoValidHost
from scheduler.fit import Candidate, FitResult, HostView, VmWant, check_allocation, fit_host, fit_vm
from scheduler.metrics import Metrics
from scheduler.repo import batch as batch_repo
from scheduler.repo import hosts as host_repo
from scheduler.repo import vms as vm_repo
from scheduler.resources import Allocation, Usage
from scheduler.service.hostcache import HostCache

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Affinity:
    group: str = ""
    scope: str = "host"  # "host" | "rack"
    ignore: str = ""  # a VM of the group not counted (one moving live: not against itself)


class _Lost(Exception):
    pass


@dataclass
class ClaimJob:
    """One request in a claim batch; ``claim_many`` fills ``vm`` or ``error``, or
    ``before`` (the caller's hook, run in the batch transaction) fills ``done``."""

    want: VmWant
    aff: Affinity
    write_vm: Callable[[Session, str, Allocation], Vm]
    exclude: frozenset[str] = frozenset()
    vm: Vm | None = None
    error: BaseException | None = None
    done: Any = None  # set by ``before``: nothing to claim (an idempotent replay)

    @property
    def settled(self) -> bool:
        return self.vm is not None or self.error is not None or self.done is not None


class FifoLock:
    """A lock handed to waiters in arrival order. Claims in one process run one at a time
    through it (the store serialises writers anyway): with 32 concurrent claims on SQLite,
    650 claims/s and p99 125 ms, against 260 claims/s and 574 ms behind a plain
    ``threading.Lock``: the GIL does not bounce between 32 threads inside the critical
    section, and no thread starves as it can behind a plain lock."""

    def __init__(self) -> None:
        self._m = threading.Lock()
        self._waiters: deque[threading.Event] = deque()
        self._held = False

    def __enter__(self) -> None:
        with self._m:
            if not self._held:
                self._held = True
                return
            ev = threading.Event()
            self._waiters.append(ev)
        ev.wait()  # ownership is handed over by release

    def __exit__(self, *exc: object) -> None:
        with self._m:
            if self._waiters:
                self._waiters.popleft().set()
            else:
                self._held = False


class Placer:
    def __init__(self, *, store: Store, cache: HostCache, candidates: int, retries: int,
                 metrics: Metrics | None = None, clock: Callable[[], float] = time.time,
                 claim_lock: str = "store"):
        self.store = store
        # One claim transaction at a time across replicas (``placement.claim_lock``): SQLite
        # always (its writer lock), PostgreSQL with "store" (``batch_repo.lock_claims``).
        self.serial = store.sqlite or claim_lock == "store"
        if store.sqlite and claim_lock != "store":
            log.warning("placement.claim_lock = %r has no effect on SQLite (one writer at a time)", claim_lock)
        self.cache = cache
        self.candidates = max(1, candidates)
        self.retries = max(1, retries)
        self.metrics = metrics
        self.clock = clock
        self._serial = FifoLock()

    def _avoid(self, s: Session, aff: Affinity) -> tuple[frozenset[str], frozenset[str]]:
        hosts, racks = vm_repo.group_members(session=s, group=aff.group, ignore=aff.ignore)
        return (hosts, racks) if aff.scope == "rack" else (hosts, frozenset())

    def _avoid_now(self, aff: Affinity) -> tuple[frozenset[str], frozenset[str]]:
        if not aff.group:
            return frozenset(), frozenset()
        with self.store.read() as s:
            return self._avoid(s, aff)

    def preview(self, want: VmWant, aff: Affinity, *, exclude: frozenset[str] = frozenset(),
                limit: int | None = None) -> FitResult:
        """The dry run: every host examined, every rejection explained (a full scan)."""
        views = self.cache.views(self.store, now=self.clock())
        avoid_h, avoid_r = self._avoid_now(aff)
        t = time.perf_counter()
        want = self.cache.hint(want)  # the order a claim would walk in (not counted as demand)
        res = fit_vm([v for v in views if v.res.name not in exclude], want, avoid_hosts=avoid_h,
                     avoid_racks=avoid_r, limit=limit or self.candidates, explain=True)
        if self.metrics:
            self.metrics.fit_seconds.observe(time.perf_counter() - t)
        return res

    def claim(self, want: VmWant, aff: Affinity, write_vm: Callable[[Session, str, Allocation], Vm], *,
              exclude: frozenset[str] = frozenset()) -> Vm:
        """Claim resources for ``want`` and let ``write_vm(session, host, alloc)`` record the
        VM in the same transaction. Raises NoValidHost or ConcurrentUpdate."""
        with self._serial:
            return self._claim(self._hinted(want), aff, write_vm, exclude)

    def claim_many(self, jobs: list[ClaimJob],
                   before: Callable[[Session, list[ClaimJob]], None] | None = None,
                   more: Callable[[], list[ClaimJob]] | None = None) -> None:
        """Claim every job in one write transaction (see the module docstring). Each job
        ends with ``vm``, ``error`` (NoValidHost, ConcurrentUpdate, ...) or ``done``.
        If the batch transaction itself fails, the index is reloaded and each unsettled
        job is claimed alone, as ``claim`` would. ``more()``: jobs that arrived while
        the batch waited for the writer lock, appended to ``jobs`` (the caller's list)
        and claimed in the same transaction."""
        with self._serial:
            t0 = time.perf_counter()
            for j in jobs:  # each request counts once into the demand the hint weighs
                if not j.settled:
                    j.want = self._hinted(j.want)
            touched: dict[str, tuple[Any, Usage, int]] = {}
            try:
                self._batch(jobs, before, touched, more)
            except Exception as e:  # noqa: BLE001 - the batch rolled back: redo one by one
                log.warning("claim batch of %d rolled back (%s: %s); claiming one by one",
                            len(jobs), type(e).__name__, e)
                self.cache.reload(self.store, list(touched), now=self.clock())
                for j in jobs:
                    j.vm = None if j.done is None else j.vm
                    j.error = None
                for j in jobs:
                    if j.done is None:
                        self._claim_alone(j)
                return
            for j in jobs:  # anti-affinity requests: alone, after the batch
                if not j.settled:
                    self._claim_alone(j)
            self.cache.freeze_churn()
            if self.metrics:
                self.metrics.claim_batch.observe(len(jobs))
                dt = time.perf_counter() - t0
                for j in jobs:
                    if j.vm is not None:
                        self.metrics.claim_seconds.observe(dt)

    def _hinted(self, want: VmWant) -> VmWant:
        """``want`` counted into the recent demand and hinted (``FleetIndex.hint``)."""
        got = self.cache.hint(want, note=True)
        if got.keep_1g and not want.keep_1g and self.metrics:
            self.metrics.keep_1g.inc()
        return got

    def _claim_alone(self, j: ClaimJob) -> None:
        try:
            j.vm = self._claim(j.want, j.aff, j.write_vm, j.exclude)
        except Exception as e:  # noqa: BLE001 - handed to the request
            j.error = e

    def _batch(self, jobs: list[ClaimJob], before: Callable[[Session, list[ClaimJob]], None] | None,
               touched: dict[str, tuple[Any, Usage, int]], more: Callable[[], list[ClaimJob]] | None) -> None:
        now = self.clock()
        read_gen: dict[str, int] = {}  # generation as this transaction read each host
        # One claim at a time (``serial``): the first walk of each job runs before the
        # claim lock, on the index as it is: the lock is what replicas queue on (2 replicas
        # on SQLite at 500/s wait 1.6 ms per VM for it), and walks are a quarter of the
        # CPU time it is held (0.26 of 1.15 ms per VM). Inside, that answer is used only
        # if a walk would still give it (``HostCache.still_first`` over the hosts
        # re-indexed since: the feed's and this batch's own claims), else the job walks
        # again (a third to half of them do).
        # The change feed is read once per batch, in the batch's transaction (below).
        # An index not built yet is built here, outside the lock, on either store, and so
        # is the down check when it is due (never inside: ``HostCache.refresh``).
        if self.cache.cold or self.cache.down_due():
            self.cache.refresh(self.store, now=now)
        mark = self.cache.mark()
        # Only a walk's first candidate is ever reused (``still_first``): stop there.
        # With row locks (PostgreSQL, claim_lock "rows") every walk is inside: there is no
        # lock to keep short, and the pre-walk plus a re-walk cost more than the row locks
        # held a little longer (2 replicas, closed loop: 1,297/1,398 placed/s without the
        # pre-walk, 1,197/1,262 with it).
        first = {id(j): self._walk(j, frozenset(), limit=1) for j in jobs
                 if not (j.settled or j.aff.group)} if self.serial else {}
        with self.store.batch_write() as s:
            if self.serial:
                batch_repo.lock_claims(session=s)
            # Holding the claim lock (SQLite's writer lock, or PostgreSQL's advisory lock):
            # the feed read now gives the index every batch another replica committed
            # while this one waited, and no other claim can commit until this one does.
            # With row locks (claim_lock "rows"), the feed is read as ``index_refresh_ms``
            # says; its claims lock and re-read their rows anyway, and a fresh index only
            # means fewer lost candidates. Either way the feed is read in the batch's
            # transaction: in one of its own, the session, pool checkout and ping would cost
            # a sixth of the claim thread at 500 requests/s on PostgreSQL (batches of one
            # or two).
            self.cache.refresh(self.store, now=now, fresh=self.serial, session=s)
            # The requests that queued while this batch waited for the lock join it (they
            # walk in here): 2 replicas at 1,000 requests/s held SQLite's writer lock 89 %
            # of the time, 1.2 ms of it per batch whatever its size, so the fewer turns
            # the better, and a request that arrived during the wait is not left for the
            # turn after.
            for j in more() if more is not None else ():
                j.want = self._hinted(j.want)
                jobs.append(j)
            if before is not None:
                before(s, jobs)
            batch_repo.defer_inserts(session=s)
            for j in jobs:
                if j.settled or j.aff.group:
                    continue
                try:
                    j.vm = self._claim_in_batch(s, j, touched, read_gen, now, first.get(id(j)), mark)
                except (NoValidHost, ConcurrentUpdate) as e:
                    j.error = e
            # The writes, once per batch, each guarded by the generation read. Nothing
            # should have moved: SQLite's writer lock stops every other writer, PostgreSQL's
            # row locks every other claim on those rows, and its claim lock every other
            # claim at all; a release or cordon on PostgreSQL can still land between the
            # feed and here: the guard fails, and the batch is redone one claim at a time.
            moved = [(n, read_gen[n], g, u) for n, (_row, u, g) in touched.items() if g != read_gen[n]]
            matched, seq = batch_repo.write(session=s, bumps=moved, now=now)
            if matched != len(moved):
                raise RuntimeError("a host changed since this batch read it")  # rolls the batch back
        if seq is not None:  # SQLite's stamp, committed: it is this batch's alone
            self.cache.skip_own(seq)

    def _walk(self, j: ClaimJob, lost: frozenset[str], limit: int | None = None) -> tuple[FitResult, dict[str, int]]:
        return self.cache.walk(j.want, avoid_hosts=frozenset(), avoid_racks=frozenset(),
                               skip=j.exclude | lost, limit=limit or self.candidates)

    def _claim_in_batch(self, s: Session, j: ClaimJob, touched: dict[str, tuple[Any, Usage, int]],
                        read_gen: dict[str, int], now: float,
                        first: tuple[FitResult, dict[str, int]] | None, mark: int) -> Vm:
        """``first``: the job's walk made before the batch took the writer lock, at ``mark``."""
        lost: set[str] = set()
        for round_ in range(self.retries):
            ok = False
            if round_ == 0 and first is not None:
                res, counts = first
                ok, cand = self.cache.still_first(j.want, res.candidates[0] if res.candidates else None,
                                                  mark, j.exclude)
                if ok:  # only the first candidate is known to be still the best
                    res = FitResult((cand,) if cand else (), res.rejections, res.examined)
            if not ok:
                res, counts = self._walk(j, frozenset(lost))
            if not res.candidates:
                if lost:
                    break
                self._count("no_valid_host", counts)
                raise NoValidHost(f"no host fits: {summary(counts)}", extra={"rejections": counts})
            for cand in res.candidates:
                if cand.host in touched:
                    row, usage, gen = touched[cand.host]  # held since this batch took it
                elif self.serial and (row := self.cache.row(cand.host)) is not None:
                    # This batch holds the claim lock and read the change feed after
                    # taking it, so the index *is* the database for this host; the
                    # generation guard of the batch's final UPDATE still checks it.
                    usage, gen = row.usage, row.generation
                    read_gen[row.name] = gen
                else:
                    row = host_repo.claim_row(session=s, name=cand.host, lock=True, skip_locked=True)
                    if row is None:  # another replica's batch holds it: next candidate
                        lost.add(cand.host)
                        continue
                    usage, gen = Usage.from_dict(row.usage), row.generation
                    read_gen[row.name] = gen
                if self._state(row, now) != HostState.ACTIVE:
                    lost.add(cand.host)
                    continue
                alloc = self._allocation_on(s, row, usage, cand, j.want)
                if alloc is None:
                    touched.setdefault(cand.host, (row, usage, gen))
                    self._teach(row, usage, gen, now)
                    lost.add(cand.host)
                    continue
                new = usage.plus(alloc)
                vm = j.write_vm(s, row.name, alloc)  # rows collected, written at the batch's end
                touched[row.name] = (row, new, gen + 1)
                self._teach(row, new, gen + 1, now)
                if self.metrics:
                    self.metrics.placements.labels("claimed").inc()
                    self.metrics.claim_conflicts.inc(len(lost))
                return vm
        if self.metrics:
            self.metrics.placements.labels("conflict").inc()
            self.metrics.claim_conflicts.inc(len(lost))
        raise ConcurrentUpdate(f"lost {len(lost)} claim races in {self.retries} rounds; retry the request")

    def _state(self, row: Any, now: float) -> str:
        """A database row's state from its heartbeat; a row from the index (``HostCache.row``)
        carries the index's own."""
        got = getattr(row, "state", None)
        if got is not None:
            return got
        return host_repo.effective_state(row, now=now, heartbeat_timeout_s=self.cache.timeout,
                                                pulse=self.cache.pulse)

    def _allocation_on(self, s: Session, row: Any, usage: Usage, cand: Candidate, want: VmWant) -> Allocation | None:
        """The candidate's allocation if it still fits the host's fresh ``usage``, else a
        re-fit of that host (the index was stale), else None."""
        res = self.cache.res(s, row)
        if not check_allocation(res, usage, cand.alloc):
            return cand.alloc
        alloc = fit_host(HostView(res, usage), want)
        return alloc if isinstance(alloc, Allocation) else None

    def _teach(self, row: Any, usage: Usage, generation: int, now: float) -> None:
        self.cache.learn(row.name, generation=generation, layout_rev=row.layout_rev, usage=usage,
                         admin_state=row.admin_state, last_heartbeat=row.last_heartbeat, now=now)

    def _claim(self, want: VmWant, aff: Affinity, write_vm: Callable[[Session, str, Allocation], Vm],
               exclude: frozenset[str]) -> Vm:
        t0 = time.perf_counter()
        lost = 0
        for _round in range(self.retries):
            self.cache.refresh(self.store, now=self.clock())
            avoid_h, avoid_r = self._avoid_now(aff)
            t = time.perf_counter()
            res, counts = self.cache.walk(want, avoid_hosts=avoid_h, avoid_racks=avoid_r, skip=exclude,
                                          limit=self.candidates)
            if self.metrics:
                self.metrics.fit_seconds.observe(time.perf_counter() - t)
            if not res.candidates:
                self._count("no_valid_host", counts)
                raise NoValidHost(f"no host fits: {summary(counts)}", extra={"rejections": counts})
            for cand in res.candidates:
                try:
                    vm = self._claim_on(cand, want, aff, write_vm)
                except _Lost:
                    lost += 1
                    if self.metrics:
                        self.metrics.claim_conflicts.inc()
                    continue
                if self.metrics:
                    self.metrics.placements.labels("claimed").inc()
                    self.metrics.claim_seconds.observe(time.perf_counter() - t0)
                return vm
        if self.metrics:
            self.metrics.placements.labels("conflict").inc()
        raise ConcurrentUpdate(f"lost {lost} claim races in {self.retries} rounds; retry the request")

    def _claim_on(self, cand: Candidate, want: VmWant, aff: Affinity,
                  write_vm: Callable[[Session, str, Allocation], Vm]) -> Vm:
        """One short write transaction: lock/read the host row (not its layout), re-check
        (or re-fit this host when the index was stale), bump the generation, record the VM.
        Whatever fresh state was read is taught to the index, won or lost."""
        now = self.clock()
        seen: tuple[Any, Usage, int] | None = None  # (row, usage, generation after)
        try:
            with self.store.write() as s:
                if self.serial:
                    batch_repo.lock_claims(session=s)
                if aff.group and not self.serial:
                    # Serialise members of one group (the claim lock already does).
                    s.execute(text("SELECT pg_advisory_xact_lock(hashtext(:g))"), {"g": aff.group})
                row = host_repo.claim_row(session=s, name=cand.host, lock=True)
                usage = Usage.from_dict(row.usage)
                seen = (row, usage, row.generation)
                if host_repo.effective_state(row, now=now, heartbeat_timeout_s=self.cache.timeout,
                                             pulse=self.cache.pulse) != HostState.ACTIVE:
                    raise _Lost()
                if aff.group:
                    avoid_h, avoid_r = self._avoid(s, aff)
                    if row.name in avoid_h or (row.rack and row.rack in avoid_r):
                        raise _Lost()
                alloc = self._allocation_on(s, row, usage, cand, want)
                if alloc is None:
                    raise _Lost()
                new = usage.plus(alloc)
                if not host_repo.bump_usage(session=s, name=row.name, seen_generation=row.generation,
                                            usage=new, now=now):
                    seen = None  # someone else moved it: the feed will tell
                    raise _Lost()
                vm = write_vm(s, row.name, alloc)
            seen = (row, new, row.generation + 1)  # committed
            return vm
        finally:
            if seen is not None:
                self._teach(*seen, now)

    def release(self, s: Session, vm: Vm) -> None:
        """Give back ``vm``'s allocation inside the caller's write transaction."""
        if not vm.host or not vm.allocation:
            return
        self.release_on(s, vm.host, Allocation.from_dict(vm.allocation), vm.id)
        vm.allocation = None

    def release_on(self, s: Session, host: str, alloc: Allocation, what: str,
                   then: Allocation | None = None) -> None:
        """Give back ``alloc`` on ``host`` (and hold ``then`` instead, when given: an
        allocation hostd changed) inside the caller's write transaction."""
        for _ in range(self.retries):
            h = host_repo.get_host(session=s, name=host, lock=True)
            usage = Usage.from_dict(h.usage).minus(alloc)
            if then is not None:
                usage = usage.plus(then)
            if host_repo.bump_usage(session=s, name=h.name, seen_generation=h.generation, usage=usage,
                                    now=self.clock()):
                return
            s.expire(h)
        raise ConcurrentUpdate(f"could not release {what} on {host}")

    def _count(self, outcome: str, counts: dict[str, int]) -> None:
        if not self.metrics:
            return
        self.metrics.placements.labels(outcome).inc()
        for r, n in counts.items():
            self.metrics.rejections.labels(r).inc(n)


def summary(counts: dict[str, int]) -> str:
    if not counts:
        return "no hosts"
    return ", ".join(f"{n} host(s) short of {r}" for r, n in counts.items())
