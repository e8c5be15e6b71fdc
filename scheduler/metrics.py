"""Prometheus metrics on the app's own registry (no global state)."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, Metric


class Tally:
    """A counter without labels kept as a plain int, for a caller that already holds a
    lock of its own around every ``inc`` (a heartbeat's record): exported as a counter,
    as ``Counter`` would (the ``_total`` sample; no ``_created``). ``Counter.inc`` takes
    its own lock and checks its argument: a lock and a few calls more on every beat."""

    def __init__(self, name: str, documentation: str, *, registry: CollectorRegistry):
        self.name = name.removesuffix("_total")
        self.documentation = documentation
        self.value = 0
        registry.register(self)

    def inc(self, amount: int = 1) -> None:
        """Not atomic: the caller serialises its calls."""
        self.value += amount

    def describe(self) -> list[Metric]:
        return [CounterMetricFamily(self.name, self.documentation)]

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(self.name, self.documentation, value=self.value)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.placements = Counter("hyb_sched_placements_total", "Placement attempts by outcome",
                                  ["outcome"], registry=r)
        self.rejections = Counter("hyb_sched_rejections_total", "Hosts rejected, by short resource",
                                  ["resource"], registry=r)
        self.claim_conflicts = Counter("hyb_sched_claim_conflicts_total",
                                       "Candidate hosts a claim lost before it claimed or gave up (held by another replica's "
                                       "claim, or changed so that the VM no longer fits)", registry=r)
        self.keep_1g = Counter("hyb_sched_keep_1g_total",
                               "2 MiB requests that walked nodes with free 1 GiB pages last (demand hint)",
                               registry=r)
        self.fit_seconds = Histogram("hyb_sched_fit_seconds", "Time to rank hosts for one request",
                                     registry=r, buckets=(.0005, .001, .0025, .005, .01, .025, .05, .1, .5))
        self.claim_seconds = Histogram("hyb_sched_claim_seconds", "Fit + claim transaction(s)",
                                       registry=r, buckets=(.001, .0025, .005, .01, .02, .05, .1, .25, 1))
        self.claim_batch = Histogram("hyb_sched_claim_batch_size", "Requests claimed per write transaction",
                                     registry=r, buckets=(1, 2, 4, 8, 16, 32, 64))
        self.sqlite_checkpoint = Histogram("hyb_sched_sqlite_checkpoint_seconds",
                                           "SQLite WAL checkpoints that copied pages, run beside the writers "
                                           "(their fsync included): a slow disk shows here",
                                           registry=r, buckets=(.001, .01, .05, .1, .25, .5, 1, 2.5, 10))
        self.register_batch = Histogram("hyb_sched_register_batch_size",
                                        "Host registrations written per write transaction",
                                        registry=r, buckets=(1, 2, 4, 8, 16, 32, 64))
        self.dispatch = Counter("hyb_sched_dispatch_total", "hostd CreateVM calls by outcome",
                                ["outcome"], registry=r)
        self.migrations = Counter("hyb_sched_migrations_total", "Live moves of VMs: started, then done "
                                  "(it runs on the target) or failed (undone: it runs on the source)",
                                  ["result"], registry=r)
        # hostd counts libvirt's job time and downtime (hostd_migration_seconds,
        # hostd_migration_downtime_seconds); this is the whole move as the operator waits
        # for it: asked, target prepared, job, completed on the target (or undone)
        self.migration_seconds = Histogram("hyb_sched_migration_seconds", "Live moves from asked to settled, "
                                           "by result (done, failed)", ["result"], registry=r,
                                           buckets=(1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800))
        self.reconcile_repairs = Counter("hyb_sched_reconcile_repairs_total",
                                         "Drift repaired by reconcile, by kind", ["kind"], registry=r)
        self.liveness_rows = Counter("hyb_sched_liveness_rows_written_total",
                                     "Liveness rows written by the heartbeat flusher: hosts' last_heartbeat "
                                     "and this replica's period rows (host_beats)", registry=r)
        self.lag = Gauge("hyb_sched_lag_seconds", "How late this replica ran its own work, the worst of the "
                         "last 30 s: the event loop's timer, the heartbeat flush", ["of"], registry=r)
        self.lagging = Gauge("hyb_sched_lagging", "1 while this replica lags past [liveness] lag_bound_s "
                             "(it marks no host down and is not ready)", registry=r)
        self.heartbeats = Tally("hyb_sched_heartbeats_total", "Heartbeats taken (answered 200, or counted "
                                "and answered 503 while shedding)", registry=r)
        self.shed = Counter("hyb_sched_shed_total", "Requests answered 503 hyb.scheduler.overloaded with "
                            "Retry-After (load shedding), by kind: beat, claim, register", ["kind"], registry=r)
        self.hosts = Gauge("hyb_sched_hosts", "Hosts by state", ["state"], registry=r)
        self.vms = Gauge("hyb_sched_vms", "VMs by status", ["status"], registry=r)
        self.http = Counter("hyb_sched_http_requests_total", "HTTP requests", ["method", "route", "status"],
                            registry=r)
        self.gc_pauses = GcPauses(registry=r)


class GcPauses:
    """The cyclic GC's stops of this process, by generation (``gc.callbacks``): every
    thread waits while one runs, so a long one is a stall of the event loop, of the
    beats and the claims alike, that no request's own timing explains.
    ``prometheus_client``'s ``python_gc_*`` count collections, not their time.
    ``install`` while the app serves, ``remove`` when it stops: one process may hold
    several apps one after the other (the tests)."""

    BUCKETS = (.0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1)

    def __init__(self, *, registry: CollectorRegistry):
        self.seconds = Histogram("hyb_sched_gc_pause_seconds", "Cyclic garbage collections of this replica's "
                                 "process by generation (0 young, 2 full), each a stop of every thread",
                                 ["generation"], registry=registry, buckets=self.BUCKETS)
        self._by_gen = [self.seconds.labels(str(g)) for g in range(3)]
        self._began = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        # collections never overlap (the GC holds the GIL and refuses to re-enter)
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self._by_gen[info["generation"]].observe(time.perf_counter() - self._began)

    def install(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def remove(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)
