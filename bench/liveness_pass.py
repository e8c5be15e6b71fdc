#!/usr/bin/env python3
"""One liveness pass's cost: from memory (the placement index and the replicas' shared
beats, what a serving replica does) against from the host rows (the pass before issue
39, what a written-through scheduler still does): the named baseline.

    .venv/bin/python bench/liveness_pass.py [--hosts 10000]

A SQLite store in a temp dir, the scheduler app in process (no server: the pass is a
background thread's work), --hosts hosts inserted in one transaction, the index's full
pass, every host but 1 % beaten in the pulse 10 s before the pass (the rest silent 60
s), then ``LivenessWatch.survey`` five times each way: the median wall and CPU times, the
silent hosts each found (the same), and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scheduler.repo import hosts as host_repo  # noqa: E402
from tools.dev.sched_inproc import scheduler_client  # noqa: E402
from tools.dev.schedbench import fleet, register_body  # noqa: E402

T0 = 1_764_000_000.0


class Clock:
    t = T0

    def __call__(self) -> float:
        return self.t


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=10000)
    a = p.parse_args()
    clock = Clock()
    with tempfile.TemporaryDirectory(prefix="hyb-pass-") as d:
        with scheduler_client(f"sqlite:///{d}/p.db", {"adm": ["admin"]}, clock=clock,
                              stats={"heartbeat_flush_s": 30}, placement={"heartbeat_timeout_s": 25},
                              liveness={"check_s": 0, "grace_s": 1}) as api:
            st = api.app.state
            t = time.perf_counter()
            with st.store.write() as s:
                for h in fleet(a.hosts):
                    b = register_body(*h)
                    host_repo.upsert_host(session=s, name=b["name"], address=b["address"], rack=b["rack"],
                                          labels=b["labels"], layout=b["layout"], siblings=b["cpu_siblings"],
                                          pf_min_rate=b.get("pf_min_rate", {}), disk_classes=b.get("disk_classes", {}),
                                          now=T0)
            print(f"{a.hosts} hosts inserted in {time.perf_counter() - t:.1f} s", file=sys.stderr)
            cache, watch = st.hosts.cache, st.liveness
            cache.refresh(st.store, now=T0, full=True)
            clock.t = T0 + 60
            names = sorted(cache._floor)  # noqa: SLF001 - the bench sets the scene
            for n in names[:len(names) - max(1, len(names) // 100)]:
                cache.pulse.beat(n, T0 + 50)
            down = host_repo.down_before(now=clock.t, heartbeat_timeout_s=25)

            def rows():  # type: ignore[no-untyped-def]
                c, watch.cache = watch.cache, None
                try:
                    return watch.survey(clock.t, down)
                finally:
                    watch.cache = c
            got = {}
            for label, f in (("rows", rows), ("memory", lambda: watch.survey(clock.t, down))):
                ts = []
                for _ in range(5):
                    t0, c0 = time.perf_counter(), time.process_time()
                    sv = f()
                    ts.append((time.perf_counter() - t0, time.process_time() - c0))
                got[label] = (statistics.median(x for x, _ in ts), statistics.median(y for _, y in ts), sv)
    (rw, rc, rs), (mw, mc, ms) = got["rows"], got["memory"]
    assert rs.silent == ms.silent and rs.last == ms.last, "the two passes disagree"
    print(f"{a.hosts} hosts, {len(ms.silent)} silent")
    print(f"  from the rows (baseline): {rw * 1e3:.1f} ms wall, {rc * 1e3:.1f} ms CPU")
    print(f"  from memory:              {mw * 1e3:.1f} ms wall, {mc * 1e3:.1f} ms CPU "
          f"(x{rw / mw:.1f} less wall, x{rc / max(mc, 1e-9):.1f} less CPU)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
