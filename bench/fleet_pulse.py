#!/usr/bin/env python3
"""The fleet's pulse, one command: heartbeats at the fleet's rate next to placements.

    .venv/bin/python bench/fleet_pulse.py [--hosts 100000 --rate 1000 --stores sqlite,pg]
    .venv/bin/python bench/fleet_pulse.py --short --json      # ~40 s: 500 hosts, SQLite
    .venv/bin/python bench/fleet_pulse.py --only registrations --hosts 100000   # ~2 min a store
    .venv/bin/python bench/fleet_pulse.py --only beats --hosts 20000 --stores sqlite  # phase 2 and its floor
    .venv/bin/python bench/fleet_pulse.py --only markdown --hosts 100000 --stores pg  # phase 5 alone

For each store (a SQLite file; PostgreSQL 15 started here on loopback, stopped by PID),
two `scheduler serve` replicas, --hosts registered through the API, then, with liveness
out of play (a timeout no pause reaches, as bench/placement.py):

1. placements offered open loop at --rate for one window (--seconds / --rounds),
   untimed: what warms in the servers pays here, not in the baseline; the VMs placed
   are deleted after it, as after every placement window, so each places into the same
   free fleet;
2. heartbeats alone, every host once per interval (10 s, as hostd beats; no stats, as
   hostd by default) for --seconds: beats answered and their p99, the servers' CPU per
   beat (the replicas' processes only, never the generator's), and the database's
   writes per beat (PostgreSQL: its own counters, rows inserted + updated + deleted in
   pg_stat_database, and per table, db_writes_by_table; SQLite counts none, so the
   liveness rows the replicas wrote, from their /metrics), counted from when phase 1's
   rows are counted (PostgreSQL: its counter still for 11 s, phase1_tail_s: an idle
   backend reports its rows up to 10 s late, and they were counted here). Before the
   beats the replicas idle for --idle-s (idle_cpu_ms_per_s: a replica's fixed CPU a
   second, taken off for cpu_us_per_beat_net); after them the same beats, from the same
   generator at the same rate, go to the bare-ASGI floor (bench/floor_app.py: uvicorn
   started as a replica is, one process a replica, answering the beat's request with a
   body of the beat's answer and doing nothing else): floor_cpu_us_per_beat, and
   cpu_over_floor, the replicas' net CPU per beat over the floor's (issue 39's bar:
   1.5). cpu_us_per_beat_loop and floor_cpu_us_per_beat_loop: the main threads' share
   (uvicorn's event loop, where the requests are answered); gc_us_per_beat and
   gc_pauses_over_25ms: the replicas' cyclic-GC stops over the beats' window
   (hyb_sched_gc_pause_seconds), a stop of every thread the requests' own timing misses;
3. placements open loop at --rate in 3 x --rounds windows of --seconds / --rounds
   each, of three kinds taken in turn (alone, beside, floor; floor, beside, alone;
   ...), each kind's windows pooled: alone; beside the heartbeats at the fleet's rate
   (placement_p99_ratio: issue 39's bar, 1.15); and beside the same beats from the same
   generator sent to the bare-ASGI floor instead (the control: what answering beats at
   all costs this machine's placements, none of it the scheduler's; _beats_to_floor,
   placement_p99_ratio_floor, and the scheduler's own share, with_beats against it:
   placement_p99_ratio_vs_floor). Each kind: placements/s and p99, the same requests'
   time inside the replica (their Server-Timing: claim_p99_ms..., claim_p99_ratio,
   and window by window, claim_p99_ms_by_window), and from when each was sent rather
   than due (placement_p99_ms_from_send...: without the wait for one of the
   generator's 128 connections, PLACE_CONNS), and where the CPUs went (cpu_budget:
   the replicas, this process, wrk, the machine). --split sends the beats to one
   replica and the placements to the other. Until 2026-12-06 the baseline was one
   window before phase 2 and the beats' one after it, on 32 connections: the first
   window after the registrations carried what warms, the machine's drift fell on
   one side only (the ratio read 0.33 and 8.0 in runs of the same code), and the wait
   for a connection amplified any slowdown of the server;
4. every host sends its day (POST /v1/hosts/{name}/days): the history's bytes per host
   and day, from the database's own numbers (SQLite dbstat; PostgreSQL: the table's main fork and its index,
   not the fixed free-space and visibility maps);
5. the replicas restarted with the liveness timings in play and warmed as in (1); every
   host beats through their grace period, then 1 % of the hosts (spread over the racks)
   go silent while the others beat on, and one replica is restarted in the middle (not
   warmed: hostd does not wait for it): how long each silent host took to be marked
   down after its last beat (p50/p99, from the audit's host.down rows), how many hosts
   that kept beating were marked down (false downs), the liveness events the replicas
   logged (too many hosts silent at once: none marked), and every 5 s how many hosts'
   liveness the database holds from this phase. The phase lasts the timeout, two checks
   and a beat interval, and at least a timeout after the restarted replica answers; with
   wrk it then goes on until every silent host is marked (at most 5 minutes: replicas
   that lag or shed registrations skip their checks, mark_down_shed and
   liveness_checks_skipped say so);
   replica_restart_s is how long the restarted replica took to answer again.

The beats case (--only beats): phase 2 alone, with its idle phase and its floor, on a
fleet registered first (two fresh replicas, warmed, liveness out of play as in 1-3).

The registrations case (--registrations, or --only registrations for it alone): the
fleet registered through the API as hostd sends it (one request per host, 32 at a time,
the bodies built before the clock starts) on a fresh database and two fresh replicas
each way: the baseline, one write transaction per registration (`register_batch = 0`,
the path before batches), over the first --baseline-hosts (10,000) hosts; then the
batched path (`register_batch = 64`) over all of them. Registrations/s each way and
their ratio, the replicas' CPU and this process's per registration, the machine's busy
and stolen CPUs, and the hosts counted back (`GET /v1/fleet/hosts`).

Two load generators send the heartbeats (--generator); placements, registrations and
days always come from this Python process. Beats are split over the two replicas: host
i beats to replica i % 2.

- python: this process (asyncio, 16 keep-alive connections), open loop: each beat's
  latency runs from when it was due. On this 2-CPU machine it shares the CPUs with the
  replicas; at 10,000 hosts it kept pace (993 of 1,000 beats/s answered,
  docs/measurements.md), at 100,000 (10,000 beats/s) it cannot: one interpreter thread
  building and parsing every request.
- wrk (4.1, /usr/bin/wrk) with bench/wrk/heartbeat.lua: one thread and 8 connections
  per replica, each thread beating its hosts in turn, paced by the script's delay()
  hook (wrk 4 has no -R). Its latency runs from when a beat was written; beats that
  went out more than 1 ms after they were due (every connection busy) are counted
  (beats_late), so a p99 that leaves waiting out says so. In phase 5 the silent hosts'
  last beats come from this process (their times are the mark-down's zero) and each
  replica has its own wrk, routed as a load balancer would while replica 1 restarts
  (as the python generator sends a beat its replica refused to the other): a wrk
  connection that finds its server gone never reconnects, so replica 1's wrk stops
  before that replica's restart, a wrk takes replica 1's hosts' beats to replica 0 from
  where their stream stopped, and once replica 1 answers again that one is stopped
  (SIGINT: wrk still reports) and a new one beats them to replica 1 from where the
  stream then is; no beat is skipped or sent twice, and all of them are in the phase's
  sent and answered counts. (Until 2026-11-29 the beats due during the restart were
  skipped: at 100,000 hosts the restart outlasted the timeout and replica 1's half of
  the fleet went silent.)
The default is wrk from 20,000 hosts (2,000 beats/s, twice the most the Python
generator was measured to keep pace with) when /usr/bin/wrk exists, else python, so the
runs at 10,000 hosts and below stay comparable with the ones before wrk; --short is python.
Both report their own CPU per beat sent (generator_cpu_us_per_beat; python: phase 2 only,
as in phase 3 this process also sends the placements).

The defaults are the issue's; `--short` is what the test runs: 500 hosts beating every
2 s with the liveness timings shortened to match (timeout 7 s, a shared liveness row per
replica every 1.5 s, checked every 1 s); the full run uses the shipped defaults, read from
scheduler/config.py (beats every 10 s, hostd's; timeout 22 s, a row per replica every
2 s, checks every 2 s: a dead host marked within 26 s of its last beat). A host's own
row is written every 300 s (never within a run) and when it comes back from down.

The mark-down case (--only markdown): phase 5 alone, on a fleet registered first.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import hashlib
import json
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scheduler.config import LivenessConfig, PlacementConfig  # noqa: E402
from tools.dev.procstat import cpu_s, machine, machine_load, stat_fields, tree_cpu_s  # noqa: E402
from tools.dev.procs import free_port  # noqa: E402
from tools.dev.schedbench import (WRK, Conn, WrkRun, create_database, fleet, percentile,  # noqa: E402
                                  postgres, register_body, run_clients, run_open, server_timing_s, start_wrk,
                                  stop, stop_wrk, trace, wait_http, wait_wrk)

TOKENS = {"bench-admin": ["admin"], "bench-host": ["host"], "bench-tenant": ["tenant:bench"]}
PG_SETTINGS = {"synchronous_commit": "off", "shared_buffers": "256MB", "max_connections": "400"}
STORES = "sqlite,pg"
WRK_SCRIPT = REPO / "bench/wrk/heartbeat.lua"
FLOOR_APP = REPO / "bench/floor_app.py"
WRK_FROM_HOSTS = 20000  # the docstring says why
CONNS = 16  # the heartbeats' connections, either generator: 8 a replica
# The placements' connections. Open loop, a request waits for a free one; at 1,000/s and a
# claim of 20-45 ms at p99, 32 were too few: in a PostgreSQL run the p99 from the due
# time was 81 ms alone and 633 ms beside the beats while from the send it was 44 and 51 ms,
# so the ratio measured the generator's queue. Placements come from many clients (Nova's
# conductors, operators' tools); 128 keeps the wait for a connection out of the tail.
PLACE_CONNS = 128


def auth(token: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **extra}


def config(tmp: Path, url: str, a: argparse.Namespace, *, timeout_s: float, check_s: float,
           register_batch: int = 64, interval_s: float = 10.0, grace_s: float | None = None) -> Path:
    """The replicas' config: the periods (``write_s``, ``period_s``) and PostgreSQL's
    ``claim_lock`` as the command line says. ``grace_s``: the replicas' liveness grace
    after the beats begin (default: the timeout)."""
    write_s, period_s = a.write_s, a.period_s
    lock = f'claim_lock = "{a.claim_lock}"\n' if url.startswith("postgresql") else ""
    toks = "".join(f'[[auth.tokens]]\nname = "{k}"\nsha256 = "{hashlib.sha256(k.encode()).hexdigest()}"\n'
                   f'scopes = {json.dumps(v)}\n' for k, v in TOKENS.items())
    cfg = tmp / "pulse.toml"
    cfg.write_text(f'log_level = "WARNING"\n[server]\nplaintext = true\n[db]\nurl = "{url}"\npool_size = 24\n'
                   f'upgrade_on_start = true\n[dispatch]\nenabled = false\n[reconcile]\ninterval_s = 0\n'
                   f'[placement]\nheartbeat_timeout_s = {timeout_s}\nheartbeat_write_s = {write_s}\n'
                   f'heartbeat_period_s = {period_s}\nregister_batch = {register_batch}\n{lock}'
                   f'[liveness]\ncheck_s = {check_s}\ngrace_s = {grace_s or timeout_s}\nbeat_interval_s = {interval_s}\n{toks}')
    return cfg


class Replicas:
    """The `scheduler serve` processes, started and stopped by PID."""

    def __init__(self, cfg: Path, tmp: Path, n: int):
        self.cfg, self.tmp = cfg, tmp
        self.ports = [free_port() for _ in range(n)]
        self.procs: list[subprocess.Popen | None] = [None] * n

    def start(self, i: int) -> None:
        log = open(self.tmp / f"replica-{i}.log", "ab")  # noqa: SIM115 - the server keeps its own copy
        self.procs[i] = subprocess.Popen([sys.executable, "-m", "scheduler.cli", "serve", "--config", str(self.cfg),
                                          "--port", str(self.ports[i])], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        log.close()
        # a replica opens its port once its index is built: at 100,000 hosts that is a
        # full read of the fleet (a replica that died is reported at once all the same)
        wait_http(self.ports[i], "/healthz", self.procs[i], self.tmp / f"replica-{i}.log", timeout=300)

    def restart(self, i: int) -> None:
        p = self.procs[i]
        assert p is not None
        p.send_signal(signal.SIGTERM)
        p.wait(30)
        self.start(i)

    @property
    def bases(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", p) for p in self.ports]

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p is not None]

    def stop(self) -> None:
        stop([p for p in self.procs if p is not None])


class Floor(Replicas):
    """The bare-ASGI floor (bench/floor_app.py): as many processes as replicas, each
    started as a replica is (uvicorn in one process, its own session), answering the
    heartbeat's request with the heartbeat's answer and doing nothing else."""

    def start(self, i: int) -> None:
        log = open(self.tmp / f"floor-{i}.log", "ab")  # noqa: SIM115 - the server keeps its own copy
        self.procs[i] = subprocess.Popen([sys.executable, str(FLOOR_APP), "--port", str(self.ports[i])], cwd=REPO,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        wait_http(self.ports[i], "/healthz", self.procs[i], self.tmp / f"floor-{i}.log", timeout=60)


def idle_cpu(groups: list[list[int]], seconds: float) -> list[float]:
    """Each group's CPU in ms per second and process while nothing is sent to it (its
    fixed costs: timers, the flusher, the liveness pass)."""
    c0, t0 = [cpu(g) for g in groups], time.monotonic()
    time.sleep(seconds)
    took = time.monotonic() - t0
    return [round((cpu(g) - c) / took / max(1, len(g)) * 1e3, 3) for g, c in zip(groups, c0)]


async def beat(c: Conn, name: str) -> tuple[int, float]:
    t = time.perf_counter()
    try:
        r = await c.request("POST", f"/v1/hosts/{name}/heartbeat", None, auth("bench-host"))
    except (OSError, asyncio.IncompleteReadError):  # a replica restarting: hostd tries again next beat
        c.close()
        return 0, time.perf_counter() - t
    return r.status, time.perf_counter() - t


def start_beats(bases: list[tuple[str, int]], names: list[str], *, start: int, count: int, rate: float,
                seconds: float, tmp: Path, label: str) -> subprocess.Popen:
    """wrk (bench/wrk/heartbeat.lua) beating ``count`` times at ``rate`` a second, host
    i of ``names`` to replica ``bases[i % len(bases)]``, each replica's hosts in turn
    from ``start`` (a position in the whole stream, as ``Stream``), for ``seconds``."""
    k = len(bases)
    files = []
    for r in range(k):
        f = tmp / f"beats-{label}-{r}.names"
        f.write_text("".join(n + "\n" for n in names[r::k]))
        files.append(str(f))
    env = {"HYB_WRK_ADDRS": ",".join(f"{h}:{p}" for h, p in bases), "HYB_WRK_NAMES": ",".join(files),
           "HYB_WRK_RATE": str(rate / k), "HYB_WRK_COUNT": str(count // k), "HYB_WRK_START": str(start // k),
           "HYB_WRK_TOKEN": "bench-host"}
    host, port = bases[0]
    return start_wrk(WRK_SCRIPT, f"http://{host}:{port}", threads=k, conns=CONNS // 2 * k, seconds=seconds,
                     env=env)


@dataclass
class Beats:
    """What one heartbeat phase sent and got, from either generator."""

    sent: int
    ok: int
    took_s: float  # first beat sent to last answer
    p99_s: float | None
    late: int | None  # wrk: beats sent more than 1 ms after they were due; python: None (its latency holds them)
    generator_cpu_s: float

    @classmethod
    def of_wrk(cls, run: WrkRun) -> Beats:
        return cls(run.sent, run.answered(200), run.window_s, run.p("99"), int(run.report.get("late_1ms", 0)),
                   run.cpu_s)

    @classmethod
    def of_python(cls, got: list, took_s: float, cpu_s: float) -> Beats:
        ok = [lat for (st, _), lat in got if st == 200]
        return cls(len(got), len(ok), took_s, percentile(ok, 0.99) if ok else None, None, cpu_s)


def send_beats(a: argparse.Namespace, bases: list[tuple[str, int]], names: list[str], start: int, count: int,
               rate: float, tmp: Path, label: str, beside=None) -> tuple[Beats, object]:  # type: ignore[no-untyped-def]
    """``count`` beats at ``rate`` from ``names[start:]`` on (round after round) with
    --generator; ``beside`` (a coroutine function), when given, runs in this process
    meanwhile (the placements of phase 3). Returns the beats and what ``beside`` returned."""
    if a.generator == "wrk":
        p = start_beats(bases, names, start=start, count=count, rate=rate, seconds=count / rate + 1, tmp=tmp,
                        label=label)
        try:
            other = asyncio.run(beside()) if beside else None
        finally:
            run = wait_wrk(p)
        return Beats.of_wrk(run), other
    items = [names[(start + k) % len(names)] for k in range(count)]

    async def go():  # type: ignore[no-untyped-def]
        return await asyncio.gather(run_open(rate, CONNS, bases, items, beat), *([beside()] if beside else []))
    g0, t0 = time.process_time(), time.perf_counter()
    got, *other = asyncio.run(go())
    took, used = time.perf_counter() - t0, time.process_time() - g0
    # with placements beside, the process's CPU is theirs too: none is reported then
    return Beats.of_python(got, took, used if beside is None else float("nan")), (other[0] if other else None)


def cpu(pids: list[int]) -> float:
    return sum(tree_cpu_s(p) for p in pids)


def loop_cpu(pids: list[int]) -> float:
    """The processes' main threads' CPU (uvicorn's event loop: the requests), seconds."""
    return sum(cpu_s(f) for p in pids if (f := stat_fields(f"/proc/{p}/task/{p}/stat")) is not None)


class Db:
    """The database's own counters and sizes."""

    def __init__(self, url: str, sqlite_path: Path | None):
        self.url, self.path = url, sqlite_path

    def writes(self) -> int:
        """Rows the database wrote so far (PostgreSQL); 0 on SQLite, which counts none."""
        if self.path is not None:
            return 0
        import psycopg
        with psycopg.connect(self.url, autocommit=True) as c:
            c.execute("SELECT pg_stat_force_next_flush()")
            return c.execute("SELECT tup_inserted + tup_updated + tup_deleted FROM pg_stat_database "
                             "WHERE datname = current_database()").fetchone()[0]

    def settle(self, quiet_s: float = 11.0, most_s: float = 90.0) -> float:
        """Wait until the database's write counter has not moved for ``quiet_s``
        (PostgreSQL; at most ``most_s``): the seconds waited. An idle backend reports its
        rows to pg_stat_database up to 10 s late (PGSTAT_IDLE_INTERVAL), so a phase's
        writes showed up in the next phase's count. SQLite counts no writes: 0 at once."""
        if self.path is not None:
            return 0.0
        t0 = since = time.monotonic()
        last = self.writes()
        while time.monotonic() - t0 < most_s:
            time.sleep(1.0)
            now = self.writes()
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet_s:
                break
        return round(time.monotonic() - t0, 1)

    def writes_by_table(self) -> dict[str, int]:
        """Rows written so far per table, the system catalogs' included (PostgreSQL's
        pg_stat_all_tables); {} on SQLite."""
        if self.path is not None:
            return {}
        import psycopg
        with psycopg.connect(self.url, autocommit=True) as c:
            c.execute("SELECT pg_stat_force_next_flush()")
            return {f"{ns}.{t}": n for ns, t, n in c.execute(
                "SELECT schemaname, relname, n_tup_ins + n_tup_upd + n_tup_del FROM pg_stat_all_tables")}

    def fresh_hosts(self, since: float) -> int:
        """Hosts whose liveness (hosts.last_heartbeat, written by the replicas' flushes)
        is ``since`` or later: what the liveness check reads."""
        q = "SELECT count(*) FROM hosts WHERE last_heartbeat >= "
        if self.path is not None:
            with sqlite3.connect(self.path, timeout=30) as c:
                return c.execute(q + "?", (since,)).fetchone()[0]
        import psycopg
        with psycopg.connect(self.url, autocommit=True) as c:
            return c.execute(q + "%s", (since,)).fetchone()[0]

    def history_bytes(self) -> tuple[int, int]:
        """(bytes, rows) of host_days."""
        if self.path is not None:
            with sqlite3.connect(self.path, timeout=30) as c:
                rows = c.execute("SELECT count(*) FROM host_days").fetchone()[0]
                try:
                    size = c.execute("SELECT sum(pgsize) FROM dbstat WHERE name IN "
                                     "('host_days', 'sqlite_autoindex_host_days_1')").fetchone()[0]
                except sqlite3.OperationalError:  # no dbstat: pages of the file as a whole
                    size = None
            return int(size or 0), rows
        import psycopg
        with psycopg.connect(self.url, autocommit=True) as c:
            c.execute("VACUUM host_days")
            return (c.execute("SELECT pg_relation_size('host_days') + pg_indexes_size('host_days')").fetchone()[0],
                    c.execute("SELECT count(*) FROM host_days").fetchone()[0])


def liveness_rows(bases: list[tuple[str, int]]) -> float:
    """The replicas' hyb_sched_liveness_rows_written_total, summed."""
    async def one(c: Conn, _: int) -> float:
        r = await c.request("GET", "/metrics", None, auth("bench-admin"))
        return sum(float(ln.split()[-1]) for ln in r.body.decode().splitlines()
                   if ln.startswith("hyb_sched_liveness_rows_written_total"))
    return sum(asyncio.run(run_clients(len(bases), bases, list(range(len(bases))), one)))


def gc_pauses(bases: list[tuple[str, int]]) -> tuple[float, float]:
    """The replicas' cyclic-GC stops so far (hyb_sched_gc_pause_seconds), summed over
    generations and replicas: (seconds, how many took over 25 ms)."""
    async def one(c: Conn, _: int) -> tuple[float, float]:
        r = await c.request("GET", "/metrics", None, auth("bench-admin"))
        total = count = within = 0.0
        for ln in r.body.decode().splitlines():
            if ln.startswith("hyb_sched_gc_pause_seconds_sum"):
                total += float(ln.split()[-1])
            elif ln.startswith("hyb_sched_gc_pause_seconds_count"):
                count += float(ln.split()[-1])
            elif ln.startswith("hyb_sched_gc_pause_seconds_bucket") and 'le="0.025"' in ln:
                within += float(ln.split()[-1])
        return total, count - within
    got = asyncio.run(run_clients(len(bases), bases, list(range(len(bases))), one))
    return sum(g[0] for g in got), sum(g[1] for g in got)


def day_body(day: str) -> dict:
    return {"days": [{"day": day, "utc_offset_min": 0, "cpus": 48, "samples": 86400,
                      "peak": {"start": "21:00", "end": "22:00", "samples": 3600, "io": 6.25, "vms": 30.5,
                               "other": 2.125},
                      "hours": [20 + h * 3 for h in range(24)], "hist": [4320] * 20, "probe_p99_ms_max": 3.5,
                      "psi_some_avg10_max": 1.25, "foreign_cpu_s": 12.5, "probe_failed": 0}]}


def warm_up(bases: list[tuple[str, int]], names: list[str]) -> None:
    """Each replica's index built (a dry-run placement), its beats answered from memory.
    A replica answers beats from the database until its index is built, and at 100,000
    hosts that cold start under the full beat rate did not end within a minute
    (docs/measurements.md), so the measured phases start warm."""
    async def warm(c: Conn, i: int) -> None:
        await c.request("POST", "/v1/vms?dry_run=true", trace(1)[0].body(),
                        auth("bench-tenant", **{"Idempotency-Key": "w"}))
        await beat(c, names[i])
    asyncio.run(run_clients(len(bases), bases, list(range(len(bases))), warm))
    time.sleep(1.5)  # the flusher's first index refresh


def run_store(label: str, url: str, sqlite_path: Path | None, a: argparse.Namespace, tmp: Path) -> dict:
    if a.only:
        return run_cases(label, url, a, tmp)
    out = run_phases(label, url, sqlite_path, a, tmp)
    out.update(run_cases(label, url, a, tmp, registered=True))
    return out


def run_cases(label: str, url: str, a: argparse.Namespace, tmp: Path, *, registered: bool = False) -> dict:
    """The overload and outage cases asked for, on a fleet registered here unless it is."""
    out: dict = {"store": label, "hosts": a.hosts, "beat_interval_s": a.interval_s} if not registered else {}
    if not a.cases:
        return out
    hosts = fleet(a.hosts)
    names = [h[0] for h in hosts]
    if not registered and any(c != "registrations" for c in a.cases):
        reps = Replicas(config(tmp, url, a, timeout_s=1e6, check_s=0), tmp, 2)
        try:
            reps.start(0)
            reps.start(1)
            out["registered_s"], out["registrations_shed"] = register_all(reps.bases, hosts)
        finally:
            reps.stop()
    for case in a.cases:
        t = time.perf_counter()
        if case == "registrations":
            out.update(registrations(label, url, hosts, a, tmp))
        elif case == "beats":
            out.update(beats_case(url, names, a, tmp))
        elif case == "markdown":
            path = Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite") else None
            out.update(mark_down(url, names, a, tmp, Db(url, path)))
        else:
            out.update(overload(url, names, a, tmp) if case == "overload" else outage(url, names, a, tmp))
        print(f"[{label}] {case} case in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    return out


def beats_case(url: str, names: list[str], a: argparse.Namespace, tmp: Path) -> dict:
    """Phase 2 alone (``--only beats``), on the registered fleet: two replicas started and
    warmed as for phases 1-3 (liveness out of play), the idle phase, the beats, the floor."""
    reps = Replicas(config(tmp, url, a, timeout_s=1e6, check_s=0), tmp, 2)
    path = Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite") else None
    try:
        reps.start(0)
        reps.start(1)
        warm_up(reps.bases, names)
        n = int(a.hosts / a.interval_s * a.seconds)
        return beats_alone(a, reps, names, 0, n, tmp, Db(url, path))
    finally:
        reps.stop()


def registrations(label: str, url: str, hosts: list[tuple], a: argparse.Namespace, tmp: Path) -> dict:
    """Registrations/s, each way on a database of its own and the same two replicas'
    setup: the baseline, one write transaction per registration (``register_batch = 0``,
    the path before batches), over the first --baseline-hosts hosts; then the batched
    path (the shipped ``register_batch``, 64) over all of them. The ratio compares the
    two rates; the baseline over fewer hosts is, if anything, the faster (a smaller
    table)."""
    out: dict = {}
    base_n = min(len(hosts), a.baseline_hosts)
    for key, batch, subset in (("base", 0, hosts[:base_n]), ("batched", 64, hosts)):
        db_url = fresh_database(url, tmp, f"reg_{key}")
        reps = Replicas(config(tmp, db_url, a, timeout_s=1e6, check_s=0,
                               register_batch=batch), tmp, 2)
        try:
            reps.start(0)
            reps.start(1)
            c0, g0 = cpu(reps.pids), time.process_time()
            m0 = machine()
            took, shed = register_all(reps.bases, subset)
            used, gen = cpu(reps.pids) - c0, time.process_time() - g0
            busy, stolen = machine_load(m0, machine())
            counted = asyncio.run(run_clients(1, reps.bases, [0], lambda c, _: count_hosts(c)))[0]
        finally:
            reps.stop()
        assert counted == len(subset), f"{label} {key}: {counted} hosts registered of {len(subset)}"
        out[f"reg_{key}_hosts"] = len(subset)
        out[f"reg_{key}_s"] = took
        out[f"reg_{key}_per_s"] = round(len(subset) / took, 1)
        out[f"reg_{key}_shed"] = shed
        out[f"reg_{key}_server_cpu_ms_per_reg"] = round(used / len(subset) * 1e3, 3)
        out[f"reg_{key}_generator_cpu_ms_per_reg"] = round(gen / len(subset) * 1e3, 3)  # this process's
        out[f"reg_{key}_cpus_busy"], out[f"reg_{key}_cpus_stolen"] = round(busy, 2), round(stolen, 2)
        print(f"[{label}] registrations, {key} (register_batch={batch}): {len(subset)} in {took} s "
              f"({out[f'reg_{key}_per_s']}/s, {shed} shed)", file=sys.stderr)
    out["reg_baseline"] = "one write transaction per registration (register_batch = 0)"
    out["reg_ratio"] = round(out["reg_batched_per_s"] / out["reg_base_per_s"], 2)
    return out


async def count_hosts(c: Conn) -> int:
    r = await c.request("GET", "/v1/fleet/hosts", None, auth("bench-admin"))
    assert r.status == 200, r.body[:300]
    return int(json.loads(r.body)["hosts"])


def fresh_database(url: str, tmp: Path, name: str) -> str:
    """An empty database beside ``url``'s: a SQLite file in ``tmp``, or one more database
    on the same PostgreSQL server."""
    if url.startswith("sqlite"):
        return f"sqlite:///{tmp}/{name}.db"
    base, _, _ = url.rpartition("/")
    create_database(int(base.rsplit(":", 1)[1]), name)
    return f"{base}/{name}"


def register_all(bases: list[tuple[str, int]], hosts: list[tuple]) -> tuple[float, int]:
    """Every host registered through the API, 32 at a time, as hostd sends it: told to come
    back later (503 with Retry-After: a replica shedding), it waits as hostd does
    (``wait_after``). (The seconds it took, how many registrations were shed.) The
    bodies are built before the clock starts (a layout per shape), so the generator's
    share of the 2 CPUs is sending, not building."""
    import random  # noqa: PLC0415
    from hostd.rpc.register import wait_after  # noqa: PLC0415
    rng = random.Random(1)
    shed = 0
    shapes: dict[str, dict] = {}
    bodies = []
    for name, shape, rack in hosts:
        if shape.name not in shapes:
            shapes[shape.name] = register_body("x", shape, "")
        bodies.append(json.dumps({**shapes[shape.name], "name": name, "address": f"{name}:7443",
                                  "rack": rack}).encode())

    async def register(c: Conn, body: bytes) -> int:
        nonlocal shed
        while True:
            r = await c.request("POST", "/v1/hosts", body, auth("bench-host"))
            if r.status == 503 and r.headers.get("retry-after"):
                shed += 1
                await asyncio.sleep(wait_after(interval_s=10, failures=0, later=float(r.headers["retry-after"]),
                                               rng=rng))
                continue
            assert r.status in (200, 201), r.body[:300]
            return r.status
    t = time.perf_counter()
    asyncio.run(run_clients(32, bases, bodies, register))
    return round(time.perf_counter() - t, 1), shed


def windows_of(items: list, k: int) -> list[list]:
    """``items`` in ``k`` slices of the same length, in order."""
    size = len(items) // k
    return [items[i * size:(i + 1) * size] for i in range(k)]


@dataclass
class Placed:
    """The placements of one kind of window (alone, or beside the beats), pooled."""

    due: list[float] = field(default_factory=list)  # from when each was due (open loop)
    sent: list[float] = field(default_factory=list)  # from when each was sent
    claims: list[float] = field(default_factory=list)  # inside the replica (Server-Timing)
    refused: int = 0  # 507: no host fits
    # CPU-s over the windows by part, and their wall time ("wall")
    by_window: list[float | None] = field(default_factory=list)  # each window's claim p99, ms
    _claims_seen: int = 0
    cpu: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        ("wall", "replicas", "this_process", "beat_generator", "machine", "stolen"), 0.0))

    def cpus(self, part: str) -> float:
        """``part``'s CPUs on average over these windows."""
        return round(self.cpu[part] / self.cpu["wall"], 2) if self.cpu["wall"] else 0.0

    def add(self, got: list) -> None:
        """One window's placements; its claims are already in ``claims``."""
        fresh = self.claims[self._claims_seen:]
        self._claims_seen = len(self.claims)
        self.by_window.append(round(percentile(fresh, 0.99) * 1e3, 1) if fresh else None)
        for (st, took), lat in got:
            if st == 202:
                self.due.append(lat)
                self.sent.append(took)
            self.refused += st == 507

    def report(self, suffix: str, seconds: float) -> dict:
        def p99(xs: list[float]) -> float | None:
            return round(percentile(xs, 0.99) * 1e3, 2) if xs else None
        return {f"placed_per_s{suffix}": round(len(self.due) / seconds, 1),
                f"refused_for_capacity{suffix}": self.refused,
                f"placement_p99_ms{suffix}": p99(self.due),
                f"placement_p99_ms_from_send{suffix}": p99(self.sent),
                f"claim_p99_ms{suffix}": p99(self.claims)}


def run_phases(label: str, url: str, sqlite_path: Path | None, a: argparse.Namespace, tmp: Path) -> dict:
    hosts = fleet(a.hosts)
    names = [h[0] for h in hosts]
    reqs = trace(int(a.rate * a.seconds * 3 + a.rate * a.seconds / a.rounds) + 10)
    beat_rate = a.hosts / a.interval_s
    db = Db(url, sqlite_path)
    out: dict = {"store": label, "hosts": a.hosts, "beat_interval_s": a.interval_s}
    if label == "pg":
        out["claim_lock"] = a.claim_lock
    # Phases 1-3 and 5: liveness out of play (a timeout no pause reaches), as bench/placement.py
    reps = Replicas(config(tmp, url, a, timeout_s=1e6, check_s=0), tmp, 2)
    try:
        reps.start(0)  # the first migrates the store
        reps.start(1)
        bases = reps.bases

        out["registered_s"], out["registrations_shed"] = register_all(bases, hosts)
        print(f"[{label}] registered {a.hosts} hosts in {out['registered_s']} s", file=sys.stderr)

        warm_up(bases, names)
        stream = Stream(names)

        # 1. a window of placements, untimed: the first after registration pays for what
        # warms (the servers' caches, the claim thread's first batches) and was, timed as the
        # baseline, 117 ms at p99 against 39 ms beside the beats in a later window
        windows = iter(windows_of(reqs, 3 * a.rounds + 1))
        placed_ids: list[str] = []
        asyncio.run(run_open(a.rate, PLACE_CONNS, bases, next(windows), placer("p1", placed_ids)))
        delete_all(bases, placed_ids)

        # 2. heartbeats alone: CPU and database writes per beat, once phase 1's rows are
        # counted (PostgreSQL reports an idle backend's rows up to 10 s late: phase 1's
        # claims were most of the rows counted here); the replicas idle, the floor
        out["phase1_tail_s"] = db.settle()
        n = int(beat_rate * a.seconds)
        out.update(beats_alone(a, reps, names, stream.take(n), n, tmp, db))

        # 3. placements alone, beside the beats, and beside the same beats sent to the
        # bare-ASGI floor instead (the control: what answering beats at all costs this
        # machine's placements, with none of the scheduler's own work), in windows taken
        # in turn (alone, beside, floor; floor, beside, alone; ...), each placing into the
        # same free fleet: the machine's drift over the run falls on every kind alike
        alone, beside, floored = Placed(), Placed(), Placed()
        beaten: list[Beats] = []
        # --split: a load balancer that sends beats to one replica and the API to the other
        place_to, beat_to = (bases[1:], bases[:1]) if a.split else (bases, bases)
        win_n = int(beat_rate * a.seconds / a.rounds)
        floor = Floor(reps.cfg, tmp, len(beat_to))
        try:
            for i in range(len(beat_to)):
                floor.start(i)
            kinds = [("alone", alone, None), ("beats", beside, beat_to), ("floor", floored, floor.bases)]
            for k in range(a.rounds):
                for kind, into, beats_to in (kinds if k % 2 == 0 else kinds[::-1]):
                    items = next(windows)
                    prefix = f"p3-{k}-{kind}"  # idempotency keys of this window alone

                    def placements(items=items, into=into, prefix=prefix):  # type: ignore[no-untyped-def]
                        return run_open(a.rate, PLACE_CONNS, place_to, items, placer(prefix, placed_ids, into.claims))
                    m0, c0, g0, t0 = machine(), cpu(reps.pids), time.process_time(), time.monotonic()
                    if beats_to is not None:
                        got, placed = send_beats(a, beats_to, names, stream.take(win_n), win_n, beat_rate, tmp,
                                                 f"{kind}-{k}", beside=placements)
                        if into is beside:
                            beaten.append(got)
                        # wrk's own; the python generator's is this process's, counted below
                        into.cpu["beat_generator"] += got.generator_cpu_s if a.generator == "wrk" else 0.0
                    else:
                        placed = asyncio.run(placements())
                    wall = time.monotonic() - t0
                    busy, stolen = machine_load(m0, machine())
                    into.cpu["wall"] += wall
                    into.cpu["replicas"] += cpu(reps.pids) - c0
                    into.cpu["this_process"] += time.process_time() - g0
                    into.cpu["machine"] += busy * wall
                    into.cpu["stolen"] += stolen * wall
                    into.add(placed)
                    delete_all(bases, placed_ids)
        finally:
            floor.stop()
        out.update(alone.report("", a.seconds))
        out.update(beside.report("_with_beats", a.seconds))
        out.update(floored.report("_beats_to_floor", a.seconds))
        out["placement_windows"] = f"{a.rounds} of each kind (alone, beside the beats, beside the floor's), " \
                                   f"{a.seconds / a.rounds:g} s each"
        # the same requests' claim p99 window by window, each kind in its windows' order
        out["claim_p99_ms_by_window"] = {"alone": alone.by_window, "with_beats": beside.by_window,
                                         "beats_to_floor": floored.by_window}
        for key, num, den, digits in (
                ("placed_ratio_with_beats", "placed_per_s_with_beats", "placed_per_s", 3),
                ("placement_p99_ratio", "placement_p99_ms_with_beats", "placement_p99_ms", 2),  # the bar's
                ("claim_p99_ratio", "claim_p99_ms_with_beats", "claim_p99_ms", 2),
                ("placement_p99_ratio_from_send", "placement_p99_ms_from_send_with_beats",
                 "placement_p99_ms_from_send", 2),
                # the control: the floor's beats against none, and the scheduler's own share,
                # beside its beats against beside the floor's
                ("placement_p99_ratio_floor", "placement_p99_ms_beats_to_floor", "placement_p99_ms", 2),
                ("placement_p99_ratio_vs_floor", "placement_p99_ms_with_beats", "placement_p99_ms_beats_to_floor", 2),
                ("claim_p99_ratio_vs_floor", "claim_p99_ms_with_beats", "claim_p99_ms_beats_to_floor", 2)):
            out[key] = round(out[num] / out[den], digits) if out[num] and out[den] else None
        out["beats_answered_with_placements"] = sum(b.ok for b in beaten)
        out["beats_sent_with_placements"] = sum(b.sent for b in beaten)
        p99s = [b.p99_s for b in beaten if b.p99_s is not None]
        out["beat_p99_ms_with_placements"] = round(max(p99s) * 1e3, 2) if p99s else None  # the worst window's
        lates = [b.late for b in beaten if b.late is not None]
        out["beats_late_with_placements"] = sum(lates) if lates else None
        out["cpus_busy_with_placements"] = beside.cpus("machine")
        out["cpus_stolen_with_placements"] = beside.cpus("stolen")
        # where the 2 CPUs went, each kind of window (CPUs on average over its windows): the
        # replicas (placements alone; placements and beats), the generators (this process:
        # the placements, and with --generator python the beats too; wrk: the beats), the
        # machine as a whole (the database server, other work): what one more core buys
        out["cpu_budget"] = {kind: {part: w.cpus(part) for part in ("replicas", "this_process", "beat_generator",
                                                                    "machine", "stolen")}
                             for kind, w in (("alone", alone), ("with_beats", beside), ("beats_to_floor", floored))}
        out["cpu_budget"]["beats_in_replicas"] = round(beside.cpus("replicas") - alone.cpus("replicas"), 2)

        # 4. a day from every host: the history's size
        day = dt.date.today().isoformat()

        async def send_day(c: Conn, n: str) -> int:
            r = await c.request("POST", f"/v1/hosts/{n}/days", day_body(day), auth("bench-host"))
            return r.status
        codes = asyncio.run(run_clients(32, bases, names, send_day))
        assert all(s == 202 for s in codes), sorted(set(codes))
        time.sleep(2.5)  # the flush
        size, n = db.history_bytes()
        out["history_bytes_per_host_day"] = round(size / n, 1) if n and size else None
    finally:
        reps.stop()
    if not a.no_markdown:
        out.update(mark_down(url, names, a, tmp, db))
    return out


def beats_alone(a: argparse.Namespace, reps: Replicas, names: list[str], start: int, n: int, tmp: Path,
                db: Db) -> dict:
    """Phase 2: ``n`` heartbeats at the fleet's rate from ``names[start:]`` on, nothing
    else. Before them, the replicas idle for --idle-s (their fixed CPU a second, beside
    the floor's, measured at the same time); after them, the same beats at the same rate
    from the same generator to the bare-ASGI floor (bench/floor_app.py, one process a
    replica): its CPU per request, the least this stack takes for the beat's request.
    ``cpu_us_per_beat`` is the replicas' CPU over the beats' window per beat answered,
    as before; ``cpu_us_per_beat_net`` is that less their idle CPU over the same window,
    and ``cpu_over_floor`` is the net against the floor's net (the floor's idle CPU
    taken off its own the same way)."""
    bases = reps.bases
    beat_rate = a.hosts / a.interval_s
    out: dict = {}
    floor = Floor(reps.cfg, tmp, len(bases))
    try:
        for i in range(len(bases)):
            floor.start(i)
        idle, floor_idle = idle_cpu([reps.pids, floor.pids], a.idle_s)
        out["idle_cpu_ms_per_s"] = idle  # a replica's, with nothing sent to it
        out["floor_idle_cpu_ms_per_s"] = floor_idle
        c0, w0, r0, t0 = cpu(reps.pids), db.writes(), liveness_rows(bases), db.writes_by_table()
        g0 = gc_pauses(bases)
        m0, wall0, l0 = machine(), time.monotonic(), loop_cpu(reps.pids)
        got, _ = send_beats(a, bases, names, start, n, beat_rate, tmp, "alone")
        busy, stolen = machine_load(m0, machine())
        time.sleep(1.2)  # the last flush
        used, writes, rows = cpu(reps.pids) - c0, db.writes() - w0, liveness_rows(bases) - r0
        window, loop_used = time.monotonic() - wall0, loop_cpu(reps.pids) - l0
        g1 = gc_pauses(bases)
        by_table = {k: n - t0.get(k, 0) for k, n in db.writes_by_table().items() if n - t0.get(k, 0) > 0}
        # the floor: the same generator, rate and count; its CPU counted the same way
        f0, fwall0, fl0 = cpu(floor.pids), time.monotonic(), loop_cpu(floor.pids)
        fgot, _ = send_beats(a, floor.bases, names, start, n, beat_rate, tmp, "floor")
        time.sleep(1.2)
        fused, fwindow, floop = cpu(floor.pids) - f0, time.monotonic() - fwall0, loop_cpu(floor.pids) - fl0
    finally:
        floor.stop()
    out["generator"] = a.generator
    out["beats_offered_per_s"] = round(beat_rate, 1)
    out["beats_sent"] = got.sent
    out["beats_per_s"] = round(got.ok / got.took_s, 1) if got.took_s else None
    out["beat_p99_ms"] = round(got.p99_s * 1e3, 2) if got.p99_s is not None else None
    out["beats_late"] = got.late
    out["cpu_us_per_beat"] = round(used / max(1, got.ok) * 1e6, 1)
    net = used - idle * len(bases) / 1e3 * window
    out["cpu_us_per_beat_net"] = round(net / max(1, got.ok) * 1e6, 1)
    floor_net = fused - floor_idle * len(bases) / 1e3 * fwindow
    out["floor_cpu_us_per_beat"] = round(floor_net / max(1, fgot.ok) * 1e6, 1)
    # of which the event loop's thread (the requests) and the floor's (the same for it)
    out["cpu_us_per_beat_loop"] = round(loop_used / max(1, got.ok) * 1e6, 1)
    out["floor_cpu_us_per_beat_loop"] = round(floop / max(1, fgot.ok) * 1e6, 1)
    out["floor_beats_answered"] = fgot.ok
    out["floor_beat_p99_ms"] = round(fgot.p99_s * 1e3, 2) if fgot.p99_s is not None else None
    out["cpu_over_floor"] = round(net / floor_net * fgot.ok / max(1, got.ok), 2) if floor_net > 0 else None
    out["generator_cpu_us_per_beat"] = round(got.generator_cpu_s / max(1, got.sent) * 1e6, 1)
    # the replicas' cyclic-GC stops over the beats' window: their time a beat, and the long ones
    out["gc_us_per_beat"] = round((g1[0] - g0[0]) / max(1, got.ok) * 1e6, 2)
    out["gc_pauses_over_25ms"] = int(g1[1] - g0[1])
    # PostgreSQL: every row it wrote (its statistics); SQLite has no such counter: the
    # liveness rows the replicas wrote (their hyb_sched_liveness_rows_written_total)
    out["db_writes_per_beat"] = round((writes if db.path is None else rows) / max(1, got.ok), 4)
    out["db_writes_from"] = "pg_stat_database" if db.path is None else "scheduler metrics"
    if by_table:  # PostgreSQL: where those rows were written, most first
        out["db_writes_by_table"] = dict(sorted(by_table.items(), key=lambda kv: -kv[1])[:8])
    # the whole machine while the beats were sent (replicas, database, generator): of 2 CPUs
    out["cpus_busy_beats"], out["cpus_stolen_beats"] = round(busy, 2), round(stolen, 2)
    return out


class Stream:
    """The fleet's beats in hostd's order: every host once per round, round after round."""

    def __init__(self, names: list[str]):
        self.names, self.i = names, 0

    def take(self, n: int) -> int:
        """The stream's position before the next ``n`` beats, which it then passes."""
        self.i += n
        return self.i - n


def mark_down(url: str, names: list[str], a: argparse.Namespace, tmp: Path, db: Db) -> dict:
    """Phase 5, with the liveness timings in play: every host beats every interval_s
    through the replicas' grace period; then 1 % of them (spread over the racks) stop,
    the others beat on, and one replica is restarted in the middle. How long after its
    last beat each silent host was marked down (the audit's host.down rows), and how
    many hosts that kept beating were marked (false downs)."""
    # The fleet was registered and then silent (the registration phase): each host is past
    # the timeout until its first beat of this phase. The warm round below beats them all
    # over 1.5 beat intervals, and behind the fleet's first round (100,000 hosts back from
    # down, each a row written) the generator runs seconds late: with the grace at the
    # timeout, the replicas judged before the round reached the end of a list and marked
    # those never-yet-beaten hosts (964 and 1,476 in two runs at 100,000). So the grace
    # outlasts the warm round; the silent hosts stop after it, so it delays no mark.
    warm_s = 1.5 * a.interval_s
    reps = Replicas(config(tmp, url, a, timeout_s=a.timeout_s, check_s=a.check_s,
                          interval_s=a.interval_s, grace_s=a.timeout_s + warm_s), tmp, 2)
    silent = set(names[::100])
    last: dict[str, float] = {}
    answered: set[str] = set()  # the silent hosts whose last beat was answered 200
    seen: list[str] = []  # every 5 s: how many hosts' liveness the database holds from this phase
    done = threading.Event()

    def watch(since: float) -> None:
        while not done.wait(5):
            seen.append(f"+{time.time() - since:.0f} s: {db.fresh_hosts(since)}")
    try:
        reps.start(0)
        reps.start(1)
        warm_up(reps.bases, names)  # as phase 1; the restart in the middle is not warmed (hostd does not wait)
        t_start = time.time()
        watcher = threading.Thread(target=watch, args=(t_start,), daemon=True)
        watcher.start()
        bases = reps.bases
        rate = len(names) / a.interval_s

        async def timed_beat(c: Conn, name: str) -> tuple[int, float]:
            got = await beat(c, name)
            if got[0] == 0:  # its replica is restarting: sent to replica 0, as a load balancer in front would
                other = Conn(*bases[0])
                try:
                    got = await beat(other, name)
                finally:
                    other.close()
            if got[0] in (200, 503):  # a beat shed (503, Retry-After) still counts for its host's liveness
                last[name] = time.time()
                if got[0] == 200:
                    answered.add(name)
            return got

        # every host beats once (the replicas mark nothing during their grace period anyway)
        warm = int(rate * warm_s)
        talking = [n for n in names if n not in silent]
        span = a.timeout_s + 2 * a.check_s + a.interval_s
        if a.generator == "wrk":
            runs = [wait_wrk(start_beats(bases, names, start=0, count=warm, rate=rate, seconds=warm / rate + 1,
                                         tmp=tmp, label="warm"))]
            def settled() -> bool:
                try:
                    return len(asyncio.run(audit_rows(bases[:1], "host.down"))) >= len(silent)
                except (OSError, ValueError, KeyError):
                    return False
            got_runs, restart_s = keep_beating_wrk(reps, talking, sorted(silent), timed_beat, rate, span, a.timeout_s,
                                                   tmp, settled)
            runs += got_runs
            sent, ok = sum(r.sent for r in runs) + len(silent), sum(r.answered(200) for r in runs) + len(answered)
            late: int | None = sum(int(r.report.get("late_1ms", 0)) for r in runs)
            # a beat sent more than a timeout late left its host silent at the replicas:
            # a closed-loop generator's backlog, which no replica sees as its own lag
            max_late_s: float | None = round(max(float(r.report.get("max_late_us", 0)) for r in runs) / 1e6, 2)
        else:
            got = asyncio.run(run_open(rate, CONNS, bases, [names[k % len(names)] for k in range(warm)], timed_beat))
            # the silent hosts' last beats after the warm round, as on the wrk path: the
            # mark-down's zero, after the grace's start
            last_beats = asyncio.run(run_clients(8, bases, sorted(silent), timed_beat))
            items = [talking[k % len(talking)] for k in range(int(rate * span))]

            async def keep_beating():  # type: ignore[no-untyped-def]
                loop = asyncio.get_running_loop()

                def restart() -> float:
                    time.sleep(span / 3)
                    r0 = time.monotonic()
                    reps.restart(1)
                    return time.monotonic() - r0
                restarted = loop.run_in_executor(None, restart)
                got = await run_open(rate, CONNS, bases, items, timed_beat)
                return got, await restarted
            more, restart_s = asyncio.run(keep_beating())
            got += more
            sent = len(got) + len(last_beats)
            ok = sum(1 for (st, _), _l in got if st == 200) + sum(1 for st, _ in last_beats if st == 200)
            late, max_late_s = None, None

        rows = asyncio.run(audit_rows(bases[:1], "host.down"))  # paged: 100,000 hosts have 1,000 silent
        events = asyncio.run(audit_rows(bases[:1], "fleet.silence"))
        shed = shed_counts(bases)  # replica 0's, and replica 1's since its restart
    finally:
        done.set()
        reps.stop()
    marked = {x["target"]: x["at"] for x in rows}
    lag = [marked[n] - last[n] for n in silent if n in marked and n in last]
    return {"silent_hosts": len(silent), "marked_down": len([n for n in silent if n in marked]),
            "mark_down_s_p50": round(percentile(lag, 0.5), 2) if lag else None,
            "mark_down_s_p99": round(percentile(lag, 0.99), 2) if lag else None,
            "false_downs": len([n for n in marked if n not in silent]),
            # what the generator sent in this phase and what was answered 200, and the
            # liveness events the replicas logged (many hosts silent at once: none marked)
            "mark_down_beats_sent": sent, "mark_down_beats_answered": ok, "mark_down_beats_late": late,
            "mark_down_beats_max_late_s": max_late_s,
            "replica_restart_s": round(restart_s, 1),  # replica 1 stopped to answering again
            "mark_down_shed": shed,
            # liveness checks a replica skipped because it lagged or shed (its log's warnings)
            "liveness_checks_skipped": [sum(1 for ln in (tmp / f"replica-{i}.log").read_text(errors="replace")
                                            .splitlines() if "liveness check skipped" in ln) for i in range(2)],
            "liveness_events": [f"{time.strftime('%H:%M:%S', time.gmtime(e['at']))} {e['detail'].get('event')}"
                                for e in sorted(events, key=lambda e: e["at"])],
            "liveness_in_db": seen,
            "liveness": {"timeout_s": a.timeout_s, "write_s": a.write_s, "check_s": a.check_s,
                         "period_s": a.period_s}}


def keep_beating_wrk(reps: Replicas, talking: list[str], silent: list[str], timed_beat, rate: float,  # type: ignore[no-untyped-def]
                     span: float, after_s: float, tmp: Path, settled=lambda: True) -> tuple[list[WrkRun], float]:
    """Phase 5's beats through wrk: the hosts that keep beating for ``span`` seconds, and
    at least ``after_s`` after replica 1 is back, one wrk a replica, routed as a load
    balancer would while replica 1 restarts. A wrk connection that loses its server never
    reconnects, so replica 1's wrk runs until the restart; just before replica 1 is
    stopped a wrk takes its hosts' beats to replica 0 from where the stream stopped, and
    once replica 1 answers again that one is stopped (SIGINT: wrk still reports) and a new
    wrk beats replica 1's hosts to it from where the stream then is: no beat skipped, none
    sent twice (each starts up to a wrk's start-up late). However long the restart takes
    (at 100,000 hosts its index's first pass), the beats go on: the wrks that run to the
    end are started long and stopped; past the time, they go on until ``settled()`` (every
    silent host marked: a replica that carried the whole fleet during the restart may
    have shed and so judged nothing for a while) or the wrks' length. The silent hosts'
    last beats come from this process, timed. Returns every run (their beats are the
    phase's) and the restart's time."""
    half = [talking[0::2], talking[1::2]]
    bases = reps.bases
    t0 = time.monotonic()
    first = span / 3
    most = span + 300  # the longest a replica's start is waited for (Replicas.start)

    def beats(base: tuple[str, int], names: list[str], pos: int, seconds: float, label: str) -> subprocess.Popen:
        return start_beats([base], names, start=pos, count=int(rate / 2 * seconds), rate=rate / 2,
                           seconds=seconds + (1 if seconds < most else 0), tmp=tmp, label=label)
    running: list[subprocess.Popen] = [beats(bases[0], half[0], 0, most, "talk-0")]
    runs: list[WrkRun] = []
    try:
        w1 = beats(bases[1], half[1], 0, first, "talk-1a")
        asyncio.run(run_clients(8, bases, silent, timed_beat))
        runs.append(wait_wrk(w1))
        pos = runs[-1].sent  # replica 1's hosts' stream stopped here
        running.append(beats(bases[0], half[1], pos, most, "talk-1-to-0"))  # the balancer: replica 1 goes away
        r0 = time.monotonic()
        reps.restart(1)
        back = time.monotonic()
        runs.append(stop_wrk(running.pop()))  # replica 1 answers again: its hosts go back to it
        pos += runs[-1].sent
        running.append(beats(bases[1], half[1], pos, most, "talk-1b"))
        time.sleep(max(0.0, max(t0 + span, back + after_s) - time.monotonic()))
        while time.monotonic() < t0 + most - 5 and not settled():
            time.sleep(2)
    finally:
        runs += [stop_wrk(w) for w in running]
    return runs, back - r0


# ---------------------------------------------------------------- hostd's own clients


class Fleet:
    """The fleet as hostd's heartbeat clients behave (hostd/rpc/register.py), one asyncio
    task a host, in this process: a beat, then the wait ``wait_after`` says (the interval
    less up to a tenth; a Retry-After and up to half more; after failures, jittered
    backoff capped at the interval). Host i's beats go to replica i % 2 unless it refuses
    the connection (stopped, restarting), then to the other, as a load balancer would;
    both away: a failure. Every attempt is logged: (when, host index, status; 0 = no
    replica answered)."""

    def __init__(self, names: list[str], bases: list[tuple[str, int]], interval_s: float, *, seed: int = 5):
        self.names, self.bases, self.interval_s, self.seed = names, bases, interval_s, seed
        self.log: list[tuple[float, int, int]] = []
        self.stop = False
        self.pools: list[asyncio.Queue[Conn]] = []

    async def _send(self, i: int, name: str) -> tuple[int, float | None]:
        from hostd.rpc.register import retry_after  # noqa: PLC0415 - the bench's own import path
        for k in (i % len(self.bases), (i + 1) % len(self.bases)):
            c = await self.pools[k].get()
            try:
                r = await c.request("POST", f"/v1/hosts/{name}/heartbeat", None, auth("bench-host"))
            except (OSError, asyncio.IncompleteReadError):
                c.close()
                continue
            finally:
                self.pools[k].put_nowait(c)
            ra = None
            if r.status in (429, 503) and r.headers.get("retry-after"):
                ra = retry_after(_Headers(r.headers))  # type: ignore[arg-type]
            return r.status, ra
        return 0, None

    async def _host(self, i: int, name: str) -> None:
        from hostd.rpc.register import wait_after  # noqa: PLC0415
        import random  # noqa: PLC0415
        rng = random.Random(self.seed * 1_000_003 + i)
        await asyncio.sleep(rng.uniform(0, self.interval_s))
        failures, later = 0, None
        while not self.stop:
            t = time.time()
            st, ra = await self._send(i, name)
            self.log.append((t, i, st))
            if st == 200:
                failures, later = 0, None
            elif ra is not None:
                failures, later = 0, ra
            else:
                failures += 1
            await asyncio.sleep(wait_after(interval_s=self.interval_s, failures=failures, later=later, rng=rng))

    async def run(self, until: asyncio.Event) -> None:
        self.pools = []
        for h, p in self.bases:
            q: asyncio.Queue[Conn] = asyncio.Queue()
            for _ in range(CONNS // 2):
                q.put_nowait(Conn(h, p))
            self.pools.append(q)
        tasks = [asyncio.create_task(self._host(i, n)) for i, n in enumerate(self.names)]
        await until.wait()
        self.stop = True
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for q in self.pools:
            while not q.empty():
                q.get_nowait().close()

    def window(self, t0: float, t1: float) -> list[tuple[float, int, int]]:
        return [x for x in self.log if t0 <= x[0] < t1]

    def heard_gaps(self, t0: float, t1: float) -> list[float]:
        """Per host, the gaps between beats the scheduler counted (200, or 503 shed:
        counted too) within [t0, t1): how silent each host looked."""
        last: dict[int, float] = {}
        gaps: list[float] = []
        for t, i, st in self.log:
            if st in (200, 503) and t < t1:
                if i in last and t >= t0:
                    gaps.append(t - last[i])
                last[i] = t
        return gaps


class _Headers:
    """A bench reply's headers where ``hostd.rpc.register.retry_after`` reads an httpx response's."""

    def __init__(self, headers: dict[str, str]):
        self.headers = headers


def statuses(rows: list[tuple[float, int, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for _t, _i, st in rows:
        k = {0: "unreachable"}.get(st, str(st))
        out[k] = out.get(k, 0) + 1
    return dict(sorted(out.items()))


def shed_counts(bases: list[tuple[str, int]]) -> dict[str, float]:
    """The replicas' hyb_sched_shed_total by kind, summed."""
    async def one(c: Conn, _: int) -> dict[str, float]:
        try:
            r = await c.request("GET", "/metrics", None, auth("bench-admin"))
        except OSError:
            return {}
        got: dict[str, float] = {}
        for ln in r.body.decode().splitlines():
            if ln.startswith("hyb_sched_shed_total{"):
                kind = ln.split('kind="', 1)[1].split('"', 1)[0]
                got[kind] = got.get(kind, 0) + float(ln.split()[-1])
        return got
    out: dict[str, float] = {}
    for d in asyncio.run(run_clients(len(bases), bases, list(range(len(bases))), one)):
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out


async def audit_rows(bases: list[tuple[str, int]], action: str) -> list[dict]:
    c = Conn(*bases[0])
    rows: list[dict] = []
    before = ""
    try:
        while True:
            r = await c.request("GET", f"/v1/audit?action={action}&limit=1000{before}", None, auth("bench-admin"))
            page = json.loads(r.body)
            rows += page["items"]
            if not page.get("next"):
                return rows
            before = f"&before={page['next']}"
    finally:
        c.close()


def placer(prefix: str, ids: list[str], claims: list[float] | None = None):  # type: ignore[no-untyped-def]
    """A placement request timed, its idempotency key of this case's own (the cases share
    the store), the ids of the VMs placed kept for ``delete_all``. ``claims``: each placed
    request's own time in the replica (its ``Server-Timing: claim``: from the handler's
    start, the body read, to the claim committed, waiting for the claim thread included),
    so the server's share of the tail can be told from the machine's (the event loop's
    queue before the handler, the generator's own scheduling)."""
    async def one(c: Conn, r) -> tuple[int, float]:  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        rep = await c.request("POST", "/v1/vms", r.body(), auth("bench-tenant", **{"Idempotency-Key": f"{prefix}-{r.i}"}))
        took = time.perf_counter() - t
        if rep.status == 202:
            ids.append(rep.json()["id"])
            if claims is not None and (srv := server_timing_s(rep.headers)) is not None:
                claims.append(srv)
        return rep.status, took
    return one


def delete_all(bases: list[tuple[str, int]], ids: list[str]) -> None:
    """The VMs a window placed go (the next window places into the same free fleet)."""
    async def one(c: Conn, vm_id: str) -> int:
        return (await c.request("DELETE", f"/v1/vms/{vm_id}", None, auth("bench-tenant"))).status
    codes = asyncio.run(run_clients(16, bases, list(ids), one))
    assert all(st in (200, 202, 204) for st in codes), sorted(set(codes))
    ids.clear()


def loop_lag(bases: list[tuple[str, int]]) -> float:
    """The replicas' worst event-loop lateness of the last 30 s (hyb_sched_lag_seconds)."""
    async def one(c: Conn, _: int) -> float:
        r = await c.request("GET", "/metrics", None, auth("bench-admin"))
        return max((float(ln.split()[-1]) for ln in r.body.decode().splitlines()
                    if ln.startswith('hyb_sched_lag_seconds{of="event_loop"}')), default=0.0)
    return max(asyncio.run(run_clients(len(bases), bases, list(range(len(bases))), one)))


def p99_ms(got: list) -> tuple[float | None, int]:
    ok = [lat for (st, _), lat in got if st == 202]
    return (round(percentile(ok, 0.99) * 1e3, 2) if ok else None), len(ok)


def overload(url: str, names: list[str], a: argparse.Namespace, tmp: Path) -> dict:
    """The CPU-hog case: two replicas with the liveness timings in play, the fleet beating
    as hostd does (``Fleet``) through their grace, then placements open loop at --rate in
    three windows of --hog-s seconds: before, while ``stress-ng --cpu 2`` takes the
    machine's CPUs, after. This process (hostd's stand-in: in a fleet it runs on the
    hosts, not here) is raised to nice -10 so the hog starves the replicas, not the
    fleet's clocks (not root: it shares the CPUs and says so). Hosts all keep beating:
    any host.down is a false down."""
    import os  # noqa: PLC0415
    reps = Replicas(config(tmp, url, a, timeout_s=a.timeout_s, check_s=a.check_s,
                          interval_s=a.interval_s), tmp, 2)
    out: dict = {}
    reqs = trace(int(a.rate * a.hog_s * 3) + 10)
    try:
        os.nice(-10)
        out["overload_generator_nice"] = -10
    except PermissionError:
        out["overload_generator_nice"] = 0
    hog: subprocess.Popen | None = None
    try:
        reps.start(0)
        reps.start(1)
        warm_up(reps.bases, names)
        fleet = Fleet(names, reps.bases, a.interval_s)

        async def go() -> dict:
            nonlocal hog
            until = asyncio.Event()
            beating = asyncio.create_task(fleet.run(until))
            await asyncio.sleep(a.timeout_s + 2 * a.interval_s)  # the grace: every host heard
            n = int(a.rate * a.hog_s)
            res: dict = {}
            ids: list[str] = []
            loop = asyncio.get_running_loop()
            for k, label in enumerate(("before", "hog", "after")):
                if label == "hog":
                    hog = subprocess.Popen(["stress-ng", "--cpu", "2", "--timeout", f"{int(a.hog_s)}s", "--quiet"],
                                           preexec_fn=lambda: os.setpriority(os.PRIO_PROCESS, 0, 0),
                                           stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
                t0 = time.time()
                got = await run_open(a.rate, PLACE_CONNS, reps.bases, reqs[k * n:(k + 1) * n], placer("hog", ids))
                if label == "hog":
                    await loop.run_in_executor(None, hog.wait)
                t1 = time.time()
                res[label] = (t0, t1, got, await loop.run_in_executor(None, loop_lag, reps.bases))
                await loop.run_in_executor(None, delete_all, reps.bases, ids)
            until.set()
            await beating
            return res
        res = asyncio.run(go())
        shed = shed_counts(reps.bases)
        downs = asyncio.run(audit_rows(reps.bases, "host.down"))
    finally:
        if hog is not None and hog.poll() is None:
            hog.terminate()
            hog.wait(10)
        reps.stop()
    base_p99, _ = p99_ms(res["before"][2])
    for label in ("before", "hog", "after"):
        t0, t1, got, lag = res[label]
        out[f"overload_replica_loop_lag_s_{label}"] = round(lag, 3)
        p99, ok = p99_ms(got)
        out[f"overload_placement_p99_ms_{label}"] = p99
        out[f"overload_placed_per_s_{label}"] = round(ok / max(1e-9, t1 - t0), 1)
        out[f"overload_placements_{label}"] = statuses([(0, 0, st) for (st, _), _l in got])
        if label != "before":
            out[f"overload_placement_p99_ratio_{label}"] = round(p99 / base_p99, 2) if p99 and base_p99 else None
        rows = fleet.window(t0, t1)
        out[f"overload_beats_{label}"] = statuses(rows)
        gaps = fleet.heard_gaps(t0, t1)
        out[f"overload_beat_gap_s_p99_{label}"] = round(percentile(gaps, 0.99), 2) if gaps else None
        out[f"overload_beat_gap_s_max_{label}"] = round(max(gaps), 2) if gaps else None
    out["overload_shed"] = shed
    out["overload_false_downs"] = len(downs)
    out["overload_hog"] = f"stress-ng --cpu 2 for {a.hog_s:g} s"
    return out


def outage(url: str, names: list[str], a: argparse.Namespace, tmp: Path) -> dict:
    """The outage case: two replicas, the fleet beating as hostd does through the grace;
    placements for --hog-s s (the baseline), then both replicas stopped for --outage-s
    (hostd retries with its capped backoff), then both started again at once (each
    builds its index before it opens its port) while placements are offered open loop
    from the start for --hog-s s after both ports are open. Reported: how long until
    every host was heard again (from the start of the replicas, and from their ports
    open), the return's peak of beat attempts a second against the steady rate (the
    storm), its statuses (shed 503s), re-registrations (none: the fleet keeps its
    registration), placements' p99 during the return against the baseline, and false
    downs (every host kept running: any host.down)."""
    reps = Replicas(config(tmp, url, a, timeout_s=a.timeout_s, check_s=a.check_s,
                          interval_s=a.interval_s), tmp, 2)
    out: dict = {}
    n = int(a.rate * a.hog_s)
    reqs = trace(2 * n + 10)
    ids: list[str] = []
    try:
        reps.start(0)
        reps.start(1)
        warm_up(reps.bases, names)
        fleet = Fleet(names, reps.bases, a.interval_s)
        marks: dict[str, float] = {}

        async def go() -> tuple[list, list]:
            until = asyncio.Event()
            beating = asyncio.create_task(fleet.run(until))
            await asyncio.sleep(a.timeout_s + 2 * a.interval_s)
            marks["steady_from"] = time.time()
            before = await run_open(a.rate, PLACE_CONNS, reps.bases, reqs[:n], placer("outage", ids))
            marks["steady_to"] = time.time()
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, delete_all, reps.bases, ids)
            marks["down"] = time.time()
            await loop.run_in_executor(None, lambda: stop([p for p in reps.procs if p is not None]))
            await asyncio.sleep(a.outage_s)
            marks["start"] = time.time()
            await asyncio.gather(*(loop.run_in_executor(None, reps.start, i) for i in range(2)))
            marks["open"] = time.time()
            during = await run_open(a.rate, PLACE_CONNS, reps.bases, reqs[n:2 * n], placer("outage", ids))
            marks["placed_to"] = time.time()
            await asyncio.sleep(max(0.0, a.interval_s * 1.5 - (time.time() - marks["open"])))
            until.set()
            await beating
            return before, during
        before, during = asyncio.run(go())
        shed = shed_counts(reps.bases)
        downs = asyncio.run(audit_rows(reps.bases, "host.down"))
        registers = asyncio.run(audit_rows(reps.bases, "host.update"))
    finally:
        reps.stop()
    heard: dict[int, float] = {}
    for t, i, st in fleet.log:
        if st in (200, 503) and t >= marks["start"] and i not in heard:
            heard[i] = t
    steady = fleet.window(marks["steady_from"], marks["steady_to"])
    steady_rate = len(steady) / max(1e-9, marks["steady_to"] - marks["steady_from"])
    back = fleet.window(marks["start"], marks["start"] + 4 * a.interval_s)
    per_s: dict[int, int] = {}
    for t, _i, _st in back:
        per_s[int(t - marks["start"])] = per_s.get(int(t - marks["start"]), 0) + 1
    peak = max(per_s.values(), default=0)
    base_p99, _ = p99_ms(before)
    p99, ok = p99_ms(during)
    # when the first create was answered 202, from the ports open (item i was due i / rate after)
    first_ok = min((i / a.rate + lat for i, ((st, _), lat) in enumerate(during) if st == 202), default=None)
    out.update({
        "outage_s": a.outage_s,
        "outage_attempts_while_down": statuses(fleet.window(marks["down"], marks["start"])),
        "outage_replicas_start_to_open_s": round(marks["open"] - marks["start"], 2),
        "outage_all_heard_after_start_s": round(max(heard.values()) - marks["start"], 2)
        if len(heard) == len(names) else None,
        "outage_all_heard_after_open_s": round(max(heard.values()) - marks["open"], 2)
        if len(heard) == len(names) else None,
        "outage_hosts_heard": len(heard),
        "outage_steady_beats_per_s": round(steady_rate, 1),
        "outage_return_peak_attempts_per_s": peak,
        "outage_return_peak_ratio": round(peak / steady_rate, 2) if steady_rate else None,
        "outage_return_beats": statuses(back),
        "outage_shed": shed,
        "outage_reregistrations": len(registers),
        "outage_placement_p99_ms_before": base_p99,
        "outage_placement_p99_ms_return": p99,
        "outage_placement_p99_ratio": round(p99 / base_p99, 2) if p99 and base_p99 else None,
        "outage_placed_per_s_return": round(ok / max(1e-9, marks["placed_to"] - marks["open"]), 1),
        "outage_placements_return": statuses([(0, 0, st) for (st, _), _l in during]),
        "outage_first_placement_after_open_s": round(first_ok, 2) if first_ok is not None else None,
        "outage_first_placement_after_start_s": round(first_ok + marks["open"] - marks["start"], 2)
        if first_ok is not None else None,
        "outage_false_downs": len(downs),
    })
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=int, default=100000)
    p.add_argument("--rate", type=float, default=1000.0, help="placements offered per second")
    p.add_argument("--seconds", type=float, default=20.0, help="length of each measured phase")
    p.add_argument("--claim-lock", choices=("store", "rows"), default="store",
                   help="PostgreSQL: the replicas' placement.claim_lock (one claim batch at a time, or row locks)")
    p.add_argument("--split", action="store_true", help="phase 3: beats to one replica, placements to the other")
    p.add_argument("--rounds", type=int, default=None, help="phase 3's windows of each kind, taking turns "
                                                            "(default 4; --short 2)")
    p.add_argument("--stores", default=STORES, help="comma list of sqlite, pg (--short: sqlite unless given)")
    p.add_argument("--short", action="store_true", help="500 hosts beating every 2 s, 80 placements/s, 4 s "
                                                        "phases, SQLite, liveness timings shortened (the docstring)")
    p.add_argument("--json", action="store_true", help="print one JSON object (a list with several stores)")
    p.add_argument("--overload", action="store_true", help="add the CPU-hog case (stress-ng --cpu 2, --hog-s)")
    p.add_argument("--outage", action="store_true", help="add the outage case (both replicas down --outage-s)")
    p.add_argument("--only", default="", help="comma list of cases to run instead of the phases 1-5: "
                                              "overload, outage, registrations, beats (phase 2 alone), "
                                              "markdown (phase 5 alone)")
    p.add_argument("--no-markdown", action="store_true",
                   help="phases 1-4 without phase 5: the mark-down times liveness and wants the machine to "
                        "itself, so the suite runs it apart (--only markdown) and the rest beside other tests")
    p.add_argument("--idle-s", type=float, default=None, help="the replicas' idle phase before the beats "
                                                              "(default 5; --short 2)")
    p.add_argument("--registrations", action="store_true",
                   help="add the registrations case (batched against one transaction each, fresh databases)")
    p.add_argument("--baseline-hosts", type=int, default=10000,
                   help="the registrations case's baseline registers at most this many (default 10,000)")
    p.add_argument("--hog-s", type=float, default=None, help="the hog's time, and each placement window's "
                                                              "(default 30; --short 8)")
    p.add_argument("--outage-s", type=float, default=None, help="the outage (default 300; --short 21)")
    p.add_argument("--generator", choices=("python", "wrk"), default=None,
                   help=f"who sends the heartbeats (default: wrk from {WRK_FROM_HOSTS:,} hosts when {WRK} exists, "
                        f"else python; --short: python)")
    a = p.parse_args()
    # the replicas run in sessions of their own: kill <pid> unwinds like Ctrl-C and stops them
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # the shipped liveness timings (scheduler/config.py), hostd's 10 s beats
    placement, liveness = PlacementConfig(), LivenessConfig()
    a.interval_s, a.timeout_s, a.write_s, a.check_s, a.period_s = (
        liveness.beat_interval_s, placement.heartbeat_timeout_s, placement.heartbeat_write_s, liveness.check_s,
        placement.heartbeat_period_s)
    if a.short:
        a.hosts, a.rate, a.seconds = 500, 80.0, 4.0  # 640 VMs: the fleet holds them
        a.stores = "sqlite" if a.stores == STORES else a.stores
        # 1.5 s periods: 2 replicas write 1.3 rows/s against ~250 beats/s (0.005 a beat, half
        # the bound, where 1 s periods gave 0.008-0.0104 on a loaded machine); a live
        # host is seen within a beat, two periods and a flush (2 + 3 + 1 s) of the 7 s timeout
        a.interval_s, a.timeout_s, a.write_s, a.check_s, a.period_s = 2.0, 7.0, 300.0, 1.0, 1.5
    a.hog_s = a.hog_s if a.hog_s is not None else (8.0 if a.short else 30.0)
    a.idle_s = a.idle_s if a.idle_s is not None else (2.0 if a.short else 5.0)
    a.rounds = max(1, a.rounds if a.rounds is not None else (2 if a.short else 4))
    a.outage_s = a.outage_s if a.outage_s is not None else (3 * a.timeout_s if a.short else 300.0)
    a.cases = [c.strip() for c in a.only.split(",") if c.strip()]
    if any(c not in ("overload", "outage", "registrations", "beats", "markdown") for c in a.cases):
        p.error(f"--only: overload, outage, registrations, beats, markdown; not {a.only!r}")
    if a.registrations and "registrations" not in a.cases:
        a.cases.append("registrations")
    if a.overload and "overload" not in a.cases:
        a.cases.append("overload")
    if a.outage and "outage" not in a.cases:
        a.cases.append("outage")
    if a.generator is None:
        a.generator = "wrk" if not a.short and a.hosts >= WRK_FROM_HOSTS and WRK.exists() else "python"
    if a.generator == "wrk" and not WRK.exists():
        p.error(f"--generator wrk: {WRK} is not installed (Debian: apt-get install wrk)")
    results = []
    with tempfile.TemporaryDirectory(prefix="hyb-pulse-") as d:
        tmp = Path(d)
        for st in [s.strip() for s in a.stores.split(",") if s.strip()]:
            t = time.perf_counter()
            if st == "sqlite":
                r = run_store("sqlite", f"sqlite:///{tmp}/pulse.db", tmp / "pulse.db", a, tmp)
            elif st == "pg":
                with postgres(PG_SETTINGS) as (_user, port, _pid):
                    create_database(port, "pulse")
                    r = run_store("pg", f"postgresql://postgres@127.0.0.1:{port}/pulse", None, a, tmp)
            else:
                p.error(f"unknown store {st!r}")
            r["seconds"] = round(time.perf_counter() - t, 1)
            results.append(r)
            if not a.json:
                print(f"\n{st}: {a.hosts} hosts, {a.hosts / a.interval_s:.0f} beats/s offered ({a.generator}), "
                      f"{a.rate:.0f} placements/s")
                for k, v in r.items():
                    print(f"  {k:34} {v}")
    if a.json:
        print(json.dumps(results[0] if len(results) == 1 else results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
