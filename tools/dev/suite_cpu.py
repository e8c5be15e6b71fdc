"""Where the suite's CPU goes: each pytest worker in a cpuacct cgroup of its own, and a
summary of the timeline ``HYB_TEST_TIMELINE=FILE make test`` writes.

The suite is CPU-bound on a 2-CPU machine (TCG guests, simulated fleets, a Debian root's
package installs), so wall time per test says little: a test that waits looks as long as
one that computes. A worker and every process it starts (a QEMU under a libvirtd the
worker started, a fleet of hostds) count in the worker's cgroup, so the CPU between two
of its test phases is that phase's: each timeline line carries it.

cgroup v1's cpuacct only (the machines this runs on). On cgroup v2 the carve tests move
processes between the unified hierarchy's groups, so the worker stays where it is and
the column says ``-``.

    .venv/bin/python -m tools.dev.suite_cpu FILE [--top 40]   # the summary
"""

from __future__ import annotations

import argparse
import collections
import os
from pathlib import Path

CPUACCT = Path("/sys/fs/cgroup/cpuacct")


class WorkerCpu:
    """This process (a pytest worker) in ``hyb-suite-<run>-<worker>`` under cpuacct; its
    children are born there. ``since_last()``: CPU seconds since the previous call."""

    def __init__(self, name: str) -> None:
        self.group: Path | None = None
        self._last = 0
        if os.geteuid() != 0 or not (CPUACCT / "cpuacct.usage").exists():
            return
        self._home = next((ln.split(":", 2)[2] for ln in Path("/proc/self/cgroup").read_text().splitlines()
                           if ln.split(":")[1] == "cpuacct"), "/")
        g = CPUACCT / name
        try:
            g.mkdir(exist_ok=True)
            (g / "cgroup.procs").write_text(str(os.getpid()))
        except OSError:
            return
        self.group = g
        self._last = self._usage()

    def _usage(self) -> int:
        assert self.group is not None
        return int((self.group / "cpuacct.usage").read_text())

    def since_last(self) -> float | None:
        if self.group is None:
            return None
        try:
            now = self._usage()
        except OSError:
            return None
        d, self._last = now - self._last, now
        return d / 1e9

    def close(self) -> None:
        """Back to the cgroup it came from; the group is removed once empty (a process a
        test left behind keeps it, and says so by its PID in ``cgroup.procs``)."""
        if self.group is None:
            return
        try:
            (CPUACCT / self._home.lstrip("/") / "cgroup.procs").write_text(str(os.getpid()))
            self.group.rmdir()
        except OSError:
            pass
        self.group = None


def parse(path: Path) -> list[tuple[str, float, float, str, float | None, str]]:
    """Timeline lines: worker start stop phase cpu nodeid (cpu ``-`` where not measured)."""
    rows = []
    for line in path.read_text().splitlines():
        w, a, b, phase, cpu, nid = line.split(None, 5)
        rows.append((w, float(a), float(b), phase, None if cpu == "-" else float(cpu), nid))
    return rows


def summary(rows: list, top: int = 40) -> str:
    t0, t1 = min(r[1] for r in rows), max(r[2] for r in rows)
    group = lambda nid: nid.rsplit("@", 1)[1] if "@" in nid else "-"  # noqa: E731
    busy, cpu_w = collections.Counter(), collections.Counter()
    g_wall, g_cpu, t_wall, t_cpu = (collections.Counter() for _ in range(4))
    for w, a, b, _, cpu, nid in rows:
        busy[w] += b - a
        g_wall[group(nid)] += b - a
        t_wall[nid.split("@")[0]] += b - a
        if cpu is not None:
            cpu_w[w] += cpu
            g_cpu[group(nid)] += cpu
            t_cpu[nid.split("@")[0]] += cpu
    total = sum(cpu_w.values())
    out = [f"span {t1 - t0:.0f} s; test phases {sum(busy.values()):.0f} worker-s; CPU {total:.0f} CPU-s "
           f"({total / (t1 - t0):.2f} CPUs on average)",
           "worker  busy s  CPU-s"] + [f"{w:6} {busy[w]:7.0f} {cpu_w[w]:6.0f}" for w in sorted(busy)]
    out += ["", " CPU-s  wall s  group"] + [f"{g_cpu[g]:6.1f} {g_wall[g]:7.1f}  {g}"
                                            for g, _ in (g_cpu or g_wall).most_common(top)]
    out += ["", " CPU-s  wall s  test"] + [f"{t_cpu[t]:6.1f} {t_wall[t]:7.1f}  {t}"
                                           for t, _ in (t_cpu or t_wall).most_common(top)]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("timeline", type=Path)
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    print(summary(parse(a.timeline), a.top))


if __name__ == "__main__":
    main()
