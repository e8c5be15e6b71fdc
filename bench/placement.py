"""Placement bench, one command (claim path only, dispatch off):

  .venv/bin/python bench/placement.py [--hosts 10000 --requests 20000 --clients 32]
                                      [--stores sqlite,pg,pg-rows] [--replicas 2] [--no-openstack]

For each store (SQLite file; PostgreSQL 15 started here on loopback, stopped by PID):
  1. start --replicas `scheduler serve` processes on the store (stateless replicas);
  2. register --hosts storage hosts of mixed shapes through POST /v1/hosts;
  3. send --requests mixed VM requests (POST /v1/vms, Idempotency-Key) from --clients
     concurrent keep-alive clients, in trace order, spread over the replicas;
  4. check the ledger in the database: no CPU/page/VF/disk/tx budget booked twice, each
     host's usage equal to the sum of its live allocations (zero overcommit).
Then the same fleet and trace against OpenStack Placement on the same database engine
(bench/scheduler_osplacement.py), the named baseline.

Printed: placements/s (VMs placed per second of the run), requests/s, client-observed
p50/p99 latency (with --clients closed-loop clients this includes queueing: by Little's
law mean latency = clients / throughput; with --rate R the requests arrive open-loop at R
per second over the same --clients connections and latency counts from each request's
due time, wrk2-style, so it shows service time plus any backlog), our server-side claim time p50/p99 (the
Server-Timing header: fit on the index + the claim transaction), our servers' CPU per
create request by thread (event loop, claim thread, other; from /proc), packing quality = VMs
placed before the first capacity rejection / VMs an offline first-fit-decreasing places
from the same trace, overcommit, and the ratios against Placement.

How CPU is counted: the servers' CPU is read from /proc before and after the run. The
process's own counter (``/proc/PID/stat``) is the total, which keeps the time of threads
that have ended (the thread pool's idle workers end after 10 s: summing the live threads
alone lost their time, and with heartbeats, which use the pool, it came out negative,
-1.29 ms per request at 700 beats/s); the event loop and the claim thread are read from
their own threads, "other" is the rest. With --heartbeats two things share the servers,
so each is measured: first a heartbeat-only phase (--beat-phase-s seconds at the same
rate, nothing else running) gives the CPU per heartbeat; then the mixed run gives the
total, and CPU per create request = (mixed total - heartbeats sent x CPU per heartbeat) /
create requests (``cpu_per_request``). That assumes a beat costs under the mixed load what
it costs alone; when the heartbeats' share would exceed the total the split is reported
as not separable, never as a negative number. The database server's CPU (PostgreSQL) is
split the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tools.dev.procstat import cpu_s, machine, machine_load, stat_fields, tree_cpu_s
from tools.dev.procs import free_port
from tools.dev.schedbench import (MIXES, Conn, Req, Result, class_ceiling, create_database, fleet, ffd_bound,
                                host_res, overcommit, percentile, postgres, register_body, run_clients,
                                run_open, server_timing_s, stop, thread_cpu, trace, wait_http)

REPO = Path(__file__).resolve().parents[1]

TOKENS = {"bench-admin": ["admin"], "bench-host": ["host"], "bench-tenant": ["tenant:bench"]}
PG_SETTINGS = {"synchronous_commit": "off", "shared_buffers": "256MB", "max_connections": "400"}


def _config(tmp: Path, url: str, pool: int, claim_lock: str = "store") -> Path:
    toks = "".join(f'[[auth.tokens]]\nname = "{k}"\nsha256 = "{hashlib.sha256(k.encode()).hexdigest()}"\n'
                   f'scopes = {json.dumps(v)}\n' for k, v in TOKENS.items())
    cfg = tmp / "scheduler.toml"
    cfg.write_text(f'log_level = "WARNING"\n[server]\nplaintext = true\n[db]\nurl = "{url}"\npool_size = {pool}\nupgrade_on_start = false\n'
                   f'[dispatch]\nenabled = false\n[reconcile]\ninterval_s = 0\n'
                   f'[placement]\nheartbeat_timeout_s = 1000000\nclaim_retries = 16\nclaim_lock = "{claim_lock}"\n{toks}')
    return cfg


def _auth(token: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **extra}


def heartbeat_body(i: int) -> dict:
    """A heartbeat with the IO-health stats hostd sends (hostd/health/summary.py)."""
    return {"stats": {
        "at": 1_764_000_000.0 + i, "interval_s": 10.0, "samples": 10, "io_cpu_busy": 0.21, "io_cpu_busy_max": 0.4,
        "cpu_io_service": 0.8, "cpu_vms": 3.5, "cpu_other": 0.2, "foreign_threads_max": 0, "foreign_cpu_s": 0.0,
        "irqs_per_s": 900.0, "psi_some_avg10_max": 0.5, "psi_stall": 0.001, "throttled_periods": 0,
        "probe_ok": 10, "probe_failed": 0, "probe_p99_ms_max": 1.2}}


@dataclass
class OursResult(Result):
    """A run of ours, with the heartbeats' CPU measured apart (--heartbeats)."""

    beats: int = 0  # heartbeats sent beside the creates
    alone_beats: int = 0  # heartbeats sent in the heartbeat-only phase
    beat_cpu: dict[str, float] = field(default_factory=dict)  # ms per heartbeat by role, measured alone
    create_cpu: float | None = None  # ms per create request, the heartbeats' share taken out
    mixed_cpu_s: dict[str, float] = field(default_factory=dict)  # the mixed run's CPU seconds by role


def server_cpu(pids: list[int]) -> dict[str, float]:
    """CPU seconds of our server processes by thread role: the event loop and the claim
    thread from their threads, "other" the process total (``/proc/PID/stat``, which keeps
    the time of threads that have ended) less those two."""
    roles = thread_cpu(pids)
    total = sum(cpu_s(f) for f in (stat_fields(f"/proc/{pid}/stat") for pid in pids) if f is not None)
    roles["other"] = total - roles["event loop"] - roles["claim thread"]
    return roles


def cpu_now(pids: list[int], db_pid: int | None) -> dict[str, float]:
    """``server_cpu`` and, with a database server, its CPU seconds as "database"."""
    out = server_cpu(pids)
    if db_pid:
        out["database"] = tree_cpu_s(db_pid)
    return out


def cpu_since(before: dict[str, float], pids: list[int], db_pid: int | None) -> dict[str, float]:
    after = cpu_now(pids, db_pid)
    return {k: after[k] - before[k] for k in after}


def cpu_per_request(total_s: float, requests: int, *, beats: int = 0, per_beat_s: float = 0.0) -> float | None:
    """CPU seconds per create request: the run's ``total_s`` less its heartbeats' share
    (``beats`` x ``per_beat_s``, measured in a heartbeat-only phase), over ``requests``.
    None when there were no requests, or the heartbeats' share is more than the total (a
    beat cost less in the mixed run than alone: the split does not hold for that run)."""
    rest = total_s - beats * per_beat_s
    if requests <= 0 or rest < 0:
        return None
    return rest / requests


async def beat(c: Conn, item: tuple[str, int]) -> tuple[int, float, float, str]:
    """One heartbeat with stats for host ``item[0]``, as hostd sends it."""
    t0 = time.perf_counter()
    rep = await c.request("POST", f"/v1/hosts/{item[0]}/heartbeat", heartbeat_body(item[1]), _auth("bench-host"))
    return rep.status, time.perf_counter() - t0, 0.0, str(rep.status)


def beats_alone(bases: list[tuple[str, int]], hosts: list, rate: float, seconds: float, pids: list[int],
                db_pid: int | None) -> tuple[int, dict[str, float]]:
    """The heartbeat-only phase: ``rate`` beats/s open loop for ``seconds``, nothing else
    running; (beats sent, CPU seconds by role). Each beat must be answered 200."""
    items = [(hosts[i % len(hosts)][0], i) for i in range(max(1, int(rate * seconds)))]
    before = cpu_now(pids, db_pid)
    got = asyncio.run(run_open(rate, 16, bases, items, beat))
    used = cpu_since(before, pids, db_pid)
    bad = [g[0] for g, _ in got if g[0] != 200]
    if bad:
        raise RuntimeError(f"heartbeat-only phase: {len(bad)} of {len(items)} not answered 200 ({bad[:5]})")
    return len(items), used


def run_ours(label: str, url: str, hosts: list, reqs: list[Req], *, clients: int, replicas: int,
             tmp: Path, rate: float = 0.0, db_pid: int | None = None, claim_lock: str = "store",
             heartbeats: float = 0.0, beat_phase_s: float = 10.0) -> Result:
    """``db_pid``: the database server's PID (PostgreSQL here), whose CPU per
    request is reported next to ours. ``claim_lock``: the scheduler's
    ``placement.claim_lock``. ``heartbeats`` (with ``rate``): beats/s beside the
    creates, after a heartbeat-only phase of ``beat_phase_s`` (the module's docstring)."""
    from scheduler.db.engine import Store
    from scheduler.db.migrate import upgrade
    store = Store.from_url(url)
    upgrade(store.engine)
    cfg = _config(tmp, url, pool=max(4, clients // replicas + 2), claim_lock=claim_lock)
    ports = [free_port() for _ in range(replicas)]
    procs: list[subprocess.Popen] = []
    out = OursResult(label)
    try:
        for i, port in enumerate(ports):
            with open(tmp / f"{label}-{i}.log", "wb") as log:  # the server keeps its own copy of the fd
                procs.append(subprocess.Popen([sys.executable, "-m", "scheduler.cli", "serve", "--config",
                                               str(cfg), "--port", str(port)], cwd=REPO, stdout=log,
                                              stderr=subprocess.STDOUT, start_new_session=True))
        for i, port in enumerate(ports):
            wait_http(port, "/healthz", procs[i], tmp / f"{label}-{i}.log")
        bases = [("127.0.0.1", p) for p in ports]
        _register(label, bases, hosts, reqs, clients=clients, replicas=replicas)
        pids = [p.pid for p in procs]
        alone = beats_alone(bases, hosts, heartbeats, beat_phase_s, pids, db_pid) if rate and heartbeats else None
        before, m0, t = cpu_now(pids, db_pid), machine(), time.perf_counter()
        got = _creates(out, bases, hosts, reqs, clients=clients, rate=rate, heartbeats=heartbeats)
        out.seconds = time.perf_counter() - t
        out.machine = machine_load(m0, machine())
        _count_cpu(out, cpu_since(before, pids, db_pid), len(reqs), alone)
        out.tally([(status, dt, code) for status, dt, _srv, code in got])
        out.server = [srv for status, _dt, srv, _code in got if status == 202]
    finally:
        stop(procs)
    out.overcommit = ledger(store)
    store.dispose()
    return out


def _register(label: str, bases: list[tuple[str, int]], hosts: list, reqs: list[Req], *, clients: int,
              replicas: int) -> None:
    """The fleet through POST /v1/hosts, then one dry run per replica (each builds its index
    before the clock starts)."""
    async def register(c: Conn, h: tuple) -> int:
        r = await c.request("POST", "/v1/hosts", register_body(*h), _auth("bench-host"))
        if r.status not in (200, 201):
            raise RuntimeError(f"register {h[0]}: {r.status} {r.body[:300]!r}")
        return r.status
    t = time.perf_counter()
    asyncio.run(run_clients(clients, bases, hosts, register))
    print(f"  [{label}] registered {len(hosts)} hosts through the API in {time.perf_counter() - t:.1f} s",
          flush=True)

    async def warm(c: Conn, _: int) -> None:
        await c.request("POST", "/v1/vms?dry_run=true", reqs[0].body(),
                        _auth("bench-tenant", **{"Idempotency-Key": "warm"}))
    asyncio.run(run_clients(replicas, bases, list(range(replicas)), warm))


async def _place(c: Conn, r: Req) -> tuple[int, float, float, str]:
    t0 = time.perf_counter()
    rep = await c.request("POST", "/v1/vms", r.body(), _auth("bench-tenant", **{"Idempotency-Key": f"b-{r.i}"}))
    dt = time.perf_counter() - t0
    srv = server_timing_s(rep.headers)
    srv = float("nan") if srv is None else srv
    code = "" if rep.status == 202 else (rep.json() or {}).get("error", {}).get("code", str(rep.status))
    return rep.status, dt, srv, code


def _creates(out: OursResult, bases: list[tuple[str, int]], hosts: list, reqs: list[Req], *, clients: int,
             rate: float, heartbeats: float) -> list[tuple[int, float, float, str]]:
    """The measured run: the trace's creates (closed or open loop), with the fleet's
    heartbeats (with IO-health stats) arriving open-loop beside them when asked."""
    if rate and heartbeats:
        beats = [(hosts[i % len(hosts)][0], i) for i in range(int(heartbeats * len(reqs) / rate))]

        async def both():  # type: ignore[no-untyped-def]
            return await asyncio.gather(run_open(rate, clients, bases, reqs, _place),
                                        run_open(heartbeats, 16, bases, beats, beat))
        timed, hb = asyncio.run(both())
        ok = [lat for g, lat in hb if g[0] == 200]
        out.beats = len(hb)
        out.note = (f"open loop: {rate:.0f} requests/s offered over {clients} connections, with "
                    f"{heartbeats:.0f} heartbeats/s (stats) over 16: {len(ok)}/{len(hb)} answered 200, "
                    f"heartbeat p50 {percentile(ok, .5) * 1e3:.1f} ms, p99 {percentile(ok, .99) * 1e3:.1f} ms")
    elif rate:
        timed = asyncio.run(run_open(rate, clients, bases, reqs, _place))
        out.note = f"open loop: {rate:.0f} requests/s offered over {clients} connections"
    else:
        return asyncio.run(run_clients(clients, bases, reqs, _place))
    return [(g[0], lat, g[2], g[3]) for g, lat in timed]


def _count_cpu(out: OursResult, used: dict[str, float], creates: int,
               alone: tuple[int, dict[str, float]] | None) -> None:
    """CPU per create request (by role when nothing else ran), and with heartbeats the CPU
    per heartbeat measured alone and per create request with the heartbeats' share out."""
    db = used.pop("database", None)
    if alone is None:
        out.cpu = {k: v / creates * 1e3 for k, v in used.items()}
        out.db_cpu = None if db is None else db / creates * 1e3
        return
    n, alone_used = alone
    alone_db = alone_used.pop("database", None)
    out.mixed_cpu_s = used
    out.alone_beats = n
    out.beat_cpu = {k: v / n * 1e3 for k, v in alone_used.items()}
    per_create = cpu_per_request(sum(used.values()), creates, beats=out.beats,
                                 per_beat_s=sum(alone_used.values()) / n)
    out.create_cpu = None if per_create is None else per_create * 1e3
    if db is not None and alone_db is not None:
        per_db = cpu_per_request(db, creates, beats=out.beats, per_beat_s=alone_db / n)
        out.beat_cpu["database"] = alone_db / n * 1e3
        out.db_cpu = None if per_db is None else per_db * 1e3


def ledger(store) -> list[str]:  # type: ignore[no-untyped-def]
    from sqlalchemy import select

    from scheduler.db.models import LIVE, Host, Vm
    from scheduler.repo.hosts import host_res as res_of
    from scheduler.resources import Allocation, Usage
    with store.read() as s:
        hosts = s.scalars(select(Host)).all()
        res = {h.name: res_of(h) for h in hosts}
        usage = {h.name: Usage.from_dict(h.usage) for h in hosts}
        allocs: dict[str, list] = {}
        for host, a in s.execute(select(Vm.host, Vm.allocation).where(Vm.status.in_(LIVE))):
            allocs.setdefault(host, []).append(Allocation.from_dict(a))
    return overcommit(res, usage, allocs)


def report(rows: list[Result], ffd: int, baseline: Result | None) -> None:
    print()
    print(f"{'run':<28} {'placed/s':>9} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'srv p50':>8} {'srv p99':>8} "
          f"{'placed':>7} {'507':>6} {'409':>5} {'other':>6} {'quality':>8}  overcommit")
    for r in rows:
        srv = [x for x in r.server if x == x]
        other = sum(r.errors.values())
        oc = "n/a" if r.overcommit is None else ("none" if not r.overcommit else f"{len(r.overcommit)} PROBLEMS")
        print(f"{r.label:<28} {r.placed / r.seconds if r.seconds else 0:>9.0f} {r.rate:>7.0f} "
              f"{percentile(r.lat, .5) * 1e3:>7.1f} {percentile(r.lat, .99) * 1e3:>7.1f} "
              f"{percentile(srv, .5) * 1e3 if srv else float('nan'):>8.2f} "
              f"{percentile(srv, .99) * 1e3 if srv else float('nan'):>8.2f} "
              f"{r.placed:>7} {r.rejected:>6} {r.conflicts:>5} {other:>6} "
              f"{r.before_first_reject / ffd if 'only' not in r.note else float('nan'):>8.3f}  {oc}")
        if r.errors:
            print(f"{'':<28} other answers: {r.errors}")
        if r.overcommit:
            print(f"{'':<28} first problems: {r.overcommit[:5]}")
        if r.cpu:
            print(f"{'':<28} server CPU per create request: {sum(r.cpu.values()):.2f} ms ("
                  + ", ".join(f"{k} {v:.2f}" for k, v in r.cpu.items()) + ")"
                  + (f"; database server {r.db_cpu:.2f} ms" if r.db_cpu is not None else ""))
        if isinstance(r, OursResult) and r.beat_cpu:
            _report_split(r)
        if r.machine:
            print(f"{'':<28} machine while it ran: {r.machine[0]:.2f} of {os.cpu_count()} CPUs busy, "
                  f"{r.machine[1]:.3f} stolen by the hypervisor")
        if r.note:
            print(f"{'':<28} {r.note}")
    print(f"\npacking quality = VMs placed before the first capacity rejection / {ffd} placed by offline "
          f"first-fit-decreasing on the same trace")
    if baseline is None:
        return
    for r in rows:
        if r is baseline or not r.seconds or "placement" in r.label or baseline.label.split()[-1] not in r.label:
            continue
        print(f"ratio {r.label} / {baseline.label}: placements/s x{(r.placed / r.seconds) / (baseline.placed / baseline.seconds):.1f}, "
              f"p50 latency x{percentile(baseline.lat, .5) / percentile(r.lat, .5):.1f} lower, "
              f"p99 latency x{percentile(baseline.lat, .99) / percentile(r.lat, .99):.1f} lower")


def _report_split(r: OursResult) -> None:
    """CPU per heartbeat (measured alone) and per create request (the mixed run's total
    less the heartbeats' share), for our servers and the database server."""
    srv = {k: v for k, v in r.beat_cpu.items() if k != "database"}
    per_beat = sum(srv.values())
    print(f"{'':<28} server CPU per heartbeat: {per_beat:.2f} ms ("
          + ", ".join(f"{k} {v:.2f}" for k, v in srv.items())
          + f"; measured alone: {r.alone_beats} heartbeats, nothing else running)"
          + (f"; database server {r.beat_cpu['database']:.2f} ms" if "database" in r.beat_cpu else ""))
    total = sum(r.mixed_cpu_s.values())
    how = (f"(mixed run {total:.2f} s - {r.beats} heartbeats x {per_beat:.2f} ms) / {len(r.lat)} create requests; "
           f"mixed run by thread: " + ", ".join(f"{k} {v:.2f} s" for k, v in r.mixed_cpu_s.items()))
    if r.create_cpu is None:
        print(f"{'':<28} server CPU per create request: not separable, the heartbeats' share exceeds the "
              f"total {how}")
    else:
        print(f"{'':<28} server CPU per create request: {r.create_cpu:.2f} ms = {how}"
              + (f"; database server {r.db_cpu:.2f} ms" if r.db_cpu is not None else ""))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=10000)
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--replicas", type=int, default=2, help="scheduler serve processes (stateless replicas)")
    p.add_argument("--rate", type=float, default=0.0,
                   help="open loop: offer this many requests/s (default: --clients closed-loop clients)")
    p.add_argument("--heartbeats", type=float, default=0.0,
                   help="with --rate: also this many host heartbeats/s (IO-health stats) beside the claims "
                        "(7,000 hosts at 10 s = 700/s)")
    p.add_argument("--beat-phase-s", type=float, default=10.0,
                   help="with --heartbeats: seconds of heartbeats alone before the mixed run, which give the "
                        "CPU per heartbeat")
    p.add_argument("--stores", default="sqlite,pg",
                   help="comma list of sqlite, pg, pg-rows (PostgreSQL with placement.claim_lock = \"rows\")")
    p.add_argument("--mix", default="storage", choices=sorted(MIXES),
                   help="request mix (tools/dev/schedbench.py MIXES; bench/packing.py compares them in process)")
    p.add_argument("--no-openstack", action="store_true", help="skip the OpenStack Placement baseline")
    p.add_argument("--placement-venv", default="/var/cache/hybrid-kvm/placement-venv")
    p.add_argument("--placement-requests", type=int, default=2000,
                   help="Placement gets the first N requests of the same trace (it is slow: ~8 req/s on SQLite)")
    p.add_argument("--placement-conflict-retries", type=int, default=1,
                   help="Placement's allocation_conflict_retry_count; its default, 10, overcommits on PostgreSQL "
                        "(bench/scheduler_osplacement.py _conf)")
    a = p.parse_args()
    # the replicas run in sessions of their own: kill <pid> unwinds like Ctrl-C and stops them
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    hosts, reqs = fleet(a.hosts), trace(a.requests, mix=a.mix)
    t = time.perf_counter()
    ffd = ffd_bound([host_res(*h) for h in hosts], reqs)
    ceiling, why = class_ceiling(hosts, reqs)
    print(f"fleet: {a.hosts} hosts ({', '.join(sorted({h[1].name for h in hosts}))}); trace: {a.requests} "
          f"requests ({a.mix} mix); {a.clients} clients; offline FFD places {ffd} ({time.perf_counter() - t:.1f} s)\n"
          f"ceiling: request {ceiling} takes the demand for {why}: "
          f"no scheduler gets further, quality <= {min(ceiling, ffd) / ffd:.3f}", flush=True)
    stores = [s.strip() for s in a.stores.split(",") if s.strip()]
    rows: list[Result] = []
    base: dict[str, Result] = {}
    with tempfile.TemporaryDirectory(prefix="hyb-bench-") as d:
        tmp = Path(d)
        for st in stores:
            if st == "sqlite":
                rows.append(run_ours("hybrid-kvm sqlite", f"sqlite:///{tmp}/sched.db", hosts, reqs,
                                     clients=a.clients, replicas=a.replicas, tmp=tmp, rate=a.rate,
                                     heartbeats=a.heartbeats, beat_phase_s=a.beat_phase_s))
                if not a.no_openstack:
                    base["sqlite"] = run_openstack("sqlite", None, hosts, reqs, a, tmp)
                    rows.append(base["sqlite"])
            elif st in ("pg", "pg-rows"):
                lock = "rows" if st == "pg-rows" else "store"
                with postgres(PG_SETTINGS) as (_user, port, pg_pid):
                    create_database(port, "sched")
                    rows.append(run_ours(f"hybrid-kvm {st}", f"postgresql://postgres@127.0.0.1:{port}/sched",
                                         hosts, reqs, clients=a.clients, replicas=a.replicas, tmp=tmp,
                                         rate=a.rate, db_pid=pg_pid, claim_lock=lock, heartbeats=a.heartbeats,
                                         beat_phase_s=a.beat_phase_s))
                    if st == "pg" and not a.no_openstack:
                        create_database(port, "placement")
                        base["pg"] = run_openstack("pg", port, hosts, reqs, a, tmp)
                        rows.append(base["pg"])
            else:
                p.error(f"unknown store {st!r}")
            report_partial = [r for r in rows]
            report(report_partial, ffd, None)
    print("\n=== all runs ===")
    report(rows, ffd, None)
    for st, b in base.items():
        if b.seconds and b.placed:
            report([r for r in rows if r.label.endswith(st) and r is not b] + [b], ffd, b)
    return 0 if all(not r.overcommit for r in rows) else 1


def run_openstack(store: str, pg_port: int | None, hosts: list, reqs: list[Req], a: argparse.Namespace,
                  tmp: Path) -> Result:
    from scheduler_osplacement import run_placement
    try:
        r = run_placement(store, pg_port, hosts, reqs[:a.placement_requests], clients=a.clients,
                          workers=a.replicas, venv=Path(a.placement_venv), tmp=tmp,
                          conflict_retries=a.placement_conflict_retries)
        if a.placement_requests < len(reqs):
            r.note = (r.note + "; " if r.note else "") + f"first {a.placement_requests} requests of the trace only"
        return r
    except Exception as e:  # noqa: BLE001 - the reason is the result
        r = Result(f"openstack-placement {store}")
        r.note = f"NOT MEASURED: {type(e).__name__}: {str(e)[-1500:]}"
        return r


if __name__ == "__main__":
    sys.exit(main())
