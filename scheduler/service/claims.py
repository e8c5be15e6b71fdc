"""Claim: fit on the in-memory index, then one write transaction per attempt that
re-reads the host row, re-checks the allocation against the fresh usage, and bumps the
host generation (``UPDATE ... WHERE generation = :seen``). A lost race (0 rows, or
the re-check fails) moves to the next candidate, then re-fits; bounded by
``claim_retries`` -> 409 ``hyb.concurrent_update``. Unlike Nova, the claim *is* the
placement decision: nothing is decided that is not also durably claimed.

Release is the mirror image: subtract the allocation, bump the generation."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from scheduler.db.engine import Store
from scheduler.db.models import Vm
from scheduler.errors import ConcurrentUpdate, NoValidHost
from scheduler.fit import Candidate, FitResult, HostView, VmWant, check_allocation, fit_host, fit_vm
from scheduler.metrics import Metrics
from scheduler.repo import hosts as host_repo
from scheduler.repo import vms as vm_repo
from scheduler.resources import Allocation, Usage
from scheduler.service.inventory import HostCache

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Affinity:
    group: str = ""
    scope: str = "host"  # "host" | "rack"


class _Lost(Exception):
    pass


class Placer:
    def __init__(self, *, store: Store, cache: HostCache, candidates: int, retries: int,
                 metrics: Metrics | None = None, clock: Callable[[], float] = time.time):
        self.store = store
        self.cache = cache
        self.candidates = max(1, candidates)
        self.retries = max(1, retries)
        self.metrics = metrics
        self.clock = clock

    def _avoid(self, s: Session, aff: Affinity) -> tuple[frozenset[str], frozenset[str]]:
        hosts, racks = vm_repo.group_members(session=s, group=aff.group)
        return (hosts, racks) if aff.scope == "rack" else (hosts, frozenset())

    def preview(self, want: VmWant, aff: Affinity, *, exclude: frozenset[str] = frozenset(),
                limit: int | None = None) -> FitResult:
        with self.store.read() as s:
            views = self.cache.views(s, now=self.clock())
            avoid_h, avoid_r = self._avoid(s, aff)
        t = time.perf_counter()
        res = fit_vm([v for v in views if v.res.name not in exclude], want, avoid_hosts=avoid_h,
                     avoid_racks=avoid_r, limit=limit or self.candidates, explain=True)
        if self.metrics:
            self.metrics.fit_seconds.observe(time.perf_counter() - t)
        return res

    def claim(self, want: VmWant, aff: Affinity, write_vm: Callable[[Session, str, Allocation], Vm], *,
              exclude: frozenset[str] = frozenset()) -> Vm:
        """Claim resources for ``want`` and let ``write_vm(session, host, alloc)`` record the
        VM in the same transaction. Raises NoValidHost or ConcurrentUpdate."""
        t0 = time.perf_counter()
        lost = 0
        for _round in range(self.retries):
            with self.store.read() as s:
                views = self.cache.views(s, now=self.clock())
                avoid_h, avoid_r = self._avoid(s, aff)
            t = time.perf_counter()
            res = fit_vm([v for v in views if v.res.name not in exclude], want, avoid_hosts=avoid_h,
                         avoid_racks=avoid_r, limit=self.candidates)
            if self.metrics:
                self.metrics.fit_seconds.observe(time.perf_counter() - t)
            if not res.candidates:
                full = fit_vm([v for v in views if v.res.name not in exclude], want, avoid_hosts=avoid_h,
                              avoid_racks=avoid_r, limit=1, explain=True)
                self._count("no_valid_host", full)
                raise NoValidHost(f"no host fits: {full.summary()}", extra={"rejections": full.counts})
            for cand in res.candidates:
                try:
                    vm = self._claim_on(cand, want, aff, write_vm)
                except _Lost:
                    lost += 1
                    if self.metrics:
                        self.metrics.claim_conflicts.inc()
                    continue
                if vm is not None:
                    if self.metrics:
                        self.metrics.placements.labels("claimed").inc()
                        self.metrics.claim_seconds.observe(time.perf_counter() - t0)
                    return vm
        if self.metrics:
            self.metrics.placements.labels("conflict").inc()
        raise ConcurrentUpdate(f"lost {lost} claim races in {self.retries} rounds; retry the request")

    def _claim_on(self, cand: Candidate, want: VmWant, aff: Affinity,
                  write_vm: Callable[[Session, str, Allocation], Vm]) -> Vm | None:
        now = self.clock()
        with self.store.write() as s:
            if aff.group and s.bind.dialect.name == "postgresql":  # type: ignore[union-attr]
                # Serialise members of one group (SQLite's BEGIN IMMEDIATE already does).
                s.execute(text("SELECT pg_advisory_xact_lock(hashtext(:g))"), {"g": aff.group})
            h = host_repo.get_host(session=s, name=cand.host)
            state = host_repo.effective_state(h, now=now, heartbeat_timeout_s=self.cache.timeout)
            if state != "active":
                raise _Lost()
            avoid_h, avoid_r = self._avoid(s, aff)
            if h.name in avoid_h or (h.rack and h.rack in avoid_r):
                raise _Lost()
            usage = Usage.from_dict(h.usage)
            res = self.cache.res(s, h)
            alloc: Allocation | Any = cand.alloc
            if check_allocation(res, usage, alloc):
                alloc = fit_host(HostView(res, usage), want)  # the index was stale: re-fit this host
                if not isinstance(alloc, Allocation):
                    raise _Lost()
            if not host_repo.bump_usage(session=s, name=h.name, seen_generation=h.generation,
                                        usage=usage.plus(alloc), now=now):
                raise _Lost()
            return write_vm(s, h.name, alloc)

    def release(self, s: Session, vm: Vm) -> None:
        """Give back ``vm``'s allocation inside the caller's write transaction."""
        if not vm.host or not vm.allocation:
            return
        alloc = Allocation.from_dict(vm.allocation)
        for _ in range(self.retries):
            h = host_repo.get_host(session=s, name=vm.host, lock=True)
            if host_repo.bump_usage(session=s, name=h.name, seen_generation=h.generation,
                                    usage=Usage.from_dict(h.usage).minus(alloc), now=self.clock()):
                vm.allocation = None
                return
            s.expire(h)
        raise ConcurrentUpdate(f"could not release {vm.id} on {vm.host}")

    def _count(self, outcome: str, res: FitResult) -> None:
        if not self.metrics:
            return
        self.metrics.placements.labels(outcome).inc()
        for r, n in res.counts.items():
            self.metrics.rejections.labels(r).inc(n)
