"""Functional tests of the apply layer against a host tree in a temp directory.

The tree has the real attribute names and layouts of cgroup v1 cpuset, per-node
hugepage pools, /proc/<pid>/{cmdline,comm,cgroup} and a PF's sriov_numvfs; the
files are plain files, so a write is a file write. This stands in for a 2-node
host with an SR-IOV PF, which this machine is not; the real-machine path is in
test_carve_live.py. VF rates go to the in-memory PF stand-in in fakes.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes import RecordingVfRates

from api.layout import (
    HugepageTarget,
    IoServiceTarget,
    Layout,
    NodeLayout,
    PfLayout,
    VfSlot,
)
from hostd.apply.cgroups import find_cpuset_fs
from hostd.apply.layout_steps import HostHandles, Journal, apply_layout, plan_steps, uncarve
from hostd.apply.steps import Context
from hostd.errors import ApplyFailed, IoServiceNotFound, NotCarved


class TreeMounter:
    """Plays the kernel's part for mounts in a tree: keeps <tree>/proc/mounts true."""

    def __init__(self, root: Path, *, fail: bool = False) -> None:
        self.root = root
        self.fail = fail
        self.mounted: list[tuple[Path, int]] = []

    def _line(self, path: Path, kb: int) -> str:
        return f"hugetlbfs /{path.relative_to(self.root)} hugetlbfs rw,pagesize={kb // 1024}M 0 0\n"

    def mount_hugetlbfs(self, path: Path, pagesize_kb: int) -> None:
        if self.fail:
            raise ApplyFailed(f"mount {path}: permission denied", field=str(path))
        self.mounted.append((path, pagesize_kb))
        with open(self.root / "proc/mounts", "a") as f:
            f.write(self._line(path, pagesize_kb))

    def umount(self, path: Path) -> None:
        (kb,) = [k for p, k in self.mounted if p == path]
        self.mounted.remove((path, kb))
        mounts = self.root / "proc/mounts"
        mounts.write_text(mounts.read_text().replace(self._line(path, kb), ""))

    def is_mounted(self, path: Path) -> bool:
        return any(p == path for p, _ in self.mounted)


def _w(p: Path, text: str) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    r = tmp_path / "host"
    _w(r / "proc/mounts", "cgroup /sys/fs/cgroup/cpuset cgroup rw,relatime,cpuset 0 0\n"
       "hugetlbfs /dev/hugepages hugetlbfs rw,relatime,pagesize=2M 0 0\n")
    _w(r / "proc/meminfo", "MemTotal: 65536000 kB\nHugepagesize:       2048 kB\n")
    cg = r / "sys/fs/cgroup/cpuset"
    _w(cg / "cpuset.cpus", "0-7\n")
    _w(cg / "cpuset.mems", "0-1\n")
    _w(cg / "cgroup.procs", "")
    for node in (0, 1):
        for size in (2048, 1048576):
            _w(r / f"sys/devices/system/node/node{node}/hugepages/hugepages-{size}kB/nr_hugepages", "0\n")
    for pid, cmd in ((4242, b"/usr/bin/osd\0--id\0hyb-io-standin\0"), (4243, b"/usr/bin/osd\0--other\0")):
        _w(r / f"proc/{pid}/comm", "osd\n")
        (r / f"proc/{pid}/cmdline").write_bytes(cmd)
        _w(r / f"proc/{pid}/cgroup", "5:cpuset:/\n4:memory:/\n")
    _w(r / "sys/class/net/ens1f0/device/sriov_numvfs", "2\n")
    (r / "dev").mkdir()
    return r


def _layout(**over) -> Layout:
    base = dict(
        nodes=(NodeLayout(0, io_cpus=(0, 4), host_cpus=(1,), vm_cpus=(2, 3),
                          hugepages=(HugepageTarget(2048, 64), HugepageTarget(1048576, 1))),
               NodeLayout(1, io_cpus=(), host_cpus=(5,), vm_cpus=(6, 7),
                          hugepages=(HugepageTarget(2048, 32),))),
        pfs=(PfLayout("ens1f0", "0000:3b:00.0", 0, numvfs=4, bandwidth_mbps=10000,
                      slots=tuple(VfSlot(i, 1000, 0) for i in range(4))),),
        disks=(),
        io_service=IoServiceTarget("process", "hyb-io-standin"),
        vm_cgroup="machine",
        reboot_required=(),
    )
    base.update(over)
    return Layout(**base)


def _handles(tree: Path, vf: RecordingVfRates | None = None) -> HostHandles:
    return HostHandles(root=tree, cpuset=find_cpuset_fs(tree), vf_rates=vf or RecordingVfRates(),
                       hugetlbfs_base=tree / "dev")


def _snapshot(root: Path) -> dict[str, str]:
    # Kernel attributes read back with a newline whatever was written: compare values.
    return {str(p.relative_to(root)): (p.read_text().strip() if p.is_file() else "<dir>")
            for p in sorted(root.rglob("*")) if "journal" not in p.name}


def test_plan_steps_lists_every_change_in_order(tree: Path) -> None:
    steps = plan_steps(_layout(), _handles(tree))
    text = [s.describe() for s in steps]
    cg = tree / "sys/fs/cgroup/cpuset"
    assert text[:4] == [
        f"create {cg}/hyb-io",
        f"write {cg}/hyb-io/cpuset.mems: '' -> '0'",
        f"write {cg}/hyb-io/cpuset.cpus: '' -> '0,4'",
        f"move pid 4242 (osd) {cg} -> {cg}/hyb-io",
    ]
    assert f"write {cg}/machine/cpuset.cpus: '' -> '2-3,6-7'" in text
    assert f"write {cg}/machine/cpuset.mems: '' -> '0-1'" in text
    node0 = tree / "sys/devices/system/node/node0/hugepages"
    assert f"write {node0}/hugepages-1048576kB/nr_hugepages: '0' -> '1'" in text
    # 2M is mounted already; 1G gets its own mount point.
    assert f"mount hugetlbfs pagesize=1048576kB at {tree}/dev/hugepages-1G" in text
    numvfs = tree / "sys/class/net/ens1f0/device/sriov_numvfs"
    assert text.index(f"write {numvfs}: '2' -> '0'") + 1 == text.index(f"write {numvfs}: '0' -> '4'")
    assert sum("tx rate" in t for t in text) == 4
    # pid 4243 does not match the process pattern and is left alone.
    assert not any("4243" in t for t in text)


def test_apply_then_uncarve_restores_tree_exactly(tree: Path) -> None:
    before = _snapshot(tree)
    h = _handles(tree)
    journal = Journal(tree.parent / "state" / "carve-journal.json")
    mounter = TreeMounter(tree)
    ran = apply_layout(_layout(), h, journal, Context(h.vf_rates, mounter))
    cg = tree / "sys/fs/cgroup/cpuset"
    assert (cg / "machine/cpuset.cpus").read_text() == "2-3,6-7"
    assert (cg / "hyb-io/cgroup.procs").read_text() == "4242"
    assert (tree / "sys/devices/system/node/node1/hugepages/hugepages-2048kB/nr_hugepages").read_text() == "32"
    assert (tree / "sys/class/net/ens1f0/device/sriov_numvfs").read_text() == "4"
    assert h.vf_rates.rates[("ens1f0", 3)] == (1000, 0)
    assert mounter.mounted == [(tree / "dev/hugepages-1G", 1048576)]
    assert len(json.loads(journal.path.read_text())["steps"]) == len(ran)

    # Running twice changes nothing the second time. (The kernel would now show
    # pid 4242 in hyb-io; a plain-file tree needs the test to say so.)
    _w(tree / "proc/4242/cgroup", "5:cpuset:/hyb-io\n4:memory:/\n")
    assert apply_layout(_layout(), h, journal, Context(h.vf_rates, mounter)) == []

    uncarve(journal, Context(h.vf_rates, mounter))
    _w(tree / "proc/4242/cgroup", "5:cpuset:/\n4:memory:/\n")
    after = _snapshot(tree)
    # MovePid writes the pid back into the root cgroup.procs; a real cgroupfs
    # shows membership, a plain file keeps the last write.
    assert after.pop("sys/fs/cgroup/cpuset/cgroup.procs") == "4242"
    before.pop("sys/fs/cgroup/cpuset/cgroup.procs")
    assert after == before
    assert h.vf_rates.rates[("ens1f0", 0)] == (0, 0)
    assert not journal.path.exists()


def test_failing_step_rolls_back_everything_before_it(tree: Path) -> None:
    """The 1 GiB hugetlbfs mount fails after cgroups and pools were written:
    every earlier step of the run is undone and the journal is left empty."""
    before = _snapshot(tree)
    h = _handles(tree)
    journal = Journal(tree.parent / "state" / "carve-journal.json")
    with pytest.raises(ApplyFailed, match="permission denied"):
        apply_layout(_layout(pfs=()), h, journal, Context(h.vf_rates, TreeMounter(tree, fail=True)))
    after = _snapshot(tree)
    after.pop("sys/fs/cgroup/cpuset/cgroup.procs")
    before.pop("sys/fs/cgroup/cpuset/cgroup.procs")
    assert after == before
    assert not journal.path.exists()


def test_missing_io_service_is_refused_before_any_change(tree: Path) -> None:
    before = _snapshot(tree)
    h = _handles(tree)
    journal = Journal(tree.parent / "state" / "carve-journal.json")
    lay = _layout(io_service=IoServiceTarget("process", "no-such-service"))
    with pytest.raises(IoServiceNotFound) as e:
        apply_layout(lay, h, journal, Context(h.vf_rates, TreeMounter(tree)))
    assert e.value.field == "io_service.process"
    assert _snapshot(tree) == before


def test_uncarve_without_journal_says_so(tree: Path) -> None:
    with pytest.raises(NotCarved):
        uncarve(Journal(tree / "none.json"), Context(None, TreeMounter(tree)))


def test_vf_rate_refused_by_driver_rolls_back(tree: Path) -> None:
    """Drivers that answer EINVAL to min_tx_rate (many Intel ones): the carve
    fails naming the step and leaves VF count and rates as they were."""
    vf = RecordingVfRates(einval_min=True)
    h = _handles(tree, vf)
    before = _snapshot(tree)
    lay = _layout(nodes=(), pfs=(PfLayout("ens1f0", "0000:3b:00.0", 0, 2, 10000,
                                          (VfSlot(0, 1000, 100),)),),
                  io_service=IoServiceTarget("none", ""))
    with pytest.raises(ApplyFailed, match="min 0->100"):
        apply_layout(lay, h, Journal(tree.parent / "j.json"), Context(vf, TreeMounter(tree)))
    assert _snapshot(tree) == before
    assert vf.rates.get(("ens1f0", 0), (0, 0)) == (0, 0)


def test_cgroup_v2_enables_cpuset_and_restores_subtree_control(tmp_path: Path) -> None:
    """A cgroup v2 host (what most current distros have; this machine has v1):
    the cpuset controller is enabled in the root's subtree_control before the
    child cgroups get CPUs, and disabled again on uncarve."""
    r = tmp_path / "v2"
    _w(r / "proc/mounts", "cgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n")
    _w(r / "proc/meminfo", "Hugepagesize:       2048 kB\n")
    cg = r / "sys/fs/cgroup"
    _w(cg / "cgroup.controllers", "cpuset cpu io memory pids\n")
    _w(cg / "cgroup.subtree_control", "cpu memory\n")
    _w(r / "proc/77/comm", "osd\n")
    (r / "proc/77/cmdline").write_bytes(b"osd\0hyb-io-standin\0")
    _w(r / "proc/77/cgroup", "0::/system.slice/osd.service\n")
    _w(cg / "system.slice/osd.service/cgroup.procs", "77\n")
    h = HostHandles(root=r, cpuset=find_cpuset_fs(r), vf_rates=None, hugetlbfs_base=r / "dev")
    assert h.cpuset is not None and h.cpuset.version == 2
    lay = _layout(nodes=(NodeLayout(0, (0,), (1,), (2, 3), ()),), pfs=())
    steps = plan_steps(lay, h)
    assert steps[0].describe() == f"write {cg}/cgroup.subtree_control: '-cpuset' -> '+cpuset'"
    assert f"move pid 77 (osd) {cg}/system.slice/osd.service -> {cg}/hyb-io" in [s.describe() for s in steps]
    j = Journal(tmp_path / "j.json")
    apply_layout(lay, h, j, Context(None, TreeMounter(r)))
    assert (cg / "cgroup.subtree_control").read_text() == "+cpuset"
    assert (cg / "machine/cpuset.cpus").read_text() == "2-3"
    uncarve(j, Context(None, TreeMounter(r)))
    assert (cg / "system.slice/osd.service/cgroup.procs").read_text() == "77"
    assert (cg / "cgroup.subtree_control").read_text() == "-cpuset"
    assert not (cg / "machine").exists() and not (cg / "hyb-io").exists()
