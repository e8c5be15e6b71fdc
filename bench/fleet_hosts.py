"""The fleet page's host counts, one command:  .venv/bin/python bench/fleet_hosts.py [--hosts 2000]

A real `scheduler serve` (SQLite, HTTPS) with N registered hosts (bench/placement.py's
shapes and racks; no VMs: without hostd behind the hosts a VM fails and gives its claim
back, and the API test checks claims are taken out). Timed, each over the same fleet:

- baseline "host list": what any client without the summary has to do, every page of
  `GET /v1/hosts` and the counts (by state, free CPUs) summed from it;
- "summary": `GET /v1/fleet/hosts`, the same counts computed by the scheduler.

Both answers are checked equal before the times are printed. Prints one JSON line:
medians of --repeats (default 5) in ms, bytes on the wire, and the ratio baseline/summary.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.dev.fleetsim import fleet_scheduler  # noqa: E402
from tools.dev.schedbench import fleet, register_body  # noqa: E402

ADMIN, HOST = "bench-admin", "bench-host"


def populate(c: httpx.Client, n: int) -> None:
    hosts = fleet(n)

    def one(h: tuple) -> None:
        r = c.post("/v1/hosts", json=register_body(*h), headers={"Authorization": f"Bearer {HOST}"})
        assert r.status_code in (200, 201), r.text
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(one, hosts))


def from_list(c: httpx.Client) -> tuple[dict, int]:
    """The baseline: every page of the host list, counted here."""
    items, after, size = [], "", 0
    while True:
        r = c.get("/v1/hosts", params={"limit": 1000, **({"after": after} if after else {})})
        r.raise_for_status()
        size += len(r.content)
        page = r.json()
        items += page["items"]
        after = page.get("next") or ""
        if not after:
            break
    states: dict[str, int] = {}
    for h in items:
        states[h["state"]] = states.get(h["state"], 0) + 1
    live = [h for h in items if h["state"] == "active" and h["admin_state"] == "active"]
    return {"hosts": len(items), "states": {k: v for k, v in states.items() if v},
            "cpus_free": sum(n["free_cpus"] for h in live for n in h["nodes"]),
            "cpus_total": sum(len(n["vm_cpus"]) for h in items for n in h["nodes"])}, size


def from_summary(c: httpx.Client) -> tuple[dict, int]:
    r = c.get("/v1/fleet/hosts")
    r.raise_for_status()
    s = r.json()
    return {"hosts": s["hosts"], "states": {k: v for k, v in s["states"].items() if v},
            "cpus_free": s["cpus_free"], "cpus_total": s["cpus_total"]}, len(r.content)


def timed(fn, c: httpx.Client, repeats: int) -> tuple[float, dict, int]:  # type: ignore[no-untyped-def]
    times, got, size = [], {}, 0
    for _ in range(repeats):
        t = time.perf_counter()
        got, size = fn(c)
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times), got, size


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hyb-fleet-hosts-") as tmp, \
            fleet_scheduler(Path(tmp), admin_token=ADMIN, host_token=HOST) as f:
        s = f["sched"]
        with httpx.Client(base_url=s.url, verify=str(f["certs"] / "ca.crt"), timeout=120,
                          headers={"Authorization": f"Bearer {ADMIN}"}) as c:
            t0 = time.perf_counter()
            populate(c, args.hosts)
            fill_s = time.perf_counter() - t0
            base_ms, base, base_bytes = timed(from_list, c, args.repeats)
            new_ms, new, new_bytes = timed(from_summary, c, args.repeats)
    if base != new:
        print(f"the answers differ: host list {base}, summary {new}", file=sys.stderr)
        return 1
    print(json.dumps({"hosts": args.hosts, "fill_s": round(fill_s, 1), "baseline": "host list",
                      "host_list_ms": round(base_ms, 1), "host_list_bytes": base_bytes,
                      "summary_ms": round(new_ms, 1), "summary_bytes": new_bytes,
                      "ratio": round(base_ms / new_ms, 1), "answer": new}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
