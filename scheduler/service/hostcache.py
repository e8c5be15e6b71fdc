"""The placement index of one scheduler instance, kept fresh from the database.

The DB stays the truth (a claim re-checks the host row inside its transaction); the
index only has to be fresh enough that claims rarely re-fit. Three ways in:

- ``learn()``: this instance's own claims and releases, applied right after commit;
- incremental refresh before a placement (at most every ``refresh_interval_s``): one
  indexed query for hosts whose change stamp ``seq`` is at or after the feed position
  of the previous read (``repo.hosts.feed``) — O(changed hosts), not O(fleet);
- every ``down_check_s``, with a feed read: the hosts silent for longer than the
  heartbeat timeout. With the replicas' shared liveness (``pulse``) from memory
  (``survey``: each host's recorded heartbeat as the feed and the full pass read it, and
  the pulse's beats; the liveness check judges from the same); written through, the rows
  are the liveness (``repo.hosts.quiet``, indexed). Heartbeats do not stamp ``seq`` (that
  would make every heartbeat a feed event); a host that comes back stamps ``seq`` with its
  heartbeat, and so do a mark down and its clearing;
- a full pass every ``full_refresh_s`` (and on first use): every host's generation,
  admin state and heartbeat in one narrow query, usage and layouts re-read only where
  they moved, hosts deleted from the table dropped. Nothing the scheduler does deletes
  a host, so this is the safety net (every 5 minutes by default). It is rare because a
  pass costs 125-190 ms of CPU at 10,000 hosts: every 10 s, it would be the open-loop
  p99's largest single cause (scheduler/README.md).
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from types import SimpleNamespace
from typing import Any

from sqlalchemy.orm import Session

from api.states import AdminState, HostState
from scheduler.db.engine import Store
from scheduler.db.models import Host
from scheduler.liveness_rule import Survey
from scheduler.fit import Candidate, FitResult, HostView, Rejection, VmWant, fit_host, need_of, order_key
from scheduler.osthread import name_this_thread
from scheduler.repo import hosts as host_repo
from scheduler.resources import HostRes, Usage
from scheduler.service.index import FleetIndex
from scheduler.service.pulse import Pulse

log = logging.getLogger(__name__)


class HostCache:
    def __init__(self, *, heartbeat_timeout_s: float, refresh_interval_s: float = 0.0,
                 full_refresh_s: float | None = None, down_check_s: float | None = None,
                 monotonic: Callable[[], float] = time.monotonic, pulse: Pulse | None = None):
        self.timeout = heartbeat_timeout_s
        # The replicas' shared liveness: a host's last beat is the newer of its row's
        # ``last_heartbeat`` (written rarely) and the pulse's (None: the row's alone).
        self.pulse = pulse
        self.refresh_interval_s = refresh_interval_s
        self.full_refresh_s = full_refresh_s if full_refresh_s is not None else 300.0
        self.down_check_s = down_check_s if down_check_s is not None else min(10.0, heartbeat_timeout_s / 4)
        self.monotonic = monotonic
        self.index = FleetIndex()
        self._lock = threading.Lock()  # the index and the maps below
        self._refreshing = threading.Lock()  # one refresher at a time; others use the index as is
        self._res: dict[str, tuple[int, HostRes]] = {}
        self._admin: dict[str, str] = {}  # name -> admin_state
        self._owner: dict[str, str] = {}  # name -> the principal that registered it (heartbeats check it)
        self._down: set[str] = set()  # silent for longer than the timeout, as last read
        # What a liveness pass judges from, with no database read (``survey``): each host's
        # recorded ``last_heartbeat`` (a floor under the pulse's), rack and ``down_since`` as
        # last read from its row (the full pass, the change feed: a mark stamps ``seq``).
        self._floor: dict[str, float] = {}
        self._rack: dict[str, str] = {}
        self._marked: dict[str, float] = {}  # name -> down_since, the hosts marked down
        self._position: int | None = None  # feed position; None = no full pass yet
        self._last_full = self._last_inc = self._last_down = float("-inf")
        self._churn = 0  # index changes since the last freeze
        self._bg: threading.Thread | None = None  # the background full pass
        # Names of the hosts re-indexed or removed, in order (``mark``/``still_first``):
        # position ``_log_base + i`` is ``_log[i]``; trimmed when long.
        self._log: list[str] = []
        self._log_base = 0

    # ------------------------------------------------------------ refresh

    def refresh(self, store: Store, *, now: float, full: bool = False, fresh: bool = False,
                session: Session | None = None) -> None:
        """``fresh``: read the change feed now, whatever ``refresh_interval_s`` says (a claim
        batch that just took SQLite's writer lock: nobody else can write until it commits,
        so after this read its index is exact and its claims cannot lose a race).
        ``session``: read the feed in the caller's transaction instead of one of its own
        (SQLite: a write transaction is a snapshot anyway; PostgreSQL: the feed is one
        statement, ``repo.hosts.feed``)."""
        first = self._position is None
        if not self._refreshing.acquire(blocking=first or full or fresh):
            return  # another thread is refreshing right now: good enough
        try:
            mono = self.monotonic()
            if full or self._position is None:
                self._full(store, now=now)
                self._last_full = self._last_inc = mono
                return
            if mono - self._last_full >= self.full_refresh_s:
                self._last_full = mono
                self._full_in_background(store, now=now)
            # The down check (the replicas' liveness rows read, the fleet walked from
            # memory: 2-10 ms at 10,000 hosts) never runs in a claim batch's transaction
            # (``session``): there it held the claim lock every replica queues on, once
            # every ``down_check_s``. The refresher thread, the liveness check and the
            # claims outside a batch run it; due, it reads the feed with it.
            quiet = session is None and self.down_due()
            if fresh or quiet or mono - self._last_inc >= self.refresh_interval_s:
                self._incremental(store, now=now, session=session, quiet=quiet)
                self._last_inc = mono
                if quiet:
                    self._last_down = mono
        finally:
            self._refreshing.release()

    @property
    def cold(self) -> bool:
        """No full pass yet: the next ``refresh`` reads the whole fleet."""
        return self._position is None

    def down_due(self) -> bool:
        """The next ``refresh`` outside a claim batch would run the down check."""
        return self.monotonic() - self._last_down >= self.down_check_s

    def _full_in_background(self, store: Store, *, now: float) -> None:
        """The periodic full pass (10,000 rows) runs on its own thread, off the claim path:
        inline it would stop the claim thread for tens of milliseconds every pass, half
        the open-loop p99 at 500 requests/s (176 ms with it inline, 80 ms without). It takes
        the index lock in chunks, and what it reads may be older than what the change
        feed already applied: ``_apply`` keeps the newer generation, and the feed position
        only moves back (so the feed re-reads, never skips)."""
        if self._bg is not None and self._bg.is_alive():
            return

        def run() -> None:
            name_this_thread("hyb-index-full")
            try:
                self._full(store, now=now)
            except Exception:  # noqa: BLE001 - the next pass tries again; claims re-check rows
                log.exception("background index full pass failed")
        self._bg = threading.Thread(target=run, name="index-full-pass", daemon=True)
        self._bg.start()

    def freeze_churn(self) -> None:
        """Called after a claim batch, outside its transaction. Claims replace index
        entries with new objects (views, usages, keys) that the cyclic GC keeps walking:
        in a 40 s run at 500 claims/s (``gc.callbacks`` probe) one full collection took
        86 ms, in the middle of a claim batch holding SQLite's writer lock, and young
        collections 6-10 ms every few seconds (p99.9 94 ms). Every
        ``max(1000, hosts/10)`` index changes, the young generations are collected and
        everything alive is frozen (``gc.collect(1)`` + ``gc.freeze()``: a few ms), so
        no collection walks more than what changed since (same run: no collection above
        5 ms but one, p99.9 32 ms). Cyclic garbage that had already reached the old
        generation is frozen with the rest: tens of objects per freeze, collected at the
        heap's next refreeze (``scheduler/heap.py``, which also freezes what survives each
        full collection: the fleet's index as it grows)."""
        if self._churn < max(1000, len(self.index) // 10):
            return
        self._churn = 0
        gc.collect(1)
        gc.freeze()

    def _incremental(self, store: Store, *, now: float, session: Session | None = None,
                     quiet: bool = False) -> None:
        """The change feed since the last read; with ``quiet``, also which hosts are down.
        ``now`` is taken before the read: a host silent since ``now - timeout`` then was
        down at ``now`` (and one that heartbeats after that stamps the feed)."""
        assert self._position is not None
        silent: set[str] | None = None
        with (nullcontext(session) if session is not None else store.feed_read()) as s:
            position, rows = host_repo.feed(session=s, position=self._position)
            if rows:
                stale = {r.name for r in rows if self._res_stale(r.name, r.layout_rev)}
                self._load_res(s, list(stale))  # reads their owners too
                # A change that is not a claim (same generation: a registration, an admin
                # state, back from down) may be a new owner: read those hosts' owners. So
                # is a host the index does not hold yet: registered here, its resources are
                # already cached (the registration's answer), so ``_load_res`` skips it,
                # and without its owner every beat of it went to the database.
                entries = self.index.entries
                other = [r.name for r in rows if r.name not in stale
                         and ((e := entries.get(r.name)) is None or e.generation == r.generation)]
                owners = host_repo.owners(session=s, names=other) if other else {}
            down = host_repo.down_before(now=now, heartbeat_timeout_s=self.timeout)
            if quiet and self.pulse is not None:
                self.pulse.read(s)
            elif quiet:  # written through: the rows are the liveness (beats do not stamp seq)
                silent = {r.name for r in host_repo.quiet(session=s, before=down)}
        with self._lock:
            if rows:
                self._owner.update(owners)
            for r in rows:
                self._admin[r.name] = r.admin_state
                self._row_liveness(r.name, r.last_heartbeat, r.rack, r.down_since)
                self._apply(r.name, r.generation, r.layout_rev, r.usage, now=now, heartbeat=r.last_heartbeat)
        if quiet and self.pulse is not None:  # in memory: the rows' floors and the pulse
            silent = set(self._silent(down))
        with self._lock:
            if silent is not None and silent != self._down:
                for name in silent ^ self._down:
                    e = self.index.entries.get(name)
                    if name in silent:
                        self._down.add(name)
                    else:
                        self._down.discard(name)
                    if e is not None:
                        self._apply(name, e.generation, e.layout_rev, e.view.usage, now=now)
            self._position = position

    def _full(self, store: Store, *, now: float) -> None:
        entries = self.index.entries
        with self._lock:
            known = {n: e.generation for n, e in entries.items()}
            marked_before = dict(self._marked)
        with store.snapshot() as s:
            if self.pulse is not None:
                self.pulse.read(s)
            rows = host_repo.fleet_state(session=s)
            position = host_repo.feed_position(session=s)
            stale = [r.name for r in rows if known.get(r.name) != r.generation]
            usages = host_repo.usages(session=s, names=stale) if stale else {}
            self._load_res(s, [r.name for r in rows if self._res_stale(r.name, r.layout_rev)])
        names = {r.name for r in rows}
        with self._lock:
            for name in [n for n in known if n not in names]:  # deleted (not: added since the read)
                self.index.remove(name)
                self._logged(name)
                self._res.pop(name, None)
                self._admin.pop(name, None)
                self._owner.pop(name, None)
                self._down.discard(name)
                self._floor.pop(name, None)
                self._rack.pop(name, None)
                self._marked.pop(name, None)
        for i in range(0, len(rows), 500):  # chunks: walks get the lock in between
            with self._lock:
                for r in rows[i:i + 500]:
                    e = entries.get(r.name)
                    self._owner[r.name] = r.owner
                    # a mark learnt from the feed since this (older) read began stays
                    keep = r.down_since is None and r.name in self._marked and r.name not in marked_before
                    self._row_liveness(r.name, r.last_heartbeat, r.rack, None if keep else r.down_since, keep=keep)
                    if e is None or r.generation >= e.generation:  # never older state over newer
                        self._admin[r.name] = r.admin_state
                    if r.name in usages:
                        gen, u = usages[r.name]
                        self._apply(r.name, gen, r.layout_rev, u, now=now,
                                    heartbeat=r.last_heartbeat)
                    elif e is not None:  # usage unchanged; state or heartbeat may have
                        self._apply(r.name, e.generation, r.layout_rev, e.view.usage, now=now,
                                    heartbeat=r.last_heartbeat)
        with self._lock:
            self._position = position if self._position is None else min(self._position, position)
        log.debug("index full pass hosts=%d re-read=%d", len(rows), len(stale))

    def _row_liveness(self, name: str, heartbeat: float, rack: str, down_since: float | None, *,
                      keep: bool = False) -> None:
        """Caller holds the lock. A host row's liveness as read: its recorded heartbeat
        only moves forward (a full pass may read older rows than the feed did)."""
        if heartbeat is not None and heartbeat > self._floor.get(name, float("-inf")):
            self._floor[name] = heartbeat
        self._rack[name] = rack
        if keep:
            return
        if down_since is None:
            self._marked.pop(name, None)
        else:
            self._marked[name] = down_since

    def _silent(self, before: float) -> dict[str, float]:
        """name -> last beat (``Pulse.seen``) of the hosts silent since ``before``, from
        memory: the rows' floors as last read and the shared liveness."""
        with self._lock:
            floor = dict(self._floor)
        last = self.pulse.seen_all(floor) if self.pulse is not None else floor
        return {n: t for n, t in last.items() if t < before}

    def survey(self, *, before: float) -> Survey:
        """A liveness pass's input (``liveness_rule.Survey``) from memory, no database
        read: every host this index knows, its recorded heartbeat and mark as last read
        from the change feed or a full pass, its last beat as the shared liveness has it.
        Only with the pulse (written through, beats write the rows and stamp nothing)."""
        assert self.pulse is not None
        silent = self._silent(before)
        with self._lock:
            racks = dict(self._rack)
            marked = {n for n in silent if n in self._marked}
            recorded = {n: self._floor[n] for n in silent}
        return Survey(silent={n: racks.get(n, "") for n in silent}, marked=marked,
                      sizes=dict(Counter(racks.values())) if silent else {}, recorded=recorded, last=silent)

    def marked_down(self, names: dict[str, float]) -> None:
        """This replica marked ``names`` (name -> down_since) down: known before the feed says so."""
        with self._lock:
            self._marked.update(names)

    def _res_stale(self, name: str, rev: int) -> bool:
        got = self._res.get(name)
        return got is None or got[0] != rev

    def _load_res(self, s: Session, names: Sequence[str]) -> None:
        for name, owner, rev, r in host_repo.res_by_name(session=s, names=list(names)):
            with self._lock:
                self._res[name] = (rev, r)
                self._owner[name] = owner

    def _apply(self, name: str, generation: int, rev: int, usage: Usage | dict[str, Any], *, now: float,
               heartbeat: float | None = None) -> None:
        """Caller holds the lock. Re-index ``name`` unless nothing it depends on changed.
        ``usage``: a row's dict is parsed only if it is used (the feed brings back every
        host this replica's own claims changed: known already).
        ``heartbeat``: the host's as just read from its row (None: not read, the host
        stays as up or down as the cache had it)."""
        if heartbeat is not None:
            if host_repo.is_down(self._seen(name, heartbeat), now=now, heartbeat_timeout_s=self.timeout):
                self._down.add(name)
            else:
                self._down.discard(name)
        res = self._res.get(name)
        if res is None or res[0] != rev:
            return  # layout not loaded (deleted and re-added between reads): next pass
        state = HostState.DOWN if name in self._down else self._admin.get(name, AdminState.ACTIVE)
        e = self.index.entries.get(name)
        if e is not None:
            if generation < e.generation:
                return  # older than what we know (our own claim was learnt first)
            if (generation == e.generation and rev == e.layout_rev and state == e.view.state):
                return
        if not isinstance(usage, Usage):
            usage = Usage.from_dict(usage)
        self.index.put(HostView(res[1], usage, state == HostState.ACTIVE, state), generation=generation, layout_rev=rev)
        self._logged(name)

    def _seen(self, name: str, recorded: float) -> float:
        return recorded if self.pulse is None else self.pulse.seen(name, recorded)

    def is_down(self, name: str) -> bool:
        """Down as the index last judged it (the down check, every ``down_check_s``).
        Without the index lock: ``_down`` is only changed in place (add, discard, under the
        lock), and a set's membership test is one step under the GIL, so it answers as the
        set was before or after a change, as the lock would (a beat's record asks it)."""
        return name in self._down

    def skip_own(self, seq: int) -> None:
        """SQLite: a batch that read the feed under the writer lock and then committed
        stamp ``seq`` has learnt everything stamped ``seq`` already (nobody else could
        write in between): the next read starts after it instead of reading those hosts
        back (half of what a feed read returned with two replicas)."""
        with self._lock:
            if self._position == seq:
                self._position = seq + 1

    def _logged(self, name: str) -> None:
        self._churn += 1
        if len(self._log) >= 65536:
            self._log_base += len(self._log)
            self._log.clear()
        self._log.append(name)

    def mark(self) -> int:
        """A position in the change log, for ``still_first``."""
        with self._lock:
            return self._log_base + len(self._log)

    def still_first(self, want: VmWant, first: Candidate | None, mark: int,
                    skip: frozenset[str]) -> tuple[bool, Candidate | None]:
        """Would a walk now still answer ``first`` (None: nothing fits), given that a walk
        answered it at ``mark``? Only hosts re-indexed since can change the answer. When
        the candidate itself changed (typically this batch's previous claim on it), it is
        re-fitted: still first if it fits and comes no later in the walk's order than
        before (unchanged hosts all came after it). Then no other changed host may fit
        ahead of it. Returns (True, the candidate to use) or (False, None): walk again."""
        with self._lock:
            if mark < self._log_base:
                return False, None
            changed = set(self._log[mark - self._log_base:])
            need = need_of(want)
            if first is not None and first.host in changed:
                e = self.index.entries.get(first.host)
                if e is None:
                    return False, None
                score = order_key(e.view, want, need)
                got = fit_host(e.view, want)
                if isinstance(got, Rejection) or score > first.score:
                    return False, None
                first = Candidate(first.host, got, score)
            for name in changed - skip:
                if first is not None and name == first.host:
                    continue
                e = self.index.entries.get(name)
                if e is None or (first is not None and order_key(e.view, want, need) >= first.score):
                    continue
                if not isinstance(fit_host(e.view, want), Rejection):
                    return False, None
            return True, first

    def learn(self, name: str, *, generation: int, layout_rev: int, usage: Usage, admin_state: str,
              last_heartbeat: float | None, now: float) -> None:
        """What this instance just committed (claim or release) goes straight in.
        ``last_heartbeat`` None: the row came from this cache (``row``), not the database."""
        with self._lock:
            self._admin[name] = admin_state
            if last_heartbeat is not None and last_heartbeat > self._floor.get(name, float("-inf")):
                self._floor[name] = last_heartbeat
            self._apply(name, generation, layout_rev, usage, now=now, heartbeat=last_heartbeat)

    def row(self, name: str) -> Any | None:
        """The claim columns of ``name`` as the index has them (None: not indexed), shaped
        like ``repo.hosts.claim_row``'s row, with the index's ``state`` in place of the
        heartbeat (``last_heartbeat`` None)."""
        with self._lock:
            e = self.index.entries.get(name)
            admin = self._admin.get(name)
            if e is None or admin is None:
                return None
            return SimpleNamespace(name=name, generation=e.generation, usage=e.view.usage, layout_rev=e.layout_rev,
                                   admin_state=admin, last_heartbeat=None, rack=e.view.res.rack,
                                   state=HostState.DOWN if name in self._down else admin)

    def who(self, name: str) -> tuple[str, str, int] | None:
        """(owner, admin state, generation) of ``name`` as the index has them (None: not
        indexed): what a heartbeat checks and answers, with no database read."""
        with self._lock:
            e = self.index.entries.get(name)
            admin, owner = self._admin.get(name), self._owner.get(name)
            if e is None or admin is None or owner is None:
                return None
            return owner, admin, e.generation

    def reload(self, store: Store, names: Sequence[str], *, now: float) -> None:
        """Put ``names`` back as the database has them, even over newer generations this
        instance learnt (a claim batch that learnt as it went and then rolled back)."""
        from scheduler.errors import HostNotFound
        rows: dict[str, Any] = {}
        with store.read() as s:
            for n in names:
                try:
                    rows[n] = host_repo.claim_row(session=s, name=n, lock=False)
                except HostNotFound:
                    pass
        with self._lock:
            for name in names:
                self.index.remove(name)
                self._logged(name)
                r = rows.get(name)
                if r is not None:
                    self._admin[name] = r.admin_state
                    if r.last_heartbeat > self._floor.get(name, float("-inf")):
                        self._floor[name] = r.last_heartbeat
                    self._rack[name] = r.rack
                    self._apply(name, r.generation, r.layout_rev, Usage.from_dict(r.usage), now=now,
                                heartbeat=r.last_heartbeat)

    # ------------------------------------------------------------ queries

    def hint(self, want: VmWant, *, note: bool = False) -> VmWant:
        """``FleetIndex.hint``; ``note``: count ``want`` into the demand first (once per request)."""
        with self._lock:
            if note:
                self.index.note(want)
            return self.index.hint(want)

    def walk(self, want: VmWant, *, avoid_hosts: frozenset[str], avoid_racks: frozenset[str],
             skip: frozenset[str], limit: int) -> tuple[FitResult, dict[str, int]]:
        with self._lock:
            return self.index.walk(want, avoid_hosts=avoid_hosts, avoid_racks=avoid_racks, skip=skip, limit=limit)

    def views(self, store: Store, *, now: float) -> list[HostView]:
        """Every host as the index sees it (the dry run's full scan)."""
        self.refresh(store, now=now)
        with self._lock:
            return self.index.views()

    def res(self, session: Session, host: Host | Any, parsed: Any = None) -> HostRes:
        """The resources of ``host`` (a Host or a claim row with name + layout_rev);
        ``parsed``: the Host's layout already parsed (its registration's)."""
        with self._lock:
            got = self._res.get(host.name)
        if got and got[0] == host.layout_rev:
            return got[1]
        h = host if isinstance(host, Host) else host_repo.get_host(session=session, name=host.name)
        r = host_repo.host_res(h, parsed if isinstance(host, Host) else None)
        with self._lock:
            self._res[h.name] = (h.layout_rev, r)
        return r
