"""`hostd discover` on this machine (live /sys, /proc, /dev/kvm).

The development VM has 2 CPUs, one NUMA node, 2 MiB and 1 GiB hugepage sizes,
its root filesystem directly on /dev/vda, no udev daemon, and a /dev/kvm that
answers the API but cannot run a full guest (no VMX/SVM). The expected values
are cross-checked against sources the readers do not use (os.cpu_count, stat(2)
of "/", /sys/dev/block, /proc/cpuinfo's processor count).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hostd.discover import discover_host
from hostd.discover.model import Topology

pytestmark = pytest.mark.integration
G1 = 1024 * 1024


@pytest.fixture(scope="module")
def live() -> Topology:
    return discover_host(Path("/"), allow=(), virt_type="qemu", probe_versions=True)


def _root_disk() -> tuple[str, str]:
    """(disk, device) holding "/", from stat(2) and /sys/dev/block (not mountinfo)."""
    st = os.stat("/")
    dev = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}").resolve()
    disk = dev.parent.name if (dev / "partition").exists() else dev.name
    return disk, dev.name


def test_cpus_and_nodes(live: Topology) -> None:
    processors = sum(1 for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("processor"))
    assert len(live.cpus) == os.cpu_count() == processors == 2
    assert len(live.nodes) == 1
    (node,) = live.nodes
    assert node.cpus == tuple(c.id for c in live.cpus)
    assert node.memory_total_kb > node.memory_free_kb > 0
    assert all(c.online and c.siblings == (c.id,) for c in live.cpus)


def test_hugepage_sizes(live: Topology) -> None:
    assert 2048 in live.host.hugepage_sizes_kb
    assert G1 in live.host.hugepage_sizes_kb
    assert live.host.pdpe1gb
    assert [p.size_kb for p in live.nodes[0].hugepages] == [2048, G1]
    assert all(p.reserved is not None for p in live.host.hugepages)


def test_root_disk_is_not_assignable(live: Topology) -> None:
    disk, dev = _root_disk()
    d = next(x for x in live.disks if x.name == disk)
    assert not d.assignable
    assert "backs the root filesystem" in d.reasons
    assert f"mounted at / ({dev})" in d.reasons
    assert "/" in d.mountpoints


def test_root_disk_stays_blocked_even_when_allow_listed() -> None:
    disk, _ = _root_disk()
    topo = discover_host(Path("/"), allow=(disk,), virt_type="qemu", probe_versions=False)
    d = next(x for x in topo.disks if x.name == disk)
    assert not d.assignable
    assert not any(r.startswith("not in the allow-list") for r in d.reasons)


def test_host_facts_and_kvm(live: Topology) -> None:
    h = live.host
    assert h.kernel == os.uname().release
    assert h.arch == os.uname().machine
    assert h.hostname == os.uname().nodename
    flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    hw = " vmx" in flags or " svm" in flags
    assert h.kvm.full_guest_ok is hw
    assert h.kvm.present is os.path.exists("/dev/kvm")
    if h.kvm.usable:
        assert h.kvm.api_version == 12
    assert "virt_type=qemu: guests run under TCG (slow)" in h.warnings
    assert h.cgroup_version in (1, 2)


def test_virt_type_kvm_warns_without_vmx_svm() -> None:
    topo = discover_host(Path("/"), allow=(), virt_type="kvm", probe_versions=False)
    if topo.host.kvm.full_guest_ok:
        pytest.skip("this CPU has VMX/SVM: KVM can run full guests here")
    assert ("virt_type=kvm but this CPU has no VMX/SVM: KVM cannot run a full Linux guest here; "
            "use virt_type=qemu") in topo.host.warnings


def test_versions_probed(live: Topology) -> None:
    """libvirt and QEMU are installed on the dev machines (Debian 12: 9.0, 7.2)."""
    assert live.host.libvirt_version and live.host.libvirt_version.split(".")[0].isdigit()
    assert live.host.qemu_version and live.host.qemu_version.split(".")[0].isdigit()


@pytest.mark.root
def test_loop_disk_with_backing_file_is_assignable(loop_disk: Path) -> None:
    """A real loop device (conftest's loop_disk): listed with its backing file and size."""
    name = loop_disk.name
    topo = discover_host(Path("/"), allow=(name,), virt_type="qemu", probe_versions=False)
    d = next(x for x in topo.disks if x.name == name)
    assert d.backing_file and d.backing_file.endswith("disk.img")
    assert d.size_bytes == 256 * 2**20
    assert (d.assignable, d.reasons, d.id) == (True, (), None)
    other = discover_host(Path("/"), allow=("nomatch*",), virt_type="qemu", probe_versions=False)
    assert next(x for x in other.disks if x.name == name).reasons == ("not in the allow-list",)
