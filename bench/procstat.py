"""CPU time from /proc/<pid>/stat and /proc/<pid>/task/<tid>/stat, for the benches'
own accounting of the processes they start."""

from __future__ import annotations

import os
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


def stat_fields(path: str | Path) -> list[str] | None:
    """The fields after the command name (which may hold spaces and parentheses): index 1
    is the parent PID, 11 and 12 utime and stime. None when the process or thread is gone."""
    try:
        return Path(path).read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def cpu_s(fields: list[str]) -> float:
    """User + system CPU seconds from ``stat_fields``."""
    return (int(fields[11]) + int(fields[12])) / _TICK


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
