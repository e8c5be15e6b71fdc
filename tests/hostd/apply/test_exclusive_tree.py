"""The exclusive carve's plan on generated host trees (cgroup v1 and v2 layouts), so the
v2 partition path this v1 machine cannot run is covered: which processes move, which
kernel threads get a new affinity, which cannot move and why, IRQs and the workqueue; and
a generated 8-CPU tree (tools/dev/fleetsim_tree.py) planned from its own online CPUs,
never this machine's."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from tools.dev.fleetsim_tree import AGENT_PID, IO_PID, IO_TAG, write_tree

from api.layout import IoServiceTarget, Layout, NodeLayout
from hostd.apply.cgroups import CpusetFs, find_cpuset_fs
from hostd.apply.exclusive import (
    HOST_CGROUP,
    BestEffortAttr,
    KthreadAffinity,
    MoveOff,
    ReturnBorn,
    SweepBorn,
    plan_exclusive,
)
from hostd.apply.steps import MakeDir, WriteAttr
from hostd.discover.fs import HostFs
from hostd.errors import BadTopology

PF_KTHREAD, PF_NO_SETAFFINITY = 0x00200000, 0x04000000
LAYOUT = Layout(nodes=(NodeLayout(0, io_cpus=(0,), host_cpus=(1,), vm_cpus=(2, 3), hugepages=()),), pfs=(),
                disks=(), io_service=IoServiceTarget("process", "ossd"), vm_cgroup="machine", reboot_required=())


def write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def proc(root: Path, pid: int, comm: str, flags: int, cpus: str, cgroup: str, version: int) -> None:
    fields = ["S"] + ["0"] * 5 + [str(flags)] + ["0"] * 43
    write(root, f"proc/{pid}/stat", f"{pid} ({comm}) " + " ".join(fields) + "\n")
    write(root, f"proc/{pid}/comm", comm + "\n")
    write(root, f"proc/{pid}/status", f"Name:\t{comm}\nCpus_allowed_list:\t{cpus}\n")
    write(root, f"proc/{pid}/task/{pid}/status", f"Name:\t{comm}\nCpus_allowed_list:\t{cpus}\n")
    write(root, f"proc/{pid}/cgroup", f"3:cpuset:{cgroup}\n" if version == 1 else f"0::{cgroup}\n")


@pytest.fixture(params=[1, 2])
def host(tmp_path: Path, request):
    v = request.param
    root = tmp_path
    mount = root / ("sys/fs/cgroup/cpuset" if v == 1 else "sys/fs/cgroup")
    write(root, "sys/devices/system/cpu/online", "0-3\n")
    write(root, f"{mount.relative_to(root)}/cpuset.mems", "0\n")
    write(root, f"{mount.relative_to(root)}/cpuset.cpus", "0-3\n")
    if v == 2:
        write(root, f"{mount.relative_to(root)}/hyb-io/cpuset.cpus.partition", "member\n")
    proc(root, 100, "sshd", 0x400000, "0-3", "/", v)  # a host daemon in the root
    proc(root, 200, "qemu-system-x86", 0x400000, "2", "/machine/vm-1", v)  # a VM's: not touched
    proc(root, 300, "kswapd0", PF_KTHREAD, "0-3", "/", v)  # an unbound kernel thread
    proc(root, 400, "ksoftirqd/0", PF_KTHREAD | PF_NO_SETAFFINITY, "0", "/", v)  # per CPU
    write(root, "proc/irq/30/smp_affinity_list", "0-3\n")
    write(root, "proc/irq/31/smp_affinity_list", "0\n")
    write(root, "proc/irq/32/smp_affinity_list", "2-3\n")  # off io_cpus already
    write(root, "sys/devices/virtual/workqueue/cpumask", "f\n")
    return root, CpusetFs(mount, v)


def test_the_plan_takes_io_cpus_from_the_rest(host) -> None:
    root, fs = host
    steps, unmovable = plan_exclusive(LAYOUT, HostFs(root), fs, exclude_pids=frozenset(), io_cgroup="hyb-io")
    moves = {s.pid: s for s in steps if isinstance(s, MoveOff)}
    if fs.version == 1:
        assert isinstance(steps[0], MakeDir) and steps[0].path.endswith("hyb-host")
        # undone newest first: after the moved processes went back, before the cpuset goes
        assert [type(s) for s in steps[:5]] == [MakeDir, WriteAttr, WriteAttr, ReturnBorn, MoveOff]
        assert set(moves) == {100} and moves[100].affinity == {"100": "0-3"}  # not the VM's, not kthreads
    else:
        part = [s for s in steps if isinstance(s, BestEffortAttr) and "partition" in s.what]
        assert [(p.before, p.after) for p in part] == [("member", "root")] and not moves
    kt = [s for s in steps if isinstance(s, KthreadAffinity)]
    assert [(k.pid, k.before, k.after) for k in kt] == [(300, "0-3", "1-3")]
    assert [str(u) for u in unmovable] == ["1 per-CPU kernel threads: bound to their CPU by the kernel "
                                           "(ksoftirqd, kworker/N, migration, ...); isolcpus at boot quiets them"]
    irqs = {s.what: (s.before, s.after) for s in steps if isinstance(s, BestEffortAttr) and s.what.startswith("IRQ")}
    assert irqs == {"IRQ 30": ("0-3", "1-3"), "IRQ 31": ("0", "1-3")}
    wq = [s for s in steps if isinstance(s, BestEffortAttr) and "workqueue" in s.what]
    assert [(w.before, w.after) for w in wq] == [("f", "e")]


def test_io_cpus_that_are_every_cpu_leave_nowhere_to_go(host) -> None:
    root, fs = host
    every = Layout(nodes=(NodeLayout(0, io_cpus=(0, 1, 2, 3), host_cpus=(), vm_cpus=(), hugepages=()),), pfs=(),
                   disks=(), io_service=IoServiceTarget("none", ""), vm_cgroup="machine", reboot_required=())
    steps, unmovable = plan_exclusive(every, HostFs(root), fs, exclude_pids=frozenset(), io_cgroup="hyb-io")
    assert steps == [] and "nowhere to move" in str(unmovable[0])


@pytest.fixture
def sim_host(tmp_path: Path) -> Path:
    """A generated 8-CPU host (cgroup v1, this machine has 2) with an IRQ pinned to io_cpus."""
    root = tmp_path / "sim-host"
    write_tree(root, "sim-host")
    write(root, "proc/irq/31/smp_affinity_list", "0-1\n")
    return root


@pytest.mark.parametrize("online", ["online file", "cpuN directories only"])
def test_a_tree_gets_its_own_online_cpus_not_this_machines(sim_host: Path, online: str) -> None:
    """io_cpus 0-1 on an 8-CPU tree leave 2-7 for the rest, however the tree says which
    CPUs are online (the code before read this machine's affinity when the tree had no
    ``online`` file: on a 2-CPU machine, "nowhere to move the rest to")."""
    if online != "online file":
        (sim_host / "sys/devices/system/cpu/online").unlink()
    layout = Layout(nodes=(NodeLayout(0, io_cpus=(0, 1), host_cpus=(2, 3), vm_cpus=(4, 5, 6, 7), hugepages=()),),
                    pfs=(), disks=(), io_service=IoServiceTarget("process", IO_TAG), vm_cgroup="machine",
                    reboot_required=())
    host = HostFs(sim_host)
    cpuset = find_cpuset_fs(sim_host)
    steps, unmovable = plan_exclusive(layout, host, cpuset, exclude_pids=frozenset({IO_PID}), io_cgroup="hyb-io")
    assert unmovable == []
    hyb_host = [s for s in steps if isinstance(s, WriteAttr) and s.path.endswith(f"{HOST_CGROUP}/cpuset.cpus")]
    assert [s.after for s in hyb_host] == ["2-7"]
    moves = [s for s in steps if isinstance(s, MoveOff)]
    assert [(m.pid, m.affinity) for m in moves] == [(AGENT_PID, {str(AGENT_PID): "0-7"})]
    best = {s.what: (s.path, s.before, s.after) for s in steps if isinstance(s, BestEffortAttr)}
    assert best == {"IRQ 30": (f"{host.root}/proc/irq/30/smp_affinity_list", "0-7", "2-7"),
                    "IRQ 31": (f"{host.root}/proc/irq/31/smp_affinity_list", "0-1", "2-7"),
                    "unbound workqueue cpumask": (f"{host.root}/sys/devices/virtual/workqueue/cpumask", "ff", "fc")}


def test_a_tree_that_says_no_online_cpus_is_an_error(sim_host: Path) -> None:
    shutil.rmtree(sim_host / "sys/devices/system/cpu")
    with pytest.raises(BadTopology, match="/sys/devices/system/cpu: no online CPUs"):
        plan_exclusive(LAYOUT, HostFs(sim_host), find_cpuset_fs(sim_host), exclude_pids=frozenset(),
                       io_cgroup="hyb-io")


def test_what_is_born_during_the_carve_follows_its_parent_but_the_io_service_stays(host) -> None:
    """cgroup v1: the sweep after the moves reads the root cpuset again. A process born
    there since the plan's scan (600) moves, with its threads' affinities recorded; a
    kernel thread (300), an excluded pid (100: hostd) and an IO-service process born
    there (700) stay, the last one named."""
    root, fs = host
    if fs.version == 2:
        pytest.skip("cgroup v2 takes io_cpus with a partition, not by moving processes")
    from hostd.apply.steps import Context

    steps, _ = plan_exclusive(LAYOUT, HostFs(root), fs, exclude_pids=frozenset({100}), io_cgroup="hyb-io",
                              io_pattern="ossd")
    assert not any(isinstance(s, SweepBorn) for s in steps)  # nothing to move, nothing can escape
    steps, _ = plan_exclusive(LAYOUT, HostFs(root), fs, exclude_pids=frozenset(), io_cgroup="hyb-io",
                              io_pattern="ossd")
    sweep = next(s for s in steps if isinstance(s, SweepBorn))
    assert steps.index(sweep) > max(i for i, s in enumerate(steps) if isinstance(s, MoveOff))
    proc(root, 600, "postgres", 0x400000, "0-3", "/", 1)
    proc(root, 700, "ossd-worker", 0x400000, "0-3", "/", 1)
    write(root, "proc/700/cmdline", "/usr/bin/ossd\0--worker\0")
    write(root, "proc/600/cmdline", "postgres\0")
    write(root, "sys/fs/cgroup/cpuset/cgroup.procs", "100\n300\n600\n700\n")
    (fs.path(HOST_CGROUP)).mkdir(parents=True, exist_ok=True)
    sweep.exclude = [100]
    sweep.apply(Context(None, None))  # type: ignore[arg-type]
    assert sweep.moved == {"600": {"comm": "postgres", "affinity": {"600": "0-3"}}}
    assert (fs.path(HOST_CGROUP) / "cgroup.procs").read_text().strip() == "600"
    assert sweep.left == "pid 700 (ossd-worker): the IO service"
    assert sweep.describe().endswith("600 (postgres) [stays: pid 700 (ossd-worker): the IO service]")
