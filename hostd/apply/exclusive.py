"""Keep ``io_cpus`` the IO service's, live, without a reboot (``isolcpus`` and
``irqaffinity`` only take effect at the next boot).

At carve, in the same journal as the rest:
- **tasks**: on cgroup v1 every process in the root cpuset moves to a ``hyb-host`` cpuset
  that has every CPU but ``io_cpus`` (its children are born there, so new tasks stay off);
  each of its threads' CPU affinity is recorded first, and ``uncarve`` moves it back and
  restores those affinities exactly (what their children started there meanwhile goes
  back to the root cpuset too). A process born in the root cpuset between the scan and
  its parent's move is swept after the moves (``SweepBorn``). On cgroup v2 the IO service's cgroup becomes a
  cpuset partition root (``cpuset.cpus.partition = root``): its CPUs leave every other
  cgroup's effective set. Kernel threads that may move (unbound ones) get an affinity
  without ``io_cpus``;
- **IRQs**: every ``/proc/irq/N/smp_affinity_list`` that includes an ``io_cpu`` is set to
  the same CPUs without it;
- **unbound workqueues**: ``/sys/devices/virtual/workqueue/cpumask`` without ``io_cpus``;
- **new tasks, on systemd hosts with cgroup v2**: ``AllowedCPUs=`` drop-ins for
  ``system.slice`` and ``user.slice`` (``systemd_dropins.py`` says which, why, and how
  uncarve puts each file back byte for byte).

What runs where is read through the host-filesystem seam (``HostFs``) by
``hostd/discover/affinity.py``, the online CPUs by ``hostd/discover/cpus.py``: a tree
answers for itself, never with this machine's CPUs.

What the kernel does not let move (per-CPU kernel threads, managed IRQs, a write it
refuses) is never silently skipped: the step records why, ``hostd carve`` prints it,
and the IO-health signal shows what still runs there.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from api.layout import Layout
from hostd.apply.cgroups import CpusetFs, cmdline_matches, pid_cpuset_cgroup
from hostd.apply.steps import Context, MakeDir, Step, WriteAttr
from hostd.apply.sysfs import write_attr
from hostd.apply.systemd_dropins import SystemdDropIns, plan_systemd_dropins
from hostd.apply.unmovable import Unmovable
from hostd.cpulist import format_cpu_list, parse_cpu_list
from hostd.discover.affinity import (
    WORKQUEUE_MASK,
    Task,
    read_cpus_allowed,
    read_irq_affinities,
    read_task,
    read_tasks,
    read_thread_affinities,
    read_workqueue_mask,
    split_stat,
)
from hostd.discover.cpus import CPU_DIR, online_cpus
from hostd.discover.fs import HostFs
from hostd.errors import BadTopology

log = logging.getLogger(__name__)

HOST_CGROUP = "hyb-host"
RETURN_ROUNDS = 10
RETURN_WAIT_S = 10.0


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


@dataclass
class ReturnBorn(Step):
    """Nothing at carve. At uncarve, once every moved process went back: what was born in
    the host cpuset while the carve stood (a moved server's new workers, a login's shell)
    goes back to the root cpuset too, where its ancestors came from, so that the cpuset
    can be removed (``rmdir`` of a cpuset that holds a task is EBUSY).

    Until ``RETURN_WAIT_S``: what it holds may fork meanwhile, and a process that is
    exiting cannot be moved at all (the kernel skips a task with ``PF_EXITING`` without
    an error) yet holds the cpuset until its exit is through, which for a process that
    freed 1 GiB took tens of milliseconds here. Measured: ten rounds back to back gave
    up within 30 ms on such a process and the ``rmdir`` failed EBUSY, failing a rollback
    in CI. Once the cpuset lists nothing, an exiting task no longer holds it. What is
    still there at the deadline is named in the error, and a second uncarve tries again."""

    kind: ClassVar[str] = "return_born"
    cgroup: str
    home: str
    procs_file: str = "cgroup.procs"

    def apply(self, ctx: Context) -> None:
        return

    def undo(self, ctx: Context) -> None:
        deadline = time.monotonic() + RETURN_WAIT_S
        pause = 0.005
        moved: set[str] = set()
        while True:
            try:
                pids = (Path(self.cgroup) / self.procs_file).read_text().split()
            except FileNotFoundError:
                return
            if not pids:
                break
            if time.monotonic() >= deadline:
                raise OSError(errno.EBUSY, f"{self.cgroup} still holds {_describe_pids(pids)} after "
                              f"{RETURN_WAIT_S:g} s of moving them back to {self.home}")
            for pid in pids:
                try:
                    write_attr(Path(self.home) / self.procs_file, pid)
                    moved.add(pid)
                except OSError as e:
                    if e.errno != errno.ESRCH:  # ended meanwhile
                        raise
            if set(pids) <= moved:  # seen before: exiting, or forking as fast as it is moved
                time.sleep(pause)
                pause = min(pause * 2, 0.1)
        if moved:
            log.info("uncarve moved %d processes born in %s back to %s", len(moved), self.cgroup, self.home)

    def describe(self) -> str:
        return f"at uncarve, move what was born in {self.cgroup} meanwhile back to {self.home}"


def _describe_pids(pids: list[str]) -> str:
    """``pid (comm, state)`` for each, as ``/proc/<pid>/stat`` shows it, for an error an
    operator can act on."""
    host = HostFs("/")
    out = []
    for pid in pids[:10]:
        text = host.text(f"proc/{pid}/stat", optional=True)
        parts = split_stat(text) if text else None
        out.append(f"{pid} ({parts[1]}, state {parts[2][0]})" if parts and parts[2] else f"{pid} (ended)")
    more = f" and {len(pids) - 10} more" if len(pids) > 10 else ""
    return "processes " + ", ".join(out) + more


@dataclass
class SweepBorn(Step):
    """At carve, after every ``MoveOff``: a process born in the root cpuset between the
    scan the plan read and its parent's move (a server's new worker, a build's compiler)
    escaped the plan and would keep running on ``io_cpus``. It moves to the host cpuset
    too, in rounds, as it may fork meanwhile; a process the kernel refuses or the IO
    service (its command line holds ``io_pattern``) stays, and is named in ``left``.
    Undo moves each back to the root cpuset and puts its threads' affinities back, as
    ``MoveOff`` does. (A server that starts workers mid-carve is the usual case: without
    this step a PostgreSQL server's new workers run on the IO CPU, 0.56 CPU-s/s measured.)"""

    kind: ClassVar[str] = "sweep_born"
    root: str  # the host's root, for /proc
    home: str  # the root cpuset
    cgroup: str  # the host cpuset
    exclude: list[int] = field(default_factory=list)
    io_pattern: str = ""
    procs_file: str = "cgroup.procs"
    moved: dict[str, dict[str, object]] = field(default_factory=dict)  # pid -> {"comm", "affinity"}
    left: str = ""

    def apply(self, ctx: Context) -> None:
        host = HostFs(self.root)
        tried = set(self.exclude)
        left: list[str] = []
        for _ in range(RETURN_ROUNDS):
            pids = (Path(self.home) / self.procs_file).read_text().split()
            born = [int(p) for p in pids if p.isdigit() and int(p) not in tried]
            if not born:
                break
            for pid in born:
                tried.add(pid)
                task = read_task(host, pid)
                if task is None or task.kthread:
                    continue  # ended; kernel threads: the plan's KthreadAffinity steps decide
                comm = task.comm
                try:
                    if self.io_pattern and cmdline_matches(host.root, pid, self.io_pattern):
                        left.append(f"pid {pid} ({comm}): the IO service")
                        continue
                except (FileNotFoundError, ProcessLookupError, PermissionError):
                    continue  # ended (find_pids skips what it cannot read alike)
                affinity = {str(tid): format_cpu_list(cpus) for tid, cpus in read_thread_affinities(host, pid).items()}
                try:
                    write_attr(Path(self.cgroup) / self.procs_file, pid)
                except OSError as e:
                    if e.errno == errno.ESRCH:
                        continue
                    if e.errno != errno.EINVAL:
                        raise
                    left.append(f"pid {pid} ({comm}): refused")
                    continue
                self.moved[str(pid)] = {"comm": comm, "affinity": affinity}
        if self.moved:
            log.info("carve moved %d processes born during it off io_cpus", len(self.moved))
        self.left = "; ".join(left)

    def undo(self, ctx: Context) -> None:
        for pid, rec in self.moved.items():
            MoveOff(pid=int(pid), comm=str(rec.get("comm", "")), before=self.home, after=self.cgroup,
                    affinity=dict(rec.get("affinity") or {}), procs_file=self.procs_file).undo(ctx)

    def describe(self) -> str:
        moved = ", ".join(f"{pid} ({rec.get('comm', '')})" for pid, rec in self.moved.items()) or "none"
        tail = f" [stays: {self.left}]" if self.left else ""
        return f"move what was born in {self.home} during the carve to {self.cgroup}: {moved}{tail}"


EXCLUSIVE_STEPS: tuple[type[Step], ...] = (BestEffortAttr, MoveOff, KthreadAffinity, ReturnBorn, SweepBorn,
                                           SystemdDropIns)  # journal kinds


def plan_exclusive(layout: Layout, host: HostFs, cpuset: CpusetFs, *, exclude_pids: frozenset[int],
                   io_cgroup: str, io_pattern: str = "") -> tuple[list[Step], list[Unmovable]]:
    """The steps that take ``io_cpus`` from everything but the IO service, and what
    cannot be taken (with the reason), from the host ``host`` reads (``HostFs("/")``:
    this machine). A host whose online CPUs cannot be read is ``BadTopology``."""
    io = set(layout.io_cpus)
    if not io:
        return [], []
    online = online_cpus(host)
    if not online:
        raise BadTopology(f"{host.show(CPU_DIR)}: no online CPUs to be read (no online file, no cpuN "
                          "directories): cannot tell where the rest may run", field="cpus")
    rest = sorted(online - io)
    if not rest:
        return [], [Unmovable("host", "io_cpus are every online CPU: nowhere to move the rest to")]
    steps: list[Step] = []
    unmovable: list[Unmovable] = []
    tasks = read_tasks(host)  # one scan of /proc for the tasks and the kernel threads
    if cpuset.version == 1:
        steps += _v1_tasks(host, cpuset, rest, exclude_pids, tasks, io_pattern)
    else:
        s, u = _v2_partition(cpuset, io_cgroup)
        steps += s
        unmovable += u
    s, u = _kthreads(host, io, rest, tasks)
    steps += s
    unmovable += u
    steps += _irqs(host, io, rest)
    steps += _workqueue(host, io, online)
    s, u = plan_systemd_dropins(layout, host, cpuset, rest, io_cgroup)
    steps += s
    unmovable += u
    return steps, unmovable


def _v1_tasks(host: HostFs, fs: CpusetFs, rest: list[int], exclude: frozenset[int],
              tasks: tuple[Task, ...], io_pattern: str) -> list[Step]:
    """cgroup v1: every process of the root cpuset into ``hyb-host`` (every CPU but
    ``io_cpus``), where its children are born too; then what was born meanwhile."""
    hostcg = fs.path(HOST_CGROUP)
    steps: list[Step] = []
    created = not hostcg.is_dir()
    if created:
        steps.append(MakeDir(str(hostcg)))
        cur_cpus = cur_mems = ""
    else:
        cur_cpus = (hostcg / fs.cpus_file).read_text().strip()
        cur_mems = (hostcg / fs.mems_file).read_text().strip()
    mems = (fs.mount / fs.mems_file).read_text().strip()
    if cur_mems != mems:
        steps.append(WriteAttr(str(hostcg / fs.mems_file), cur_mems, mems))
    want = format_cpu_list(rest)
    if cur_cpus != want:
        steps.append(WriteAttr(str(hostcg / fs.cpus_file), cur_cpus, want))
    if created:  # ours to remove at uncarve, with what is born in it
        steps.append(ReturnBorn(str(hostcg), str(fs.mount), fs.procs_file))
    for t in tasks:
        if t.pid in exclude or t.kthread:
            continue
        try:
            where = pid_cpuset_cgroup(host.root, t.pid, 1)
        except (LookupError, OSError):
            continue
        if where != "/":  # the IO service (hyb-io), VMs (machine), or a cpuset someone chose
            continue
        affinity = {str(tid): format_cpu_list(cpus) for tid, cpus in read_thread_affinities(host, t.pid).items()}
        steps.append(MoveOff(pid=t.pid, comm=t.comm, before=str(fs.mount), after=str(hostcg),
                             affinity=affinity, procs_file=fs.procs_file))
    if any(isinstance(s, MoveOff) for s in steps):  # only a moved parent's child can escape the plan
        steps.append(SweepBorn(str(host.root), str(fs.mount), str(hostcg), sorted(exclude), io_pattern,
                               fs.procs_file))
    return steps


def _v2_partition(fs: CpusetFs, io_cgroup: str) -> tuple[list[Step], list[Unmovable]]:
    """cgroup v2: the IO service's cgroup a cpuset partition root, so its CPUs leave
    every other cgroup's effective set."""
    attr = fs.path(io_cgroup) / "cpuset.cpus.partition"
    if not attr.exists():
        return [], [Unmovable("cgroup v2", f"{attr} is missing: this kernel has no cpuset partitions")]
    cur = (attr.read_text().split() or ["member"])[0]
    if cur == "root":
        return [], []
    return [BestEffortAttr(str(attr), cur, "root", f"cpuset partition of {io_cgroup}")], []


def _kthreads(host: HostFs, io: set[int], rest: list[int],
              tasks: tuple[Task, ...]) -> tuple[list[Step], list[Unmovable]]:
    steps: list[Step] = []
    unmovable: list[Unmovable] = []
    per_cpu = 0
    for t in tasks:
        if not t.kthread:
            continue
        cpus = read_cpus_allowed(host, t.pid)
        if cpus is None or not (cpus & io):
            continue
        if t.kernel_pinned:
            per_cpu += 1
            continue
        keep = sorted(cpus - io) or rest
        steps.append(KthreadAffinity(t.pid, t.comm, format_cpu_list(cpus), format_cpu_list(keep)))
    if per_cpu:
        unmovable.append(Unmovable(f"{per_cpu} per-CPU kernel threads", "bound to their CPU by the kernel "
                                   "(ksoftirqd, kworker/N, migration, ...); isolcpus at boot quiets them"))
    return steps, unmovable


def _irqs(host: HostFs, io: set[int], rest: list[int]) -> list[Step]:
    steps: list[Step] = []
    for a in read_irq_affinities(host):
        if not a.cpus & io:
            continue
        keep = sorted(a.cpus - io) or rest
        steps.append(BestEffortAttr(str(host.path(a.attr)), format_cpu_list(a.cpus), format_cpu_list(keep),
                                    f"IRQ {a.irq}"))
    return steps


def _workqueue(host: HostFs, io: set[int], online: frozenset[int]) -> list[Step]:
    mask = read_workqueue_mask(host)
    if mask is None or not mask.cpus & io:
        return []
    keep = (mask.cpus - io) or (online - io)
    return [BestEffortAttr(str(host.path(WORKQUEUE_MASK)), mask.text, f"{sum(1 << c for c in keep):x}",
                           "unbound workqueue cpumask")]
