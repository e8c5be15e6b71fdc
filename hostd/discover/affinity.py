"""What runs where, read from /proc and /sys under a ``HostFs``: the processes and kernel
threads (their flags), each thread's CPU affinity, every IRQ's affinity and the unbound
workqueues' cpumask. The exclusive carve (``hostd/apply/exclusive.py``) plans from these
answers; nothing here decides or writes.

The affinities come from files (``Cpus_allowed_list`` in ``/proc/<pid>/task/<tid>/status``
is what ``sched_getaffinity`` answers), so a recorded or generated tree answers for itself.
A process that ends while it is read is left out; a file the tree lacks is an empty
answer (no IRQs, no workqueue mask), never this machine's value.
"""

from __future__ import annotations

from dataclasses import dataclass

from hostd.cpulist import CpuListError, parse_cpu_list
from hostd.discover.fs import HostFs

PF_KTHREAD = 0x00200000  # task flags (``/proc/<pid>/stat`` field 9): a kernel thread
PF_NO_SETAFFINITY = 0x04000000  # the kernel pins it (per-CPU kernel threads)
WORKQUEUE_MASK = "sys/devices/virtual/workqueue/cpumask"


def split_stat(line: str) -> tuple[str, str, list[str]] | None:
    """A ``/proc/<pid>[/task/<tid>]/stat`` line -> (pid, comm, fields from field 3 on:
    ``[0]`` state, ``[6]`` flags, ``[11]``/``[12]`` utime/stime, ``[36]`` processor).
    The comm may hold spaces and parentheses: it ends at the last ``)``."""
    head, sep, tail = line.rpartition(")")
    if not sep:
        return None
    pid, _, comm = head.partition(" (")
    return pid, comm, tail.split()


@dataclass(frozen=True)
class Task:
    """A process (its main thread) as ``/proc/<pid>/stat`` shows it."""

    pid: int
    comm: str
    flags: int

    @property
    def kthread(self) -> bool:
        return bool(self.flags & PF_KTHREAD)

    @property
    def kernel_pinned(self) -> bool:
        """The kernel refuses a new affinity (``PF_NO_SETAFFINITY``: ksoftirqd/N, ...)."""
        return bool(self.flags & PF_NO_SETAFFINITY)


def read_task(fs: HostFs, pid: int) -> Task | None:
    """One process as its ``stat`` shows it; None when it ended (or the line is not one)."""
    text = fs.text(f"proc/{pid}/stat", optional=True)
    parts = split_stat(text) if text else None
    if parts is None:
        return None
    try:
        return Task(pid, parts[1], int(parts[2][6]))
    except (ValueError, IndexError):
        return None


def read_tasks(fs: HostFs) -> tuple[Task, ...]:
    """Every process, kernel threads included, by pid."""
    out = [t for d in fs.listdir("proc") if d.isdigit() and (t := read_task(fs, int(d))) is not None]
    return tuple(sorted(out, key=lambda t: t.pid))


def read_cpus_allowed(fs: HostFs, pid: int, tid: int | None = None) -> frozenset[int] | None:
    """A process's (or one of its threads') CPU affinity; None when it is gone."""
    rel = f"proc/{pid}/status" if tid is None else f"proc/{pid}/task/{tid}/status"
    for line in fs.lines(rel, optional=True):
        if line.startswith("Cpus_allowed_list:"):
            try:
                return parse_cpu_list(line.split(":", 1)[1].strip())
            except CpuListError:
                return None
    return None


def read_thread_affinities(fs: HostFs, pid: int) -> dict[int, frozenset[int]]:
    """tid -> CPU affinity, for every thread of ``pid`` still there."""
    out: dict[int, frozenset[int]] = {}
    for tid in fs.listdir(f"proc/{pid}/task"):
        if tid.isdigit() and (cpus := read_cpus_allowed(fs, pid, int(tid))) is not None:
            out[int(tid)] = cpus
    return out


def irq_affinity_attr(irq: int) -> str:
    """The file that holds an IRQ's affinity, relative to the host root."""
    return f"proc/irq/{irq}/smp_affinity_list"


@dataclass(frozen=True)
class IrqAffinity:
    irq: int
    cpus: frozenset[int]

    @property
    def attr(self) -> str:
        return irq_affinity_attr(self.irq)


def read_irq_affinities(fs: HostFs) -> tuple[IrqAffinity, ...]:
    """Every IRQ's ``smp_affinity_list``, by IRQ number."""
    out: list[IrqAffinity] = []
    for d in fs.listdir("proc/irq"):
        if not d.isdigit():
            continue
        cpus = fs.cpu_list(irq_affinity_attr(int(d)), optional=True)
        if cpus is not None:
            out.append(IrqAffinity(int(d), cpus))
    return tuple(sorted(out, key=lambda a: a.irq))


@dataclass(frozen=True)
class CpuMask:
    """A hex CPU mask file: its text as the kernel wrote it (``ff``, ``ffffffff,ffffffff``)
    and the CPUs it holds."""

    text: str
    cpus: frozenset[int]


def read_workqueue_mask(fs: HostFs) -> CpuMask | None:
    """The CPUs unbound workqueues may run on; None when the kernel (or tree) has no file."""
    text = fs.text(WORKQUEUE_MASK, optional=True)
    if text is None:
        return None
    try:
        mask = int(text.replace(",", ""), 16)
    except ValueError:
        fs.warn(f"{fs.show(WORKQUEUE_MASK)}: expected a hex CPU mask, found {text[:40]!r}")
        return None
    return CpuMask(text, frozenset(c for c in range(mask.bit_length()) if mask >> c & 1))
