"""Packing quality bench, one command, in process (no HTTP, no database):

  .venv/bin/python bench/packing.py [--hosts 10000 --requests 20000] [--mixes storage,matched,matched-heavy]

The scheduler's own free-capacity index (scheduler/service/index.py, the walk every
replica runs before it claims) places the trace in order, one VM at a time, on the same
fleet and traces as bench/placement.py. The named baseline is offline first-fit
decreasing (FFD) on the same trace: it sees every request up front and places the
biggest first. Printed per mix:

  quality = VMs placed before the first capacity rejection / VMs FFD places
  ceiling = the same ratio for the first request whose class (or pair of classes) wants
            more than the whole empty fleet holds: no scheduler, online or not, gets past it
  total   = VMs placed by the end of the trace (we keep placing smaller VMs after a 507)
  no hint = quality of best fit on free CPUs alone, without the index's 1 GiB demand hint
            (FleetIndex.hint; scheduler/README.md), on the same trace

and which request was rejected first. The placement bench measures the same quality
through the API, with 32 concurrent clients and two replicas; this one isolates the
packing policy and runs in seconds, so a policy change can be judged on several traces.
"""

from __future__ import annotations

import argparse
import sys
import time

from scheduler.fit import HostView
from scheduler.resources import Allocation, HostRes
from scheduler.service.index import FleetIndex
from tools.dev.schedbench import (MIXES, Req, class_ceiling, describe, ffd_bound, fleet, host_res, overcommit,
                                trace)


def online(hosts: list[HostRes], reqs: list[Req], *, hint: bool = True) -> tuple[int, int, Req | None, list[str]]:
    """Place in trace order through the index (pack policy, best candidate each time).
    ``hint``: as the claim path does, count each request into the demand and walk with
    ``FleetIndex.hint``; without it, best fit on free CPUs alone. Returns (placed before
    the first rejection, placed in all, the first rejected request, every overcommit
    found in the final ledger)."""
    idx = FleetIndex()
    res_by_name = {r.name: r for r in hosts}
    for r in hosts:
        idx.put(HostView(r), generation=0, layout_rev=0)
    allocs: dict[str, list[Allocation]] = {}
    placed, first, first_req = 0, None, None
    for r in reqs:
        if hint:
            idx.note(r.want)
        res, _counts = idx.walk(idx.hint(r.want) if hint else r.want, limit=1)
        if not res.candidates:
            if first is None:
                first, first_req = placed, r
            continue
        c = res.candidates[0]
        e = idx.entries[c.host]
        idx.put(HostView(e.view.res, e.view.usage.plus(c.alloc)), generation=e.generation + 1, layout_rev=0)
        allocs.setdefault(c.host, []).append(c.alloc)
        placed += 1
    bad = overcommit(res_by_name, {n: e.view.usage for n, e in idx.entries.items()}, allocs)
    return (placed if first is None else first), placed, first_req, bad


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=10000)
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--mixes", default=",".join(MIXES), help=f"comma list of {', '.join(MIXES)}")
    a = p.parse_args()
    hosts = fleet(a.hosts)
    res = [host_res(*h) for h in hosts]  # once: 0.65 s at 10,000 hosts, and three runs per mix read it
    print(f"fleet: {a.hosts} hosts ({', '.join(sorted({h[1].name for h in hosts}))}); {a.requests} requests per mix; "
          "baseline: offline first-fit decreasing (FFD)\n")
    print(f"{'mix':<14} {'FFD':>6} {'ceiling':>8} {'ours':>6} {'total':>6} {'quality':>8} {'of ceiling':>10}  "
          f"{'ms/VM':>6} {'no hint':>8}  first rejection")
    bad_all: list[str] = []
    for mix in [m.strip() for m in a.mixes.split(",") if m.strip()]:
        if mix not in MIXES:
            p.error(f"--mixes: unknown mix {mix!r} (known: {', '.join(MIXES)})")
        reqs = trace(a.requests, mix=mix)
        ffd = ffd_bound(res, reqs)
        ceiling, _why = class_ceiling(hosts, reqs)
        t = time.perf_counter()
        before, total, first, bad = online(res, reqs)
        ms = (time.perf_counter() - t) * 1000 / len(reqs)
        plain, _total, _first, bad_plain = online(res, reqs, hint=False)
        bad_all += bad + bad_plain
        cap = min(ceiling, ffd) / ffd
        what = "none" if first is None else f"request {first.i}: {describe(first.want)}"
        print(f"{mix:<14} {ffd:>6} {cap:>8.3f} {before:>6} {total:>6} {before / ffd:>8.3f} "
              f"{before / ffd / cap:>10.3f}  {ms:>6.3f} {plain / ffd:>8.3f}  {what}", flush=True)
    if bad_all:
        print(f"OVERCOMMIT: {len(bad_all)} problem(s): " + "; ".join(bad_all[:5]))
        return 1
    print("overcommit: none (every host's ledger equals the sum of its allocations, nothing booked twice)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
