#!/usr/bin/env python3
"""A heartbeat's cost inside the scheduler's ASGI app, against the bare-ASGI floor's, in
one process (issue 39, item 2):

    .venv/bin/python bench/beat_path.py [--hosts 2000 --calls 10000 --rounds 5]

The scheduler's app (``create_app`` on a SQLite file, the shipped heartbeat settings:
beats from memory, flushed every second, shedding on) with --hosts registered and its
index warm, and bench/floor_app.py's app, each called directly with a heartbeat's ASGI
scope (what uvicorn hands it: POST /v1/hosts/{name}/heartbeat, no body, the host token),
no server, no socket: the CPU each takes per call, the best of --rounds rounds of
--calls calls, the two alternating. What bench/fleet_pulse.py measures through uvicorn
is this plus the server's own work, which the two share; this is the part a change to
the request path moves, without the machine's noise on the sockets.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.floor_app import app as floor_app  # noqa: E402
from tools.dev.host_shapes import SHAPES  # noqa: E402
from tools.dev.sched_inproc import scheduler_client  # noqa: E402
from tools.dev.schedbench import register_body  # noqa: E402

TOKENS = {"bench-host": ["host"]}


def scope(name: str) -> dict:
    path = f"/v1/hosts/{name}/heartbeat"
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 50000), "scheme": "http", "root_path": "",
            "method": "POST", "path": path, "raw_path": path.encode(), "query_string": b"",
            "headers": [(b"host", b"127.0.0.1:8000"), (b"content-length", b"0"),
                        (b"authorization", b"Bearer bench-host")]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=2000)
    p.add_argument("--calls", type=int, default=10000)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="hyb-beat-path-") as d:
        client = scheduler_client(f"sqlite:///{d}/beat.db", TOKENS, clock=time.time,
                                  # the shipped heartbeat path (sched_inproc's test settings write through)
                                  stats={"heartbeat_flush_s": 1.0}, server={"shed_loop_lag_s": 0.5, "gc_freeze_s": 600},
                                  placement={"heartbeat_min_interval_s": 0})  # every host beats many times a round
        with client:
            body = register_body("x", SHAPES[0], "")
            names = [f"beat-{i:06d}" for i in range(a.hosts)]
            for n in names:
                r = client.post("/v1/hosts", json={**body, "name": n, "address": f"{n}:7443"},
                                headers={"Authorization": "Bearer bench-host"})
                assert r.status_code == 201, r.text
            app = client.app
            # a first beat (from the database) starts the flusher, whose index refresh learns the hosts
            assert client.post(f"/v1/hosts/{names[0]}/heartbeat",
                               headers={"Authorization": "Bearer bench-host"}).status_code == 200
            deadline = time.monotonic() + 30
            while app.state.hosts.cache.who(names[-1]) is None:
                assert time.monotonic() < deadline, "the index did not learn the hosts"
                time.sleep(0.2)
            scopes = [scope(n) for n in names]
            answers: list[dict] = []

            async def receive() -> dict:
                return {"type": "http.request", "body": b"", "more_body": False}

            async def send(msg: dict) -> None:
                if len(answers) < 2:
                    answers.append(msg)

            async def calls(target) -> float:  # type: ignore[no-untyped-def]
                t = time.process_time()
                for k in range(a.calls):
                    await target({**scopes[k % len(scopes)], "state": {}}, receive, send)
                return (time.process_time() - t) / a.calls * 1e6

            async def rounds() -> dict[str, float]:
                best = {"app": float("inf"), "floor": float("inf")}
                for _ in range(a.rounds):
                    for label, target in (("app", app), ("floor", floor_app)):
                        best[label] = min(best[label], await calls(target))
                return best
            best = asyncio.run(rounds())
            assert answers[0]["status"] == 200 and json.loads(answers[1]["body"])["state"] == "active", answers
            served = app.state.metrics.heartbeats.value
    print(json.dumps({"hosts": a.hosts, "calls": a.calls, "rounds": a.rounds,
                      "app_us_per_beat": round(best["app"], 1), "floor_us_per_beat": round(best["floor"], 1),
                      "app_minus_floor_us": round(best["app"] - best["floor"], 1),
                      "beats_counted": int(served)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
