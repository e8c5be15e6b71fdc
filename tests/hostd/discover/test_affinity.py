"""What runs where, read from generated host trees (tools/dev/fleetsim_tree.py: 8 CPUs,
two processes, two IRQs, the workqueue mask), never from this machine: the processes
and kernel threads with their flags, each thread's affinity, the IRQs', the workqueue
mask and the online CPUs; and what a tree that lacks a file answers."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from tools.dev.fleetsim_tree import AGENT_PID, IO_PID, write_tree

from hostd.discover.affinity import (
    PF_KTHREAD,
    PF_NO_SETAFFINITY,
    CpuMask,
    IrqAffinity,
    Task,
    read_cpus_allowed,
    read_irq_affinities,
    read_tasks,
    read_thread_affinities,
    read_workqueue_mask,
    split_stat,
)
from hostd.discover.cpus import online_cpus
from hostd.discover.fs import HostFs

EIGHT = frozenset(range(8))
FLAGS = 0x400040  # what fleetsim_tree writes for a user process (PF_FORKNOEXEC | PF_RANDOMIZE)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "sim-host"
    write_tree(root, "sim-host")
    return root


def write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def kthread(root: Path, pid: int, comm: str, flags: int, cpus: str) -> None:
    write(root, f"proc/{pid}/stat", f"{pid} ({comm}) I 2 0 0 0 -1 {flags} " + "0 " * 44 + "\n")
    write(root, f"proc/{pid}/status", f"Name:\t{comm}\nCpus_allowed_list:\t{cpus}\n")


def test_the_tree_says_what_runs_where(tree: Path) -> None:
    fs = HostFs(tree)
    assert read_tasks(fs) == (Task(IO_PID, "ossd", FLAGS), Task(AGENT_PID, "node-agent", FLAGS))
    assert read_cpus_allowed(fs, AGENT_PID) == EIGHT
    assert read_thread_affinities(fs, IO_PID) == {IO_PID: EIGHT, IO_PID + 1: EIGHT}
    assert read_irq_affinities(fs) == (IrqAffinity(30, EIGHT), IrqAffinity(31, EIGHT))
    assert read_irq_affinities(fs)[0].attr == "proc/irq/30/smp_affinity_list"
    assert read_workqueue_mask(fs) == CpuMask("ff", EIGHT)
    assert online_cpus(fs) == EIGHT
    assert fs.warnings == []


def test_kernel_threads_and_odd_comms(tree: Path) -> None:
    kthread(tree, 9, "kworker/u16:2-events (x)", PF_KTHREAD, "0-7")
    kthread(tree, 12, "ksoftirqd/0", PF_KTHREAD | PF_NO_SETAFFINITY, "0")
    write(tree, "proc/77/cmdline", "")  # ended: its stat is gone
    write(tree, "proc/78/stat", "78 no parentheses\n")
    write(tree, "proc/irq/40/smp_affinity_list", "0,2-3\n")
    write(tree, "proc/irq/default_smp_affinity", "ff\n")
    fs = HostFs(tree)
    tasks = {t.pid: t for t in read_tasks(fs)}
    assert sorted(tasks) == [9, 12, IO_PID, AGENT_PID]
    assert tasks[9].comm == "kworker/u16:2-events (x)" and tasks[9].kthread and not tasks[9].kernel_pinned
    assert tasks[12].kthread and tasks[12].kernel_pinned
    assert not tasks[IO_PID].kthread
    assert read_cpus_allowed(fs, 12) == frozenset({0})
    assert [(a.irq, a.cpus) for a in read_irq_affinities(fs)] == [(30, EIGHT), (31, EIGHT), (40, frozenset({0, 2, 3}))]
    assert split_stat("1 (a) b) S 0") == ("1", "a) b", ["S", "0"])


def test_online_cpus_come_from_the_tree_however_it_says_them(tree: Path) -> None:
    cpu = tree / "sys/devices/system/cpu"
    (cpu / "online").unlink()  # older layouts: cpuN directories, each with its own online
    assert online_cpus(HostFs(tree)) == EIGHT
    write(tree, "sys/devices/system/cpu/cpu3/online", "0\n")
    assert online_cpus(HostFs(tree)) == EIGHT - {3}
    shutil.rmtree(cpu)
    assert online_cpus(HostFs(tree)) == frozenset(), "nothing to read is nothing, not this machine's CPUs"


def test_a_tree_without_the_files_answers_empty(tmp_path: Path) -> None:
    fs = HostFs(tmp_path)
    assert read_tasks(fs) == () and read_irq_affinities(fs) == () and read_workqueue_mask(fs) is None
    assert read_cpus_allowed(fs, 1) is None and read_thread_affinities(fs, 1) == {}
    write(tmp_path, "sys/devices/virtual/workqueue/cpumask", "not hex\n")
    assert read_workqueue_mask(fs) is None
    assert fs.warnings == ["/sys/devices/virtual/workqueue/cpumask: expected a hex CPU mask, found 'not hex'"]


def test_a_wide_workqueue_mask(tmp_path: Path) -> None:
    write(tmp_path, "sys/devices/virtual/workqueue/cpumask", "00000001,00000000,fffffffe\n")
    mask = read_workqueue_mask(HostFs(tmp_path))
    assert mask == CpuMask("00000001,00000000,fffffffe", frozenset(range(1, 32)) | {64})
