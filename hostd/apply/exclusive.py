"""Keep ``io_cpus`` the IO service's, live, without a reboot (``isolcpus`` and
``irqaffinity`` only take effect at the next boot).

At carve, in the same journal as the rest:
- **tasks**: on cgroup v1 every process in the root cpuset moves to a ``hyb-host`` cpuset
  that has every CPU but ``io_cpus`` (its children are born there, so new tasks stay off);
  each of its threads' CPU affinity is recorded first, and ``uncarve`` moves it back and
  restores those affinities exactly. On cgroup v2 the IO service's cgroup becomes a
  cpuset partition root (``cpuset.cpus.partition = root``): its CPUs leave every other
  cgroup's effective set. Kernel threads that may move (unbound ones) get an affinity
  without ``io_cpus``;
- **IRQs**: every ``/proc/irq/N/smp_affinity_list`` that includes an ``io_cpu`` is set to
  the same CPUs without it;
- **unbound workqueues**: ``/sys/devices/virtual/workqueue/cpumask`` without ``io_cpus``.

What the kernel does not let move (per-CPU kernel threads, managed IRQs, a write it
refuses) is never silently skipped: the step records why, ``hostd carve`` prints it,
and the IO-health signal shows what still runs there.
"""

from __future__ import annotations

import errno
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from api.layout import Layout
from hostd.apply.cgroups import CpusetFs, pid_cpuset_cgroup
from hostd.apply.steps import Context, MakeDir, Step, WriteAttr
from hostd.apply.sysfs import write_attr
from hostd.cpulist import format_cpu_list, parse_cpu_list
from hostd.health.readers import PF_KTHREAD, split_stat

log = logging.getLogger(__name__)

HOST_CGROUP = "hyb-host"
PF_NO_SETAFFINITY = 0x04000000


@dataclass
class BestEffortAttr(Step):
    """Write an attribute the kernel may refuse (a managed IRQ, the workqueue mask): a
    refusal is recorded (``skipped``) and reported, not a failed carve. Undo writes the
    old value back where the write was taken."""

    kind: ClassVar[str] = "attr_best_effort"
    path: str
    before: str
    after: str
    what: str
    skipped: str = ""

    def apply(self, ctx: Context) -> None:
        try:
            write_attr(Path(self.path), self.after)
        except OSError as e:
            self.skipped = f"{self.what}: the kernel refused ({e.strerror or e})"
            log.warning("carve could not move %s", self.skipped)

    def undo(self, ctx: Context) -> None:
        if self.skipped:
            return
        write_attr(Path(self.path), self.before)

    def describe(self) -> str:
        tail = f" [cannot move: {self.skipped}]" if self.skipped else ""
        return f"set {self.what}: {self.before} -> {self.after}{tail}"


@dataclass
class MoveOff(Step):
    """Move a process to the host cpuset (off ``io_cpus``); undo moves it back and puts
    every thread's CPU affinity back as it was. A process that exits meanwhile is fine."""

    kind: ClassVar[str] = "move_off"
    pid: int
    comm: str
    before: str  # cgroup directory
    after: str
    affinity: dict[str, str] = field(default_factory=dict)  # tid -> CPU list before
    procs_file: str = "cgroup.procs"
    skipped: str = ""

    def apply(self, ctx: Context) -> None:
        try:
            write_attr(Path(self.after) / self.procs_file, self.pid)
        except OSError as e:
            if e.errno not in (errno.ESRCH, errno.EINVAL):
                raise
            self.skipped = f"pid {self.pid} ({self.comm}): {'exited' if e.errno == errno.ESRCH else 'refused'}"

    def undo(self, ctx: Context) -> None:
        if self.skipped:
            return
        try:
            write_attr(Path(self.before) / self.procs_file, self.pid)
        except OSError as e:
            if e.errno == errno.ESRCH:
                return  # gone
            raise
        for tid, cpus in self.affinity.items():
            try:
                os.sched_setaffinity(int(tid), parse_cpu_list(cpus))
            except (ProcessLookupError, OSError):
                pass  # the thread ended; the others still get theirs

    def describe(self) -> str:
        tail = f" [not moved: {self.skipped}]" if self.skipped else ""
        return f"move pid {self.pid} ({self.comm}) off io_cpus: {self.before} -> {self.after}{tail}"


@dataclass
class KthreadAffinity(Step):
    """An unbound kernel thread's CPU affinity without ``io_cpus``; undo restores it."""

    kind: ClassVar[str] = "kthread_affinity"
    pid: int
    comm: str
    before: str
    after: str
    skipped: str = ""

    def apply(self, ctx: Context) -> None:
        try:
            os.sched_setaffinity(self.pid, parse_cpu_list(self.after))
        except (ProcessLookupError, OSError) as e:
            self.skipped = f"kernel thread {self.pid} ({self.comm}): {getattr(e, 'strerror', None) or e}"

    def undo(self, ctx: Context) -> None:
        if self.skipped:
            return
        try:
            os.sched_setaffinity(self.pid, parse_cpu_list(self.before))
        except (ProcessLookupError, OSError):
            pass

    def describe(self) -> str:
        tail = f" [cannot move: {self.skipped}]" if self.skipped else ""
        return f"kernel thread {self.pid} ({self.comm}) affinity {self.before} -> {self.after}{tail}"


@dataclass(frozen=True)
class Unmovable:
    what: str
    why: str

    def __str__(self) -> str:
        return f"{self.what}: {self.why}"


def plan_exclusive(layout: Layout, root: Path, fs: CpusetFs, *, exclude_pids: frozenset[int],
                   io_cgroup: str) -> tuple[list[Step], list[Unmovable]]:
    """The steps that take ``io_cpus`` from everything but the IO service, and what
    cannot be taken (with the reason), from the host under ``root``."""
    io = set(layout.io_cpus)
    if not io:
        return [], []
    online = _online(root)
    rest = sorted(online - io)
    if not rest:
        return [], [Unmovable("host", "io_cpus are every online CPU: nowhere to move the rest to")]
    steps: list[Step] = []
    unmovable: list[Unmovable] = []
    procs = _processes(root)  # one scan of /proc for the tasks and the kernel threads
    if fs.version == 1:
        s, u = _v1_tasks(root, fs, rest, exclude_pids, procs)
    else:
        s, u = _v2_partition(fs, io_cgroup)
    steps += s
    unmovable += u
    s, u = _kthreads(root, io, rest, procs)
    steps += s
    unmovable += u
    steps += _irqs(root, io, rest)
    steps += _workqueue(root, io, online)
    return steps, unmovable


def _online(root: Path) -> set[int]:
    try:
        return set(parse_cpu_list((root / "sys/devices/system/cpu/online").read_text().strip()))
    except (OSError, ValueError):
        return set(os.sched_getaffinity(0))


def _v1_tasks(root: Path, fs: CpusetFs, rest: list[int], exclude: frozenset[int],
              procs: list[tuple[int, str, int]]) -> tuple[list[Step], list[Unmovable]]:
    host = fs.path(HOST_CGROUP)
    steps: list[Step] = []
    if not host.is_dir():
        steps.append(MakeDir(str(host)))
        cur_cpus = cur_mems = ""
    else:
        cur_cpus = (host / fs.cpus_file).read_text().strip()
        cur_mems = (host / fs.mems_file).read_text().strip()
    mems = (fs.mount / fs.mems_file).read_text().strip()
    if cur_mems != mems:
        steps.append(WriteAttr(str(host / fs.mems_file), cur_mems, mems))
    want = format_cpu_list(rest)
    if cur_cpus != want:
        steps.append(WriteAttr(str(host / fs.cpus_file), cur_cpus, want))
    for pid, comm, flags in procs:
        if pid in exclude or flags & PF_KTHREAD:
            continue
        try:
            where = pid_cpuset_cgroup(root, pid, 1)
        except (LookupError, OSError):
            continue
        if where != "/":  # the IO service (hyb-io), VMs (machine), or a cpuset someone chose
            continue
        steps.append(MoveOff(pid=pid, comm=comm, before=str(fs.mount), after=str(host),
                             affinity=_affinities(root, pid), procs_file=fs.procs_file))
    return steps, []


def _v2_partition(fs: CpusetFs, io_cgroup: str) -> tuple[list[Step], list[Unmovable]]:
    attr = fs.path(io_cgroup) / "cpuset.cpus.partition"
    if not attr.exists():
        return [], [Unmovable("cgroup v2", f"{attr} is missing: this kernel has no cpuset partitions")]
    cur = (attr.read_text().split() or ["member"])[0]
    if cur == "root":
        return [], []
    return [BestEffortAttr(str(attr), cur, "root", f"cpuset partition of {io_cgroup}")], []


def _kthreads(root: Path, io: set[int], rest: list[int],
              procs: list[tuple[int, str, int]]) -> tuple[list[Step], list[Unmovable]]:
    steps: list[Step] = []
    unmovable: list[Unmovable] = []
    per_cpu = 0
    for pid, comm, flags in procs:
        if not flags & PF_KTHREAD:
            continue
        cpus = _cpus_allowed(root / f"proc/{pid}/status")
        if cpus is None or not (set(cpus) & io):
            continue
        if flags & PF_NO_SETAFFINITY:
            per_cpu += 1
            continue
        keep = sorted(set(cpus) - io) or rest
        steps.append(KthreadAffinity(pid, comm, format_cpu_list(cpus), format_cpu_list(keep)))
    if per_cpu:
        unmovable.append(Unmovable(f"{per_cpu} per-CPU kernel threads", "bound to their CPU by the kernel "
                                   "(ksoftirqd, kworker/N, migration, ...); isolcpus at boot quiets them"))
    return steps, unmovable


def _irqs(root: Path, io: set[int], rest: list[int]) -> list[Step]:
    steps: list[Step] = []
    base = root / "proc/irq"
    try:
        irqs = sorted((d for d in os.listdir(base) if d.isdigit()), key=int)
    except OSError:
        return steps
    for irq in irqs:
        attr = base / irq / "smp_affinity_list"
        try:
            cur = parse_cpu_list(attr.read_text().strip())
        except (OSError, ValueError):
            continue
        if not set(cur) & io:
            continue
        keep = sorted(set(cur) - io) or rest
        steps.append(BestEffortAttr(str(attr), format_cpu_list(cur), format_cpu_list(keep), f"IRQ {irq}"))
    return steps


def _workqueue(root: Path, io: set[int], online: set[int]) -> list[Step]:
    attr = root / "sys/devices/virtual/workqueue/cpumask"
    try:
        cur = attr.read_text().strip()
        mask = int(cur.replace(",", ""), 16)
    except (OSError, ValueError):
        return []
    want = mask & ~sum(1 << c for c in io)
    if want == mask:
        return []
    if want == 0:
        want = sum(1 << c for c in online - io)
    return [BestEffortAttr(str(attr), cur, f"{want:x}", "unbound workqueue cpumask")]


def _processes(root: Path) -> list[tuple[int, str, int]]:
    """(pid, comm, flags) of every process, from /proc/<pid>/stat."""
    out = []
    for d in os.listdir(root / "proc"):
        if not d.isdigit():
            continue
        try:
            parts = split_stat((root / f"proc/{d}/stat").read_text())
            if parts is not None:
                out.append((int(d), parts[1], int(parts[2][6])))
        except (OSError, ValueError, IndexError):
            continue
    return sorted(out)


def _cpus_allowed(status: Path) -> list[int] | None:
    """Cpus_allowed_list of a /proc status file (what sched_getaffinity says, for any root)."""
    try:
        for line in status.read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                return sorted(parse_cpu_list(line.split(":", 1)[1].strip()))
    except (OSError, ValueError):
        return None
    return None


def _affinities(root: Path, pid: int) -> dict[str, str]:
    """Each thread's CPU affinity, to put back at uncarve."""
    out: dict[str, str] = {}
    try:
        tids = os.listdir(root / f"proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        cpus = _cpus_allowed(root / f"proc/{pid}/task/{tid}/status")
        if cpus is not None:
            out[tid] = format_cpu_list(cpus)
    return out
