"""Scheduler bench, one command:  .venv/bin/python bench/scheduler_fit.py [--hosts 1000]

1. fit latency at N hosts (mixed shapes from tools/dev/host_shapes.py, randomly half full):
   the scheduler's walk (hosts in score order, stop after `candidates` fits) against the
   named baseline "full-scan" (fit every host, then rank: what a filter-then-weigh
   scheduler without an index does). Same hosts, same requests, same answers (checked).
2. claims/s through the real claim path (fit on the in-memory index + one write
   transaction with the host-generation check) on SQLite, and on PostgreSQL when
   --pg URL is given (an empty database).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time

from tools.dev.host_shapes import SHAPES, make_layout
from scheduler.fit import HostView, VmWant, fit_host, fit_vm
from scheduler.resources import Allocation, host_from_layout

WANTS = [VmWant(2, 4096), VmWant(4, 8192), VmWant(8, 16384), VmWant(1, 2048), VmWant(16, 32768)]


def fleet(n: int, seed: int = 7) -> list[HostView]:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        layout, sib = make_layout(SHAPES[i % len(SHAPES)])
        h = HostView(host_from_layout(f"h{i:05d}", layout, siblings=sib, rack=f"r{i // 40}"))
        for _ in range(rnd.randint(0, 6)):
            a = fit_host(h, rnd.choice(WANTS))
            if isinstance(a, Allocation):
                h = HostView(h.res, h.usage.plus(a))
        out.append(h)
    return out


def _time(fn, reps: int) -> list[float]:  # type: ignore[no-untyped-def]
    out = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def bench_fit(n: int, reps: int) -> None:
    hosts = fleet(n)
    ours, base = [], []
    for w in WANTS:
        a = fit_vm(hosts, w, limit=3)
        b = fit_vm(hosts, w, limit=3, explain=True)
        assert a.candidates == b.candidates, "the walk must choose what the full scan chooses"
        ours += _time(lambda: fit_vm(hosts, w, limit=3), reps)
        base += _time(lambda: fit_vm(hosts, w, limit=3, explain=True), max(3, reps // 10))
    p50o, p50b = statistics.median(ours), statistics.median(base)
    p99o = sorted(ours)[int(len(ours) * 0.99) - 1]
    print(f"fit @ {n} hosts: scheduler walk p50 {p50o * 1e3:.2f} ms p99 {p99o * 1e3:.2f} ms | "
          f"baseline full-scan p50 {p50b * 1e3:.2f} ms | ratio full-scan/walk = {p50b / p50o:.1f}x")


def bench_claims(url: str, label: str, n_hosts: int, n_claims: int) -> float:
    import json

    from scheduler.db.engine import Store
    from scheduler.db.migrate import upgrade
    from scheduler.db.models import Vm
    from scheduler.repo.hosts import upsert_host
    from scheduler.service.claims import Affinity, Placer
    from scheduler.service.hostcache import HostCache
    store = Store.from_url(url)
    upgrade(store.engine)
    now = time.time()
    with store.write() as s:
        for i in range(n_hosts):
            layout, sib = make_layout(SHAPES[i % len(SHAPES)])
            upsert_host(session=s, name=f"h{i:05d}", address=f"h{i}:7443", rack="", labels={},
                        layout=json.loads(layout.to_json()), siblings={str(k): list(v) for k, v in sib.items()},
                        pf_min_rate={}, disk_classes={}, now=now)
    placer = Placer(store=store, cache=HostCache(heartbeat_timeout_s=1e9), candidates=3, retries=16)
    rnd = random.Random(3)
    lat = []
    for i in range(n_claims):
        def write(s, host, alloc, i=i):  # type: ignore[no-untyped-def]
            vm = Vm(id=f"{i:036d}", tenant="b", name=f"v{i}", idempotency_key=str(i), request_hash="",
                    request={}, host=host, allocation=alloc.to_dict(), status="pending", reason="",
                    hostd_vm_id="", affinity_group="", attempts=0, created=now, updated=now)
            s.add(vm)
            return vm
        t = time.perf_counter()
        placer.claim(rnd.choice(WANTS), Affinity(), write)
        lat.append(time.perf_counter() - t)
    store.dispose()
    rate = n_claims / sum(lat)
    print(f"claims on {label} @ {n_hosts} hosts: {rate:.0f}/s, p50 {statistics.median(lat) * 1e3:.2f} ms, "
          f"p99 {sorted(lat)[int(len(lat) * 0.99) - 1] * 1e3:.2f} ms (one client)")
    return rate


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=1000)
    p.add_argument("--reps", type=int, default=40)
    p.add_argument("--claims", type=int, default=500)
    p.add_argument("--pg", help="PostgreSQL URL of an empty database to compare with SQLite")
    a = p.parse_args()
    bench_fit(a.hosts, a.reps)
    with tempfile.TemporaryDirectory() as d:
        lite = bench_claims(f"sqlite:///{d}/bench.db", "SQLite", a.hosts, a.claims)
    if a.pg:
        pg = bench_claims(a.pg, "PostgreSQL", a.hosts, a.claims)
        print(f"ratio SQLite/PostgreSQL claims/s = {lite / pg:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
