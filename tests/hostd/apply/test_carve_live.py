"""Carve and uncarve this machine for real: cgroup cpusets (v1 here, as the
host has them), the node's 2 MiB hugepage pool, a hugetlbfs mount, and a stand-in
IO service process moved onto its CPU. The host must end exactly as it began."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from api.layout import HugepageTarget, IoServiceTarget, Layout, NodeLayout
from hostd.apply.cgroups import find_cpuset_fs, pid_cpuset_cgroup
from hostd.apply.layout_steps import HostHandles, Journal, apply_layout, uncarve
from hostd.apply.steps import Context, SystemMounter

pytestmark = [pytest.mark.root, pytest.mark.integration, pytest.mark.quiet]

ROOT = Path("/")
POOL = Path("/sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages")


def _host_state(pid: int) -> dict[str, object]:
    fs = find_cpuset_fs(ROOT)
    assert fs is not None
    return {
        "cgroups": sorted(p.name for p in fs.mount.iterdir() if p.is_dir()),
        "pool": POOL.read_text().strip(),
        "hugetlbfs": sorted(l for l in Path("/proc/mounts").read_text().splitlines() if "hugetlbfs" in l),
        "pid_cgroup": pid_cpuset_cgroup(ROOT, pid, fs.version),
        "pid_cpus": _cpus_allowed(pid),
    }


def _cpus_allowed(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError("no Cpus_allowed_list")


def test_carve_this_host_and_restore_it(standin, tmp_path: Path) -> None:
    proc, tag = standin
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs")
    before = _host_state(proc.pid)
    want_pages = int(before["pool"]) + 16
    vm_cg = f"hyb-test-vms-{os.getpid()}"
    layout = Layout(
        nodes=(NodeLayout(0, io_cpus=(0,), host_cpus=(), vm_cpus=(1,),
                          hugepages=(HugepageTarget(2048, want_pages),)),),
        pfs=(), disks=(), io_service=IoServiceTarget("process", tag), vm_cgroup=vm_cg,
        reboot_required=())
    h = HostHandles(root=ROOT, cpuset=find_cpuset_fs(ROOT), vf_rates=None,
                    hugetlbfs_base=tmp_path / "mnt", exclude_pids=frozenset({os.getpid()}))
    (tmp_path / "mnt").mkdir()
    journal = Journal(tmp_path / "state/carve-journal.json")
    ctx = Context(None, SystemMounter())
    try:
        ran = apply_layout(layout, h, journal, ctx)
        assert ran, "first carve must change the host"
        assert _cpus_allowed(proc.pid) == "0"
        assert POOL.read_text().strip() == str(want_pages)
        assert (h.cpuset.path(vm_cg) / "cpuset.cpus").read_text().strip() == "1"
        mounts = Path("/proc/mounts").read_text()
        if not before["hugetlbfs"]:
            assert f"{tmp_path}/mnt/hugepages-2M hugetlbfs" in mounts
        # The stand-in keeps running on its CPU after the move.
        assert proc.poll() is None
        assert apply_layout(layout, h, journal, ctx) == [], "second carve must be a no-op"
    finally:
        if journal.path.exists():
            uncarve(journal, ctx)
    assert _host_state(proc.pid) == before
