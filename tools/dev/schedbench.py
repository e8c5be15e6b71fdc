"""Shared parts of bench/placement.py: the fleet and the request trace (deterministic),
a small keep-alive HTTP/1.1 load generator (asyncio, so the client costs little CPU on a
2-CPU machine), a throwaway PostgreSQL on loopback (stopped by PID), the offline
first-fit-decreasing bound, and the overcommit/ledger check."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import pwd
import random
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.dev.host_shapes import Shape, make_layout
from tools.dev.procs import free_port
from tools.dev.procstat import cpu_s, stat_fields
from scheduler.fit import DiskWant, HostView, VfWant, VmWant, fit_host
from scheduler.resources import Allocation, HostRes, Usage, host_from_layout

# Storage hosts: most cores belong to the resident IO service, hugepage pools are a slice
# of RAM (the rest is page cache), a few VFs and spare NVMe per node.
SHAPES = (
    Shape("oss-1s-16c-smt-4vf", nodes=1, cores_per_node=16, io_cores_per_node=9, host_cores=1,
          pages_2m_per_node=12288, vfs_per_node=4, pf_mbps=25000, disks_per_node=1),
    Shape("oss-1s-12c-smt-2vf", nodes=1, cores_per_node=12, io_cores_per_node=7, host_cores=1,
          pages_2m_per_node=8192, vfs_per_node=2, pf_mbps=10000, disks_per_node=0),
    Shape("oss-2s-16c-smt-4vf-1g", nodes=2, cores_per_node=16, io_cores_per_node=11, host_cores=1,
          pages_2m_per_node=6144, pages_1g_per_node=16, vfs_per_node=4, pf_mbps=25000, disks_per_node=1),
    Shape("oss-1s-8c-nosmt-0vf", nodes=1, cores_per_node=8, smt=1, io_cores_per_node=3, host_cores=1,
          pages_2m_per_node=4096, vfs_per_node=0, disks_per_node=0),
)
# (weight, vcpus, memory GiB, page size kB, VFs, NVMe disks): online-service VMs.
# "storage": the default trace. Its 8-vCPU + NVMe and 12-vCPU classes (20 %) fit only the
# 16-core hosts (25 % of the fleet, one such VM each), so they run out first, at request
# ~13,850 of 20,000 on 10,000 hosts: that, not packing, sets its quality ceiling (0.737).
# "matched": the same classes with those two cut to what the 16-core hosts can take
# (15 -> 7 and 5 -> 3 %) and the freed share given to 4-vCPU + VF and 6-vCPU VMs, so no
# class runs out before the fleet fills (ceiling 1.0) and quality measures the packing.
# "matched-heavy": as matched with more 6-vCPU and 1 GiB-page VMs (memory-bound on the
# dual-socket hosts' 12 GiB of 2 MiB pages per node).
MIXES = {
    "storage": ((25, 2, 4, 2048, 0, 0), (20, 4, 8, 2048, 1, 0), (15, 4, 8, 2048, 0, 0), (15, 8, 16, 2048, 1, 1),
                (10, 6, 12, 2048, 0, 0), (5, 8, 16, 1048576, 1, 0), (5, 12, 24, 2048, 0, 0), (5, 1, 2, 2048, 0, 0)),
    "matched": ((25, 2, 4, 2048, 0, 0), (24, 4, 8, 2048, 1, 0), (15, 4, 8, 2048, 0, 0), (7, 8, 16, 2048, 1, 1),
                (16, 6, 12, 2048, 0, 0), (5, 8, 16, 1048576, 1, 0), (3, 12, 24, 2048, 0, 0), (5, 1, 2, 2048, 0, 0)),
    "matched-heavy": ((20, 2, 4, 2048, 0, 0), (24, 4, 8, 2048, 1, 0), (15, 4, 8, 2048, 0, 0),
                      (7, 8, 16, 2048, 1, 1), (20, 6, 12, 2048, 0, 0), (6, 8, 16, 1048576, 1, 0),
                      (3, 12, 24, 2048, 0, 0), (5, 1, 2, 2048, 0, 0)),
}

@dataclass(frozen=True)
class Req:
    i: int
    want: VmWant

    def body(self) -> dict[str, Any]:
        w = self.want
        return {"name": f"vm-{self.i}", "vcpus": w.vcpus, "memory_mib": w.memory_mib, "image": "online",
                "page_size_kb": w.page_size_kb,
                "vfs": [{"max_tx_rate_mbps": v.max_tx_rate_mbps, "min_tx_rate_mbps": v.min_tx_rate_mbps}
                        for v in w.vfs],
                "disks": [{"class": d.cls, "iotune": {"total_bytes_sec": d.bytes_sec, "total_iops_sec": d.iops}}
                          for d in w.disks]}


def fleet(n: int) -> list[tuple[str, Shape, str]]:
    """(name, shape, rack) for n hosts; shapes interleaved, 40 hosts per rack."""
    return [(f"oss-{i:05d}", SHAPES[(i * 7 + i // 11) % len(SHAPES)], f"r{i // 40:04d}") for i in range(n)]


def trace(n: int, seed: int = 11, mix: str = "storage") -> list[Req]:
    rnd = random.Random(seed)
    classes = MIXES[mix]
    weights = [m[0] for m in classes]
    out = []
    for i in range(n):
        _, v, gib, size, vfs, disks = rnd.choices(classes, weights)[0]
        out.append(Req(i, VmWant(v, gib * 1024, size,
                                 vfs=tuple(VfWant(max_tx_rate_mbps=2000, min_tx_rate_mbps=1000) for _ in range(vfs)),
                                 disks=tuple(DiskWant(cls="nvme", bytes_sec=200_000_000, iops=20_000)
                                             for _ in range(disks)))))
    return out


def host_res(name: str, shape: Shape, rack: str) -> HostRes:
    layout, sib = make_layout(shape)
    return host_from_layout(name, layout, siblings=sib, rack=rack)


def register_body(name: str, shape: Shape, rack: str) -> dict[str, Any]:
    layout, sib = make_layout(shape)
    return {"name": name, "address": f"{name}:7443", "rack": rack, "labels": {"shape": shape.name},
            "layout": json.loads(layout.to_json()), "cpu_siblings": {str(k): list(v) for k, v in sib.items()}}


def ffd_bound(hosts: list[HostRes], reqs: list[Req]) -> int:
    """Offline first-fit decreasing: requests by (vCPUs, memory) descending, each into the
    first host (by name) that fits it. Per request shape, hosts before the last first-fit
    never fit again (capacity only shrinks), so the scan resumes there."""
    views = [HostView(h) for h in sorted(hosts, key=lambda h: h.name)]
    start: dict[VmWant, int] = {}
    placed = 0
    for r in sorted(reqs, key=lambda r: (-r.want.vcpus, -r.want.memory_mib, r.i)):
        i = start.get(r.want, 0)
        while i < len(views):
            a = fit_host(views[i], r.want)
            if isinstance(a, Allocation):
                views[i] = HostView(views[i].res, views[i].usage.plus(a))
                placed += 1
                break
            i += 1
        start[r.want] = i
    return placed


def _fill(h: HostView, want: VmWant, cap: int = 64) -> tuple[HostView, int]:
    n = 0
    while n < cap and isinstance(a := fit_host(h, want), Allocation):
        h, n = HostView(h.res, h.usage.plus(a)), n + 1
    return h, n


def describe(w: VmWant) -> str:
    return (f"{w.vcpus} vCPU/{w.memory_mib // 1024} GiB{' 1G' if w.page_size_kb != 2048 else ''}"
            f"{' +VF' * len(w.vfs)}{' +NVMe' * len(w.disks)}")


def class_ceiling(hosts: list[tuple[str, Shape, str]], reqs: list[Req]) -> tuple[int, str]:
    """How far into the trace any scheduler could get before its first capacity
    rejection, estimated from supply and demand: for every request class (identical
    requests) and every pair of classes, the most VMs of that set one empty host of each
    shape holds (greedy fill, trying every split of a pair), summed over the fleet; the
    trace cannot be served past the first request that takes a set's demand above its
    supply. Returns (requests before it, which set). Packing quality cannot exceed about
    this / FFD; it shows when a trace, not the scheduler, sets the first rejection."""
    shapes = {shape for _n, shape, _r in hosts}
    count = {sh: sum(1 for h in hosts if h[1] == sh) for sh in shapes}
    classes = sorted({r.want for r in reqs}, key=lambda w: (w.vcpus, w.memory_mib, w.page_size_kb, len(w.vfs)))
    sets: list[tuple[VmWant, ...]] = [(c,) for c in classes] + [
        (a, b) for i, a in enumerate(classes) for b in classes[i + 1:]]
    supply: dict[tuple[VmWant, ...], int] = {}
    for st in sets:
        total = 0
        for sh in shapes:
            empty = HostView(host_res("x", sh, ""))
            if len(st) == 1:
                best = _fill(empty, st[0])[1]
            else:
                best, h = 0, empty
                for k in range(65):  # k of the first class, then as many of the second as fit
                    best = max(best, k + _fill(h, st[1])[1])
                    a = fit_host(h, st[0])
                    if not isinstance(a, Allocation):
                        break
                    h = HostView(h.res, h.usage.plus(a))
            total += best * count[sh]
        supply[st] = total
    demand = {st: 0 for st in sets}
    member: dict[VmWant, list[tuple[VmWant, ...]]] = {c: [st for st in sets if c in st] for c in classes}
    for i, r in enumerate(reqs):
        for st in member[r.want]:
            demand[st] += 1
            if demand[st] > supply[st]:
                return i, f"{' or '.join(describe(w) for w in st)}: the fleet holds {supply[st]}"
    return len(reqs), "every class and pair fits the fleet"


def overcommit(res: dict[str, HostRes], usage: dict[str, Usage], allocs: dict[str, list[Allocation]]) -> list[str]:
    """Every way a host could be overcommitted, and ledger != sum of live allocations."""
    bad: list[str] = []
    for name, r in res.items():
        al = allocs.get(name, [])
        cpus = [c for a in al for c in a.cpus]
        if len(cpus) != len(set(cpus)):
            bad.append(f"{name}: a CPU is booked twice")
        total = Usage.of(al)
        if usage.get(name, Usage()) != total:
            bad.append(f"{name}: ledger != sum of allocations")
        for n in r.nodes:
            if len(total.cpus & n.cpus) > len(n.cpus):
                bad.append(f"{name}: node {n.node} CPUs")
            for size, count in n.hugepages:
                if total.pages.get((n.node, size), 0) > count:
                    bad.append(f"{name}: node {n.node} {size} kB pages")
        if not total.cpus <= set().union(*(n.cpus for n in r.nodes)):
            bad.append(f"{name}: a CPU outside the VM CPUs")
        for p in r.pfs:
            if total.reserved_mbps.get(p.name, 0) > p.bandwidth_mbps:
                bad.append(f"{name}: {p.name} tx budget")
        vfs = [(v.pf, v.index) for a in al for v in a.vfs]
        disks = [d.name for a in al for d in a.disks]
        if len(vfs) != len(set(vfs)) or len(disks) != len(set(disks)):
            bad.append(f"{name}: a VF or disk is booked twice")
    return bad


# ---------------------------------------------------------------- HTTP load generator


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


class Conn:
    """One keep-alive HTTP/1.1 connection (Content-Length bodies only: both servers send them)."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.r: asyncio.StreamReader | None = None
        self.w: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Reply:
        data = b"" if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
        head = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}", f"Content-Length: {len(data)}"]
        if body is not None:
            head.append("Content-Type: application/json")
        head += [f"{k}: {v}" for k, v in (headers or {}).items()]
        for attempt in (0, 1):
            if self.w is None:
                self.r, self.w = await asyncio.open_connection(self.host, self.port)
            try:
                self.w.write(("\r\n".join(head) + "\r\n\r\n").encode() + data)
                raw = await self.r.readuntil(b"\r\n\r\n")  # type: ignore[union-attr]
                break
            except (ConnectionError, asyncio.IncompleteReadError):
                self.close()
                if attempt:
                    raise
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        hdrs = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
        n = int(hdrs.get("content-length", "0"))
        payload = await self.r.readexactly(n) if n else b""  # type: ignore[union-attr]
        if hdrs.get("connection", "").lower() == "close":
            self.close()
        return Reply(status, hdrs, payload)

    def close(self) -> None:
        if self.w is not None:
            self.w.close()
        self.r = self.w = None


@contextmanager
def no_gc_pauses() -> Iterator[None]:
    """The load generator's own garbage collector off while it sends: its full
    collections walked the fleet and the trace it holds (10,000 hosts, 20,000 requests)
    and stopped it for 50-70 ms at a time, during which no request went out on time;
    in the open loop every request due in that window then counted the stop as the
    servers' latency (a ``gc.callbacks`` probe in the client, 2 per 20 s run at 1,000
    requests/s: a fifth of the requests above 20 ms). What it allocates while sending is
    freed by reference counting; anything cyclic waits for the collection after."""
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()
        gc.collect()


async def run_clients(n: int, bases: list[tuple[str, int]], items: list[Any],
                      one: Callable[[Conn, Any], Awaitable[Any]]) -> list[Any]:
    """``n`` concurrent clients take items in order from one queue; client k talks to
    ``bases[k % len(bases)]`` over its own keep-alive connection."""
    with no_gc_pauses():
        return await _run_clients(n, bases, items, one)


async def _run_clients(n: int, bases: list[tuple[str, int]], items: list[Any],
                       one: Callable[[Conn, Any], Awaitable[Any]]) -> list[Any]:
    it = iter(enumerate(items))
    out: list[Any] = [None] * len(items)

    async def client(k: int) -> None:
        c = Conn(*bases[k % len(bases)])
        try:
            for i, item in it:
                out[i] = await one(c, item)
        finally:
            c.close()
    await asyncio.gather(*(client(k) for k in range(n)))
    return out


async def run_open(rate: float, n: int, bases: list[tuple[str, int]], items: list[Any],
                   one: Callable[[Conn, Any], Awaitable[Any]]) -> list[tuple[Any, float]]:
    """Open loop (wrk2-style): item i is due at ``i / rate`` seconds; it waits for one of
    ``n`` keep-alive connections if all are busy. Returns (result, latency from the due
    time), so a server that falls behind shows it in latency (no coordinated omission)."""
    with no_gc_pauses():
        return await _run_open(rate, n, bases, items, one)


async def _run_open(rate: float, n: int, bases: list[tuple[str, int]], items: list[Any],
                    one: Callable[[Conn, Any], Awaitable[Any]]) -> list[tuple[Any, float]]:
    conns: asyncio.Queue[Conn] = asyncio.Queue()
    for k in range(n):
        conns.put_nowait(Conn(*bases[k % len(bases)]))
    out: list[tuple[Any, float]] = [(None, 0.0)] * len(items)
    loop = asyncio.get_running_loop()
    t0 = loop.time()

    async def fire(i: int, item: Any, due: float) -> None:
        c = await conns.get()
        try:
            r = await one(c, item)
        finally:
            conns.put_nowait(c)
        out[i] = (r, loop.time() - due)
    tasks = []
    for i, item in enumerate(items):
        due = t0 + i / rate
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(fire(i, item, due)))
    await asyncio.gather(*tasks)
    while not conns.empty():
        conns.get_nowait().close()
    return out


def server_timing_s(headers: dict[str, str]) -> float | None:
    """A create answer's own time in the replica, from its ``Server-Timing: claim;dur=<ms>``
    (``scheduler/api/wire.py``), in seconds; None without one."""
    st = headers.get("server-timing", "")
    return float(st.split("dur=")[1]) / 1e3 if "dur=" in st else None


def percentile(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * p))]


# ---------------------------------------------------------------- processes


def wait_http(port: int, path: str, proc: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    import http.client
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited ({proc.returncode}): {log.read_text()[-3000:]}")
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        try:
            c.request("GET", path)
            if c.getresponse().status < 500:
                return
        except OSError:
            pass
        finally:
            c.close()  # also an attempt that connected and then timed out (a ResourceWarning otherwise)
        time.sleep(0.2)
    raise RuntimeError(f"server not ready on {port}: {log.read_text()[-3000:]}")


def thread_cpu(pids: list[int]) -> dict[str, float]:
    """CPU seconds (user + system) of the given processes' threads, summed by role: the
    main thread ("event loop"), the scheduler's claim thread (OS name ``hyb-claims``) and
    everything else."""
    out = {"event loop": 0.0, "claim thread": 0.0, "other": 0.0}
    for pid in pids:
        for tid in os.listdir(f"/proc/{pid}/task"):
            task = Path(f"/proc/{pid}/task/{tid}")
            try:
                comm = (task / "comm").read_text().strip()
            except OSError:
                continue  # the thread ended meanwhile
            f = stat_fields(task / "stat")
            if f is None:
                continue
            role = "event loop" if int(tid) == pid else "claim thread" if comm == "hyb-claims" else "other"
            out[role] += cpu_s(f)
    return out


def stop(procs: list[subprocess.Popen]) -> None:
    """Stop what we started, by PID (each runs in its own session: its workers go too)."""
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


PG_BIN = Path("/usr/lib/postgresql/15/bin")


@contextmanager
def postgres(settings: dict[str, str]) -> Iterator[tuple[str, int, int]]:
    """A throwaway PostgreSQL 15 on loopback, run as the `postgres` user (PostgreSQL
    refuses root), stopped by PID even on failure; yields (user, port, postmaster PID:
    its backends are its children, see ``procstat.tree_cpu_s``). ``settings`` are
    its ``-c`` options. The scheduler tests' ``pg_server`` fixture uses it too."""
    if not (PG_BIN / "postgres").exists():
        raise RuntimeError(f"PostgreSQL 15 not installed ({PG_BIN}/postgres missing)")
    user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    pw = pwd.getpwnam(user)
    base = Path(tempfile.mkdtemp(prefix="hyb-bench-pg-"))
    os.chown(base, pw.pw_uid, pw.pw_gid)
    as_user: dict[str, Any] = {"user": pw.pw_uid, "group": pw.pw_gid} if os.geteuid() == 0 else {}
    proc = None
    try:
        subprocess.run([str(PG_BIN / "initdb"), "-D", str(base / "data"), "-U", "postgres", "--auth=trust",
                        "-E", "UTF8", "--no-sync"], check=True, capture_output=True, cwd=base, **as_user)
        port = free_port()
        # huge_pages off: PostgreSQL's default ("try") takes 2 MiB pages for its shared
        # memory whenever the pool has free ones, and keeps them for its life. Started
        # while a machine test had grown the pool, the suite's server held 154 of them
        # for minutes, and a later test found the pool not free after its guest left.
        opts = [x for k, v in {"huge_pages": "off", **settings}.items() for x in ("-c", f"{k}={v}")]
        # and stopped (SIGINT: a fast shutdown) when the thread that started it dies
        # without reaching the stop below (a process SIGKILLed, an interpreter ended by a
        # signal): its parent-death signal, set by util-linux's setpriv, kept across exec
        orphan = [setpriv, "--pdeathsig", "INT", "--"] if (setpriv := shutil.which("setpriv")) else []
        with open(base / "pg.log", "wb") as log:  # the child keeps its own descriptor
            proc = subprocess.Popen([*orphan, str(PG_BIN / "postgres"), "-D", str(base / "data"), "-p", str(port),
                                     "-h", "127.0.0.1", "-k", str(base), *opts],
                                    stdout=log, stderr=subprocess.STDOUT, cwd=base,
                                    start_new_session=True, **as_user)
        import psycopg
        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(f"host=127.0.0.1 port={port} user=postgres dbname=postgres", connect_timeout=2).close()
                break
            except psycopg.OperationalError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("PostgreSQL did not start: " + (base / "pg.log").read_text()[-2000:])
                time.sleep(0.2)
        yield "postgres", port, proc.pid
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # fast shutdown, by PID
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(base, ignore_errors=True)


def create_database(port: int, name: str, template: str = "") -> None:
    """``CREATE DATABASE name`` on the server at ``port``, a copy of ``template`` if given."""
    import psycopg
    with psycopg.connect(f"host=127.0.0.1 port={port} user=postgres dbname=postgres", autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else ""))


@dataclass
class Result:
    label: str
    placed: int = 0
    rejected: int = 0  # capacity (507 / no candidates)
    conflicts: int = 0  # gave up after lost races (409)
    errors: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    lat: list[float] = field(default_factory=list)  # client-observed, per request
    server: list[float] = field(default_factory=list)  # server-side claim time (ours)
    before_first_reject: int = 0
    overcommit: list[str] | None = None
    note: str = ""
    cpu: dict[str, float] = field(default_factory=dict)  # our servers' CPU ms per request, by thread role
    db_cpu: float | None = None  # the database server's CPU ms per request (PostgreSQL)
    machine: tuple[float, float] | None = None  # CPUs busy, CPUs stolen (procstat.machine_load)

    def tally(self, answers: list[tuple[int, float, str]]) -> None:
        """Count the run's answers, in trace order: (HTTP status, latency, error code)."""
        first = min((i for i, a in enumerate(answers) if a[0] == 507), default=len(answers))
        for i, (status, dt, code) in enumerate(answers):
            self.lat.append(dt)
            if status == 202:
                self.placed += 1
                self.before_first_reject += i < first
            elif status == 507:
                self.rejected += 1
            elif status == 409:
                self.conflicts += 1
            else:
                self.errors[code] = self.errors.get(code, 0) + 1

    @property
    def rate(self) -> float:
        return (self.placed + self.rejected) / self.seconds if self.seconds else 0.0


# ---------------------------------------------------------------- wrk, the compiled generator


WRK = Path("/usr/bin/wrk")
WRK_MARK = "HYB-WRK-REPORT "


@dataclass
class WrkRun:
    """What a wrk script's done() reported (the line after ``WRK_MARK``, see
    bench/wrk/heartbeat.lua) and the CPU the wrk process used."""

    report: dict[str, Any]
    cpu_s: float

    @property
    def sent(self) -> int:
        return int(self.report.get("sent", 0))

    def answered(self, status: int) -> int:
        return int(self.report.get("statuses", {}).get(str(status), 0))

    def p(self, q: str) -> float | None:
        """Latency percentile ``q`` ("50", "99", "99.9", "max") in seconds, from the write."""
        v = self.report.get("latency_us", {}).get(q)
        return None if v is None else v / 1e6

    @property
    def window_s(self) -> float:
        """From the first request written to the last answer read, in seconds."""
        r = self.report
        if not r.get("first_send_us") or not r.get("last_answer_us"):
            return 0.0
        return (r["last_answer_us"] - r["first_send_us"]) / 1e6


def parse_wrk_report(stdout: str) -> dict[str, Any]:
    """The JSON object on the line that starts with ``WRK_MARK`` (wrk prints its own
    summary around it); ValueError when there is none, so a script that failed to load
    is not read as a run that sent nothing."""
    for line in stdout.splitlines():
        if line.startswith(WRK_MARK):
            return json.loads(line[len(WRK_MARK):])
    raise ValueError(f"no {WRK_MARK.strip()} line in wrk's output: {stdout[-2000:]!r}")


def start_wrk(script: Path, url: str, *, threads: int, conns: int, seconds: float,
              env: dict[str, str]) -> subprocess.Popen:
    """wrk with ``script``, ``conns`` connections over ``threads`` threads, for
    ``seconds`` (whole seconds, rounded up: wrk's -d unit); ``env`` adds to ours.
    Requests slower than 60 s count as timeouts (wrk's latency histogram ends there)."""
    return subprocess.Popen([str(WRK), "-t", str(threads), "-c", str(conns), "-d", f"{max(1, int(-(-seconds // 1)))}s",
                             "--timeout", "60s", "-s", str(script), url],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **env})


def wait_wrk(p: subprocess.Popen) -> WrkRun:
    """Wait for a wrk started by ``start_wrk``; its report and its CPU (user + system,
    from wait4, so the time of its threads is counted after they are gone)."""
    assert p.stdout is not None
    with p.stdout:
        out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise RuntimeError(f"wrk exited {p.returncode}: {out[-2000:]}")
    return WrkRun(parse_wrk_report(out), ru.ru_utime + ru.ru_stime)


def stop_wrk(p: subprocess.Popen) -> WrkRun:
    """Stop a wrk started by ``start_wrk`` before its -d ends: SIGINT, on which wrk 4
    stops its threads and still runs the script's done() (the report line); then as
    ``wait_wrk``. One that ended by itself is only waited for: its PID is not reaped
    until then, so the signal reaches it or its zombie, never another process
    (``Popen.send_signal`` would reap it first and lose its rusage)."""
    os.kill(p.pid, signal.SIGINT)
    return wait_wrk(p)
