"""Odd and broken hosts: discover never raises, it degrades and says so.

Each test copies a recorded tree (tests/data/hosts/, not this machine) into a
temp directory and changes what a real kernel or a half-configured host would
show differently: an offline CPU, a kernel without NUMA, garbage in attribute
files, a CPU without VMX, a root on overlayfs, no cpuset controller.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hostd.discover import discover_host
from hostd.discover.model import HugepagePool, Topology

HOSTS = Path(__file__).resolve().parents[2] / "data" / "hosts"


def copy(name: str, tmp_path: Path) -> Path:
    dst = tmp_path / name
    shutil.copytree(HOSTS / name, dst, symlinks=True)
    return dst


def run(root: Path, **kw) -> Topology:
    kw.setdefault("allow", ("nvme*",))
    kw.setdefault("virt_type", "kvm")
    return discover_host(root, probe_versions=False, **kw)


def test_empty_root_gives_an_empty_host_with_warnings(tmp_path: Path) -> None:
    topo = run(tmp_path)
    assert topo.cpus == () and topo.nics == () and topo.disks == ()
    (node,) = topo.nodes  # one node 0 is reported even so, with what could be read (nothing)
    assert (node.id, node.cpus, node.memory_total_kb) == (0, (), 0)
    w = "\n".join(topo.host.warnings)
    assert "/sys/devices/system/cpu: no cpuN directories" in w
    assert "no NUMA node directories" in w
    assert "/proc/sys/kernel/osrelease: missing" in w
    assert topo.host.kernel == "unknown" and topo.host.kvm.present is False
    assert "not probed" in topo.host.kvm.detail
    assert Topology.from_json(topo.to_json()) == topo


def test_missing_root_directory(tmp_path: Path) -> None:
    topo = run(tmp_path / "nope")
    assert any("is not a directory" in w for w in topo.host.warnings)


def test_offline_cpu_keeps_its_node_from_the_cpu_link(tmp_path: Path) -> None:
    """An offline CPU loses its topology directory and leaves its node's cpulist;
    cpuN/nodeM still says where it lives."""
    root = copy("amd-epyc-nps4", tmp_path)
    cpu = root / "sys/devices/system/cpu"
    (cpu / "online").write_text("0-39,41-63\n")
    shutil.rmtree(cpu / "cpu40/topology")
    (cpu / "cpu40/node1").symlink_to("../../node/node1")
    (root / "sys/devices/system/node/node1/cpulist").write_text("8-15,41-47\n")
    topo = run(root)
    c40 = topo.cpu(40)
    assert (c40.online, c40.core, c40.socket, c40.node, c40.siblings) == (False, -1, -1, 1, (40,))
    assert topo.cpu(8).siblings == (8, 40)  # as the kernel still lists it for the online sibling
    assert 40 not in topo.node(1).cpus
    assert topo.host.warnings == ()  # offline CPUs are normal, not an error


def test_kernel_without_numa(tmp_path: Path) -> None:
    root = copy("1s-8c-nosmt-1pf-8vf", tmp_path)
    shutil.rmtree(root / "sys/devices/system/node")
    topo = run(root)
    (node,) = topo.nodes
    assert node.cpus == tuple(range(8))
    assert (node.memory_total_kb, node.memory_free_kb) == (32727236, 27981220)  # /proc/meminfo
    assert node.hugepages == (HugepagePool(2048, 512, 500, 2), HugepagePool(1048576, 0, 0, 0))
    assert all(c.node == 0 for c in topo.cpus)
    assert any("no NUMA node directories" in w for w in topo.host.warnings)


def test_garbage_in_attribute_files(tmp_path: Path) -> None:
    root = copy("2s-48c-smt-2pf-32vf", tmp_path)
    sysd = root / "sys/devices/system"
    (sysd / "cpu/cpu5/topology/core_id").write_text("five\n")
    (sysd / "cpu/cpu6/topology/thread_siblings_list").write_text("6-\n")
    (sysd / "node/node1/hugepages/hugepages-2048kB/free_hugepages").write_text("\n")
    (sysd / "node/node0/distance").write_text("10 x\n")
    (sysd / "node/node0/meminfo").write_text("nonsense\n")
    (root / "sys/block/sde/size").unlink()
    topo = run(root)
    assert topo.cpu(5).core == -1 and topo.cpu(6).siblings == (6,)
    assert topo.node(1).hugepages[0].free == 0
    assert topo.node(0).distances == () and topo.node(0).memory_total_kb == 0
    sde = next(d for d in topo.disks if d.name == "sde")
    assert (sde.size_bytes, sde.assignable) == (0, False) and "size 0" in sde.reasons
    w = "\n".join(topo.host.warnings)
    for expected in ("cpu5/topology/core_id: expected an integer, found 'five'",
                     "cpu6/topology/thread_siblings_list:",
                     "hugepages-2048kB/free_hugepages: expected an integer",
                     "node0/distance: not a list of integers",
                     "node0/meminfo: no MemTotal",
                     "/sys/block/sde/size: missing"):
        assert expected in w, expected


def test_cpu_without_vmx_and_kvm_not_probed(tmp_path: Path) -> None:
    root = copy("1s-8c-nosmt-1pf-8vf", tmp_path)
    info = root / "proc/cpuinfo"
    info.write_text(info.read_text().replace(" vmx", ""))
    topo = run(root)
    assert topo.host.kvm.full_guest_ok is False
    assert topo.host.warnings == ("virt_type=kvm but this CPU has no VMX/SVM: KVM cannot run a full Linux "
                                  "guest here; use virt_type=qemu",)
    (root / ".hostd-probe.json").unlink()
    info.write_text(info.read_text().replace(" est ", " vmx est "))
    topo = run(root)
    assert (topo.host.kvm.present, topo.host.kvm.usable, topo.host.kvm.full_guest_ok) == (False, False, True)
    assert topo.host.warnings[0].startswith("virt_type=kvm but /dev/kvm is not usable")
    assert run(root, virt_type="qemu").host.warnings == ("virt_type=qemu: guests run under TCG (slow)",)


def test_bad_virt_type_is_a_programming_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="virt_type"):
        run(tmp_path, virt_type="xen")


def test_root_on_overlay_marks_no_disk_and_says_why(tmp_path: Path) -> None:
    root = copy("2s-48c-smt-2pf-32vf", tmp_path)
    mi = root / "proc/self/mountinfo"
    lines = mi.read_text().splitlines()
    lines[0] = "20 1 0:99 / / rw,relatime shared:1 - overlay overlay rw,lowerdir=/l,upperdir=/u"
    mi.write_text("\n".join(lines) + "\n")
    topo = run(root, allow=("sda",))
    sda = next(d for d in topo.disks if d.name == "sda")
    assert sda.reasons == ("mounted at /boot (sda1)",)
    assert any(w.startswith("/ is on overlay (overlay, device 0:99)") for w in topo.host.warnings)


def test_btrfs_anonymous_device_matched_by_source(tmp_path: Path) -> None:
    """btrfs reports an anonymous device number (0:NN) in mountinfo: the source path decides."""
    root = copy("2s-48c-smt-2pf-32vf", tmp_path)
    mi = root / "proc/self/mountinfo"
    text = mi.read_text().replace("20 1 8:2 / / rw,relatime,errors=remount-ro shared:1 - ext4 /dev/sda2",
                                  "20 1 0:33 / / rw,relatime shared:1 - btrfs /dev/sda2")
    assert "btrfs" in text
    mi.write_text(text)
    sda = next(d for d in run(root).disks if d.name == "sda")
    assert "backs the root filesystem" in sda.reasons and "mounted at / (sda2)" in sda.reasons


def test_mounts_without_mountinfo_fall_back_to_proc_mounts(tmp_path: Path) -> None:
    root = copy("1s-8c-nosmt-1pf-8vf", tmp_path)
    (root / "proc/self/mountinfo").unlink()
    d0 = next(d for d in run(root).disks if d.name == "nvme0n1")
    assert "backs the root filesystem" in d0.reasons  # /dev/mapper/vg0-root -> dm-0 -> nvme0n1p2
    assert "mounted at /boot/efi (nvme0n1p1)" in d0.reasons


def test_cgroup_v2_without_cpuset(tmp_path: Path) -> None:
    root = copy("1s-8c-nosmt-1pf-8vf", tmp_path)
    (root / "sys/fs/cgroup/cgroup.controllers").write_text("cpu io memory pids\n")
    topo = run(root)
    assert any("no cpuset controller" in w for w in topo.host.warnings)


def test_vf_links_disagreeing_with_numvfs(tmp_path: Path) -> None:
    root = copy("1s-8c-nosmt-1pf-8vf", tmp_path)
    pf = root / "sys/devices/pci0000:00/0000:00:09.0/0000:01:00.0"
    (pf / "virtfn7").unlink()
    topo = run(root)
    assert len(topo.nics[0].vfs) == 7 and topo.nics[0].sriov_numvfs == 8
    assert "enp1s0f0np0: sriov_numvfs is 8 but 7 virtfn links exist" in topo.host.warnings


def test_swap_on_a_whole_disk(tmp_path: Path) -> None:
    root = copy("2s-48c-smt-2pf-32vf", tmp_path)
    swaps = root / "proc/swaps"
    swaps.write_text(swaps.read_text().replace("/dev/sdd1", "/dev/sde"))
    sde = next(d for d in run(root, allow=("sd*",)).disks if d.name == "sde")
    assert (sde.swap, sde.reasons) == (True, ("in use as swap (sde)",))


def test_swap_named_by_mapper_path_resolves_to_the_dm_device(tmp_path: Path) -> None:
    from hostd.discover.blockdevs import block_index, swap_devices
    from hostd.discover.fs import HostFs

    root = copy("1s-8c-nosmt-1pf-8vf", tmp_path)
    swaps = root / "proc/swaps"
    swaps.write_text(swaps.read_text().replace("/dev/dm-1", "/dev/mapper/vg0-swap") + "/swapfile file 1 0 -3\n")
    fs = HostFs(root)
    assert swap_devices(fs, block_index(fs)) == {"dm-1"}  # the swap file is ignored
