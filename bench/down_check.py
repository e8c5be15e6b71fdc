#!/usr/bin/env python3
"""The placement index's down check against its change-feed read, in one process:

    .venv/bin/python bench/down_check.py [--hosts 10000 --calls 40 --rounds 3]

The scheduler's app (``create_app`` on a SQLite file, beats kept in memory and flushed
every second, as shipped) with --hosts registered, each beaten once, and its index warm.
Then ``HostCache.refresh`` is timed three ways, --calls each, the three taken in turn
--rounds times: the feed read in a claim batch's transaction (what a batch does under the
claim lock), the feed read in a transaction of its own, and that with the down check due
(the replicas' liveness rows read, every host's last beat walked in memory). The down
check's cost is the third less the second: what a claim batch would hold the claim lock
(every replica's claims) for, once every ``index_down_check_s``, if it ran the check
inside; it runs before the batch takes the lock (scheduler/README.md, the claim
batch's steps). It grows with the fleet.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tools.dev.host_shapes import SHAPES  # noqa: E402
from tools.dev.sched_inproc import scheduler_client  # noqa: E402
from tools.dev.schedbench import register_body  # noqa: E402

HOST = {"Authorization": "Bearer bench-host"}
WAYS = (("feed_in_batch_ms", False, False), ("feed_own_tx_ms", False, True), ("feed_and_down_check_ms", True, True))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=10000)
    p.add_argument("--calls", type=int, default=40)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="hyb-down-check-") as d:
        client = scheduler_client(f"sqlite:///{d}/b.db", {"bench-host": ["host"]}, clock=time.time,
                                  stats={"heartbeat_flush_s": 1.0}, server={"shed_loop_lag_s": 0, "gc_freeze_s": 600},
                                  placement={"heartbeat_min_interval_s": 0})
        with client:
            body = register_body("x", SHAPES[0], "")
            names = [f"dc-{i:06d}" for i in range(a.hosts)]
            for n in names:
                r = client.post("/v1/hosts", json={**body, "name": n, "address": f"{n}:7443"}, headers=HOST)
                assert r.status_code == 201, r.text
            for n in names:
                assert client.post(f"/v1/hosts/{n}/heartbeat", headers=HOST).status_code == 200
            cache, store = client.app.state.hosts.cache, client.app.state.store
            deadline = time.monotonic() + 60
            while cache.who(names[-1]) is None:  # the refresher thread learns the hosts
                assert time.monotonic() < deadline, "the index did not learn the hosts"
                time.sleep(0.2)
            got: dict[str, list[float]] = {k: [] for k, _, _ in WAYS}
            for _ in range(a.rounds):
                for key, down, own in WAYS:
                    for _ in range(a.calls):
                        cache._last_down = float("-inf") if down else cache.monotonic()  # due, or not
                        with store.batch_write() as s:
                            t = time.perf_counter()
                            cache.refresh(store, now=time.time(), fresh=True, session=None if own else s)
                            got[key].append(time.perf_counter() - t)
    med = {k: statistics.median(v) * 1e3 for k, v in got.items()}
    out = {"hosts": a.hosts, "calls": a.calls, "rounds": a.rounds, **{k: round(v, 3) for k, v in med.items()},
           "down_check_ms": round(med["feed_and_down_check_ms"] - med["feed_own_tx_ms"], 2),
           "down_check_over_feed_in_batch": round(med["feed_and_down_check_ms"] / max(med["feed_in_batch_ms"], 1e-6), 1)}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
