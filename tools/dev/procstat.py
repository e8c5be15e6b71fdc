"""CPU time from /proc/<pid>/stat and /proc/<pid>/task/<tid>/stat, for the benches'
own accounting of the processes they start."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


@functools.cache
def _tick() -> int:
    """Clock ticks per second (the unit of /proc's CPU times), read on first use."""
    return os.sysconf("SC_CLK_TCK")


def stat_fields(path: str | Path) -> list[str] | None:
    """The fields after the command name (which may hold spaces and parentheses): index 1
    is the parent PID, 11 and 12 utime and stime. None when the process or thread is gone."""
    try:
        return Path(path).read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def cpu_s(fields: list[str]) -> float:
    """User + system CPU seconds from ``stat_fields``."""
    return (int(fields[11]) + int(fields[12])) / _tick()


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + sys) used so far by `pid` and its live descendants (bpftrace,
    perf; the PostgreSQL postmaster's backends, which call setsid() and so leave its
    process group)."""
    stats = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and (f := stat_fields(d / "stat")) is not None:
            stats[int(d.name)] = (int(f[1]), cpu_s(f))  # ppid, utime+stime
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        total += stats.get(p, (0, 0.0))[1]
        todo += [c for c, (pp, _) in stats.items() if pp == p]
    return total


def machine() -> list[int]:
    """The first line of /proc/stat: jiffies per state over all CPUs (user nice system
    idle iowait irq softirq steal ...)."""
    return [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]


def machine_load(before: list[int], after: list[int]) -> tuple[float, float]:
    """(CPUs busy, CPUs stolen by the hypervisor) on average between two ``machine()``
    readings. Steal is time this VM was runnable but another guest had the host CPU: a
    run with steal measured the neighbours too."""
    d = [b - a for a, b in zip(before, after)]
    total = sum(d) or 1
    ncpu = os.cpu_count() or 1
    idle = d[3] + d[4]
    steal = d[7] if len(d) > 7 else 0
    return (total - idle - steal) / total * ncpu, steal / total * ncpu


def hugepages_in_use() -> int:
    """2 MiB pages of the machine's pools in use or reserved (/proc/meminfo)."""
    info = dict(ln.split(":", 1) for ln in Path("/proc/meminfo").read_text().splitlines() if ":" in ln)
    n = {k: int(info[k].split()[0]) for k in ("HugePages_Total", "HugePages_Free", "HugePages_Rsvd")}
    return n["HugePages_Total"] - n["HugePages_Free"] + n["HugePages_Rsvd"]


def _settled(left: Callable[[], T], timeout_s: float) -> T:
    """``left()`` every 0.2 s until it is empty (falsy) or ``timeout_s`` has passed; its
    last value."""
    deadline = time.monotonic() + timeout_s
    while (got := left()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return got


def remove_guest_cgroups(domain: str, timeout_s: float = 30.0) -> list[str]:
    """The cgroups libvirt made for ``domain`` (cgroup v1: ``machine/qemu-N-<domain>.libvirt-qemu``
    under each controller), removed once empty, deepest first. libvirt removes them as
    the guest's QEMU exits, but not always after a libvirtd restart: a CI run's destroy
    of a reattached guest left them, and the next test's carve could not shrink
    machine/'s CPUs under them (EBUSY). Waits up to ``timeout_s`` for a group to empty (a
    QEMU still exiting); returns the groups left then."""
    def remove() -> list[str]:
        left = []
        for g in Path("/sys/fs/cgroup").glob(f"*/machine/qemu-*-{domain}.libvirt-qemu"):
            subs = sorted((p for p in g.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
            for d in [*subs, g]:
                try:
                    d.rmdir()
                except FileNotFoundError:  # libvirt's own cleanup, or a controller's second name
                    pass
                except OSError:
                    left.append(str(d))
        return left
    return _settled(remove, timeout_s)


def wait_no_child_cgroups(group: Path, timeout_s: float = 30.0) -> list[str]:
    """Wait until ``group`` (a cgroup directory: libvirt's ``machine`` cpuset) has no
    child groups: libvirt removes a guest's group only once its QEMU has exited, seconds
    after a destroy under load, and until then a carve cannot shrink the parent's CPUs
    (EBUSY). Returns the children still there then."""
    return _settled(lambda: sorted(p.name for p in group.iterdir() if p.is_dir()), timeout_s)


def wait_hugepages_free(timeout_s: float = 30.0) -> int:
    """Wait until no 2 MiB page is in use (a destroyed guest's QEMU gives its pages back
    only as it exits, seconds later under load); returns what is still in use then."""
    return _settled(hugepages_in_use, timeout_s)
