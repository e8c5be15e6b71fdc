"""What the IO-health signal reads: plain files under a host root (``HostFs``), so a
recorded or generated host tree works like this machine.

- ``/proc/stat``: per-CPU busy and total time (clock ticks);
- ``/proc/interrupts``: per-IRQ, per-CPU delivery counts;
- ``/proc/<pid>/task/<tid>/stat``: per thread, the CPU it last ran on, its CPU time
  (utime + stime, clock ticks) and whether it is a kernel thread (PF_KTHREAD);
- ``/proc/pressure/cpu`` or a cgroup v2 ``cpu.pressure``: PSI ``some``/``full`` (PSI totals
  are microseconds);
- a cgroup's ``cpu.stat``: CFS throttling (v1 ``throttled_time`` in ns, v2
  ``throttled_usec``);
- a cgroup's thread list (v1 ``tasks``, v2 ``cgroup.threads``), recursively: which
  threads belong to the IO service and which to VMs.

Nothing here keeps state or decides anything: ``hostd/health/signal.py`` turns two
samples into rates.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hostd.discover.affinity import PF_KTHREAD, split_stat
from hostd.discover.fs import HostFs


@dataclass(frozen=True)
class CpuTime:
    busy: int  # ticks not idle/iowait
    total: int


def read_cpu_times(fs: HostFs) -> dict[int, CpuTime]:
    out: dict[int, CpuTime] = {}
    for line in fs.lines("proc/stat", optional=True):
        name, *vals = line.split()
        if not name.startswith("cpu") or name == "cpu":
            continue
        try:
            cpu, ticks = int(name[3:]), [int(v) for v in vals[:8]]
        except ValueError:
            continue
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
        out[cpu] = CpuTime(sum(ticks) - idle, sum(ticks))
    return out


def read_interrupts(fs: HostFs) -> dict[str, tuple[tuple[int, ...], str]]:
    """IRQ -> (count per CPU column, description). Columns follow the header's CPUn."""
    lines = fs.lines("proc/interrupts", optional=True)
    if not lines:
        return {}
    cpus = [int(c[3:]) for c in lines[0].split() if c.startswith("CPU")]
    out: dict[str, tuple[tuple[int, ...], str]] = {}
    for line in lines[1:]:
        irq, _, rest = line.partition(":")
        parts = rest.split()
        counts: list[int] = []
        for p in parts[:len(cpus)]:
            if not p.isdigit():
                break
            counts.append(int(p))
        if not counts:
            continue
        by_cpu = [0] * (max(cpus) + 1 if cpus else 0)
        for c, n in zip(cpus, counts):
            by_cpu[c] = n
        out[irq.strip()] = (tuple(by_cpu), " ".join(parts[len(counts):]))
    return out


@dataclass(frozen=True)
class Thread:
    tid: int
    pid: int
    comm: str
    cpu: int  # last CPU it ran on (field 39)
    ticks: int  # utime + stime
    kthread: bool


def read_threads(fs: HostFs) -> dict[int, Thread]:
    """Every thread of every process; ones that vanish while read are skipped."""
    out: dict[int, Thread] = {}
    proc = fs.path("proc")
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return out
    for pid in pids:
        try:
            tids = os.listdir(proc / pid / "task")
        except OSError:
            continue
        for tid in tids:
            t = _thread(proc / pid / "task" / tid / "stat", int(pid))
            if t is not None:
                out[t.tid] = t
    return out


def _thread(path: os.PathLike, pid: int) -> Thread | None:
    try:
        with open(path) as f:
            parts = split_stat(f.read())
    except OSError:
        return None
    if parts is None:
        return None
    tid_s, comm, f = parts
    try:
        return Thread(int(tid_s), pid, comm, int(f[36]), int(f[11]) + int(f[12]), bool(int(f[6]) & PF_KTHREAD))
    except (ValueError, IndexError):
        return None


@dataclass(frozen=True)
class Psi:
    some_avg10: float  # percent of the last 10 s some task waited for a CPU
    some_total_us: int
    full_total_us: int


def read_psi(fs: HostFs, rel: str) -> Psi | None:
    vals: dict[str, dict[str, str]] = {}
    for line in fs.lines(rel, optional=True):
        kind, *kvs = line.split()
        vals[kind] = dict(kv.split("=", 1) for kv in kvs if "=" in kv)
    some = vals.get("some")
    if not some:
        return None
    try:
        return Psi(float(some["avg10"]), int(some["total"]), int(vals.get("full", {}).get("total", 0)))
    except (KeyError, ValueError):
        return None


@dataclass(frozen=True)
class Throttle:
    periods: int
    throttled: int  # periods in which the group was throttled
    throttled_us: int


def read_throttle(fs: HostFs, cgroup_dir: str) -> Throttle | None:
    """``cpu.stat`` of a cgroup: v1 (``throttled_time``, ns) or v2 (``throttled_usec``)."""
    kv = {}
    for line in fs.lines(f"{cgroup_dir}/cpu.stat", optional=True):
        k, _, v = line.partition(" ")
        if v.strip().isdigit():
            kv[k] = int(v)
    if "nr_throttled" not in kv:
        return None
    us = kv["throttled_usec"] if "throttled_usec" in kv else kv.get("throttled_time", 0) // 1000
    return Throttle(kv.get("nr_periods", 0), kv["nr_throttled"], us)


def cgroup_threads(fs: HostFs, cgroup_dir: str) -> set[int]:
    """Thread ids in a cgroup and every cgroup below it (v1 ``tasks``, v2 ``cgroup.threads``)."""
    out: set[int] = set()
    root = fs.path(cgroup_dir)
    for d, _dirs, files in os.walk(root):
        name = "tasks" if "tasks" in files else "cgroup.threads" if "cgroup.threads" in files else None
        if name is None:
            continue
        try:
            with open(os.path.join(d, name)) as f:
                out.update(int(x) for x in f.read().split())
        except (OSError, ValueError):
            continue
    return out
