"""`hostd discover` against the recorded host trees (tests/data/hosts/), in-process.

These hosts are recorded data, not this machine: there is no multi-socket, SR-IOV
or 12-disk hardware here. The trees are written by tests/data/hosts/make_trees.py
with real kernel sysfs/procfs layouts; the expected values below are spelled out
by hand from the hosts' descriptions, not computed by the code under test.
"""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hostd.carve.plan import allow_matches as planner_allow_matches
from hostd.discover import discover_host
from hostd.discover.model import Disk, HugepagePool, HugetlbfsMount, Topology, Vf

HOSTS = Path(__file__).resolve().parents[2] / "data" / "hosts"
G1 = 1024 * 1024


def discover(name: str, allow: tuple[str, ...] = (), virt_type: str = "kvm") -> Topology:
    return discover_host(HOSTS / name, allow=allow, virt_type=virt_type, probe_versions=False)


def by_name(disks: tuple[Disk, ...]) -> dict[str, Disk]:
    return {d.name: d for d in disks}


# ---------------------------------------------------------------- 2 sockets x 12 cores x 2 threads


@pytest.fixture(scope="module")
def intel() -> Topology:
    return discover("2s-48c-smt-2pf-32vf", allow=("sd*", "nvme*"))


def test_intel_host_facts(intel: Topology) -> None:
    h = intel.host
    assert (h.hostname, h.kernel, h.arch) == ("oss-2s48-01", "6.1.0-18-amd64", "x86_64")
    assert (h.cpu_vendor, h.cpu_model) == ("GenuineIntel", "Intel(R) Xeon(R) Gold 6126 CPU @ 2.60GHz")
    assert h.hugepage_sizes_kb == (2048, G1)
    assert h.pdpe1gb is True
    assert h.hugetlbfs_mounts == (HugetlbfsMount("/dev/hugepages", 2048),
                                  HugetlbfsMount("/dev/hugepages1G", G1))
    assert h.isolated_cpus == () and h.nohz_full_cpus == ()  # nohz_full reads "(null)"
    assert h.cgroup_version == 2
    assert h.kvm.present and h.kvm.usable and h.kvm.api_version == 12 and h.kvm.full_guest_ok
    assert "VMX" in h.kvm.detail
    assert h.virt_type == "kvm"
    assert h.warnings == ()
    assert (h.libvirt_version, h.qemu_version) == ("9.0.0", "7.2.0")  # from .hostd-probe.json
    assert h.hugepages == (HugepagePool(2048, 2048, 2024, 0, 8), HugepagePool(G1, 16, 14, 0, 0))


def test_intel_cpus_number_siblings_like_intel(intel: Topology) -> None:
    core_ids = (0, 1, 2, 3, 4, 5, 8, 9, 10, 11, 12, 13)  # Skylake-SP leaves gaps
    assert [c.id for c in intel.cpus] == list(range(48))
    for c in intel.cpus:
        first = c.id % 24  # cpu N and N+24 are the two threads of one core
        assert c.siblings == (first, first + 24)
        assert c.socket == first // 12
        assert c.node == c.socket
        assert c.core == core_ids[first % 12]
        assert c.online and not c.isolated and not c.nohz_full


def test_intel_nodes(intel: Topology) -> None:
    n0, n1 = intel.nodes
    assert n0.id == 0 and n0.cpus == tuple(range(12)) + tuple(range(24, 36))
    assert n1.id == 1 and n1.cpus == tuple(range(12, 24)) + tuple(range(36, 48))
    assert (n0.memory_total_kb, n0.memory_free_kb) == (196294656, 150011904)
    assert (n1.memory_total_kb, n1.memory_free_kb) == (197132288, 180224512)
    assert n0.hugepages == (HugepagePool(2048, 1024, 1000, 0), HugepagePool(G1, 8, 8, 0))
    assert n1.hugepages == (HugepagePool(2048, 1024, 1024, 0), HugepagePool(G1, 8, 6, 0))
    assert all(p.reserved is None for n in intel.nodes for p in n.hugepages)
    assert (n0.distances, n1.distances) == ((10, 21), (21, 10))


def test_intel_nics_and_vfs(intel: Topology) -> None:
    eno1, pf0, pf1 = intel.nics  # VF netdevs (ens1f0v*) are not listed on their own
    assert (eno1.name, eno1.pci, eno1.driver, eno1.node, eno1.speed_mbps, eno1.mac) == \
        ("eno1", "0000:04:00.0", "tg3", 0, 1000, "d0:94:66:1a:2b:3c")
    assert (eno1.sriov_totalvfs, eno1.sriov_numvfs, eno1.vfs) == (0, 0, ())

    assert (pf0.name, pf0.pci, pf0.driver, pf0.node, pf0.speed_mbps, pf0.mac) == \
        ("ens1f0", "0000:3b:00.0", "i40e", 0, 40000, "3c:fd:fe:a1:b2:c0")
    assert (pf0.sriov_totalvfs, pf0.sriov_numvfs) == (64, 16)
    assert pf0.vfs[0] == Vf(0, "0000:3b:02.0", "iavf", "ens1f0v0", "ba:4c:1e:7a:00:00")
    assert pf0.vfs[9] == Vf(9, "0000:3b:03.1", "iavf", "ens1f0v9", "ba:4c:1e:7a:00:09")
    assert pf0.vfs[15] == Vf(15, "0000:3b:03.7", "iavf", "ens1f0v15", "ba:4c:1e:7a:00:0f")
    assert [v.index for v in pf0.vfs] == list(range(16))  # virtfn10 after virtfn9

    assert (pf1.name, pf1.pci, pf1.driver, pf1.node) == ("ens2f0", "0000:af:00.0", "i40e", 1)
    assert (pf1.sriov_totalvfs, pf1.sriov_numvfs, len(pf1.vfs)) == (64, 16, 16)
    assert pf1.vfs[7] == Vf(7, "0000:af:02.7", "vfio-pci", None, None)  # bound for passthrough
    assert pf1.vfs[8] == Vf(8, "0000:af:03.0", None, None, None)  # no driver at all


HDD = 15628053168 * 512


def test_intel_disks_every_field(intel: Topology) -> None:
    disks = by_name(intel.disks)
    assert list(disks) == ["nvme0n1", "nvme1n1", "nvme2n1", "nvme3n1",
                           "sda", "sdb", "sdc", "sdd", "sde", "sdf", "sdg", "sdh"]  # loop0 unattached
    assert disks["sda"] == Disk(
        "sda", "wwn-0x55cd2e414f1a2b3c", "0x55cd2e414f1a2b3c", "PHYF812345AB480BGN", "INTEL_SSDSC2KB480G8",
        937703088 * 512, False, False, False, 0, ("sda1", "sda2"), (), ("/", "/boot"), False, False,
        ("mounted at / (sda2)", "mounted at /boot (sda1)", "backs the root filesystem"))
    for i, name in enumerate(["sdb", "sdc", "sdd", "sde", "sdf", "sdg", "sdh"], start=1):
        d = disks[name]
        wwn = f"0x5000c500a1b2c30{i}"
        assert (d.id, d.wwn, d.serial, d.model) == (f"wwn-{wwn}", wwn, f"ZA1A000{i}", "ST8000NM0055-1RM112")
        assert (d.size_bytes, d.rotational, d.removable, d.node, d.backing_file) == (HDD, True, False, 0, None)
    assert (disks["sdb"].partitions, disks["sdb"].holders) == (("sdb1",), ("md0",))
    assert disks["sdb"].reasons == ("holder md0 (md raid1 member)",)  # the partition is the md member
    assert disks["sdc"].reasons == ("holder md0 (md raid1 member)",)
    assert (disks["sdd"].swap, disks["sdd"].reasons) == (True, ("in use as swap (sdd1)",))
    assert (disks["sdh"].readonly, disks["sdh"].reasons) == (True, ("read-only",))
    for name in ("sde", "sdf", "sdg"):
        assert (disks[name].assignable, disks[name].reasons, disks[name].partitions) == (True, (), ())
    for i in range(4):
        d = disks[f"nvme{i}n1"]
        wwid = f"eui.36344730521{i:05d}0025384500000001"
        assert d == Disk(f"nvme{i}n1", f"nvme-{wwid}", wwid, f"S438NA0N10000{i}",
                         "SAMSUNG_MZQLB3T8HALS-00007", 7501476528 * 512, False, False, False,
                         0 if i < 2 else 1, (), (), (), False, True, ())


def test_intel_allow_list_decides_the_rest() -> None:
    """Without an allow-list nothing is assignable; the reason says so, after the others."""
    topo = discover("2s-48c-smt-2pf-32vf")
    assert not any(d.assignable for d in topo.disks)
    disks = by_name(topo.disks)
    assert disks["sde"].reasons == ("not in the allow-list (no allow-list given)",)
    assert disks["sdb"].reasons == ("holder md0 (md raid1 member)", "not in the allow-list (no allow-list given)")
    topo = discover("2s-48c-smt-2pf-32vf", allow=("/dev/disk/by-id/wwn-0x5000c500a1b2c305", "nvme[01]n1",
                                                  "/dev/sdg"))
    assert sorted(d.name for d in topo.disks if d.assignable) == ["nvme0n1", "nvme1n1", "sdf", "sdg"]
    assert by_name(topo.disks)["sde"].reasons == ("not in the allow-list",)


@pytest.mark.parametrize("tree", ["2s-48c-smt-2pf-32vf", "amd-epyc-nps4", "1s-8c-nosmt-1pf-8vf"])
@pytest.mark.parametrize("pattern", ["sd?", "/dev/nvme*", "wwn-*", "nvme-eui.*", "/dev/disk/by-id/nvme-*",
                                     "loop0", "sdb1"])
def test_allow_list_agrees_with_the_planner(tree: str, pattern: str) -> None:
    """Discover and the carve planner read an allow-list entry the same way."""
    for d in discover(tree, allow=(pattern,)).disks:
        allowed = not any(r.startswith("not in the allow-list") for r in d.reasons)
        assert allowed == planner_allow_matches(pattern, d), (d.name, pattern)


# ---------------------------------------------------------------- AMD EPYC, NPS4


@pytest.fixture(scope="module")
def epyc() -> Topology:
    return discover("amd-epyc-nps4", allow=("nvme*", "loop*", "sda", "zram0"))


def test_epyc_host_facts(epyc: Topology) -> None:
    h = epyc.host
    assert (h.cpu_vendor, h.cpu_model) == ("AuthenticAMD", "AMD EPYC 7502P 32-Core Processor")
    assert h.isolated_cpus == h.nohz_full_cpus == tuple(range(8, 16)) + tuple(range(40, 48))
    assert h.cgroup_version == 1  # cpuset is on a v1 hierarchy
    assert h.kvm.usable and h.kvm.full_guest_ok and "SVM" in h.kvm.detail
    assert (h.libvirt_version, h.qemu_version) == (None, None)  # the probe file records none
    # /dev/hugepages has no pagesize= option: the default size (meminfo Hugepagesize) applies
    assert h.hugetlbfs_mounts == (HugetlbfsMount("/dev/hugepages", 2048), HugetlbfsMount("/dev/hugepages1G", G1))
    assert h.hugepages == (HugepagePool(2048, 0, 0, 0, 0), HugepagePool(G1, 64, 60, 0, 2))


def test_epyc_nps4_nodes_and_amd_siblings(epyc: Topology) -> None:
    assert len(epyc.cpus) == 64 and {c.socket for c in epyc.cpus} == {0}
    for c in epyc.cpus:
        first = c.id % 32
        assert c.siblings == (first, first + 32)
        assert c.node == first // 8  # NPS4: each quadrant of 8 cores is a node
        assert c.core == 4 * (first // 2) + first % 2
        assert c.isolated == c.nohz_full == (8 <= first < 16)
    assert [n.id for n in epyc.nodes] == [0, 1, 2, 3]
    for n in epyc.nodes:
        assert n.cpus == tuple(range(8 * n.id, 8 * n.id + 8)) + tuple(range(32 + 8 * n.id, 40 + 8 * n.id))
        assert n.memory_total_kb == 65843212 and n.memory_free_kb == 41234560 - n.id * 1024
        assert n.hugepages == (HugepagePool(2048, 0, 0, 0), HugepagePool(G1, 16, 12 if n.id == 1 else 16, 0))
    assert [n.distances for n in epyc.nodes] == [(10, 11, 12, 12), (11, 10, 12, 12),
                                                 (12, 12, 10, 11), (12, 12, 11, 10)]


def test_epyc_nic_without_numa_affinity_or_link(epyc: Topology) -> None:
    (nic,) = epyc.nics
    assert (nic.name, nic.pci, nic.driver) == ("enp97s0f0", "0000:61:00.0", "i40e")
    assert nic.node is None  # numa_node -1: no affinity reported
    assert nic.speed_mbps is None  # speed -1: link down
    assert (nic.sriov_totalvfs, nic.sriov_numvfs, nic.vfs) == (64, 0, ())


def test_epyc_disks_without_udev_use_sysfs_ids(epyc: Topology) -> None:
    """No udev on this host: ids come from sysfs wwid (NVMe) and device/wwid (SCSI)."""
    disks = by_name(epyc.disks)
    assert list(disks) == ["loop0", "nvme0n1", "nvme1n1", "nvme2n1", "nvme3n1", "sda", "zram0"]  # no loop1
    assert disks["sda"] == Disk(
        "sda", "wwn-0x5002538e40a1b2c3", "0x5002538e40a1b2c3", None, "SAMSUNG MZ7LH480", 937703088 * 512,
        False, False, False, 0, ("sda1", "sda2", "sda3"), (), ("/", "/boot/efi"), True, False,
        ("mounted at / (sda2)", "mounted at /boot/efi (sda1)", "backs the root filesystem",
         "in use as swap (sda3)"))
    for i in range(4):
        wwid = f"eui.00000000000000{i:02d}00a07501234567{i:02d}"
        d = disks[f"nvme{i}n1"]
        assert (d.id, d.wwn, d.serial, d.model, d.node) == (
            f"nvme-{wwid}", wwid, f"MSA2301{i:05d}", "Micron_7300_MTFDHBE3T8TDF", i)
        assert d.size_bytes == 7501476528 * 512
    assert disks["nvme3n1"].reasons == ("mounted at /var/lib/oss (nvme3n1)",)
    assert disks["nvme3n1"].mountpoints == ("/var/lib/oss",)
    assert [d.name for d in epyc.disks if d.assignable] == ["loop0", "nvme0n1", "nvme1n1", "nvme2n1"]
    assert disks["loop0"] == Disk("loop0", None, None, None, None, 1 << 30, False, False, False, None,
                                  (), (), (), False, True, (), "/var/lib/hyb/scratch.img")
    assert disks["zram0"].reasons == ("zram (compressed RAM, not a disk)", "size 0")


# ---------------------------------------------------------------- 1 socket, 8 cores, mlx5, LVM


@pytest.fixture(scope="module")
def atom() -> Topology:
    return discover("1s-8c-nosmt-1pf-8vf", allow=("nvme*",))


def test_atom_cpus_without_smt(atom: Topology) -> None:
    assert [(c.id, c.core, c.socket, c.node, c.siblings) for c in atom.cpus] == \
        [(i, i, 0, 0, (i,)) for i in range(8)]
    (node,) = atom.nodes
    assert node.cpus == tuple(range(8)) and node.distances == (10,)
    assert node.hugepages == (HugepagePool(2048, 512, 500, 2), HugepagePool(G1, 0, 0, 0))
    assert atom.host.hugepages[0] == HugepagePool(2048, 512, 500, 2, 4)
    assert atom.host.hugetlbfs_mounts == ()
    assert atom.host.nohz_full_cpus == ()  # no nohz_full file at all on this kernel


def test_atom_mlx5_pf(atom: Topology) -> None:
    (pf,) = atom.nics
    assert (pf.name, pf.pci, pf.driver, pf.node, pf.speed_mbps) == \
        ("enp1s0f0np0", "0000:01:00.0", "mlx5_core", None, 25000)
    assert (pf.sriov_totalvfs, pf.sriov_numvfs) == (8, 8)
    assert [v.pci for v in pf.vfs] == ["0000:01:00.2", "0000:01:00.3", "0000:01:00.4", "0000:01:00.5",
                                       "0000:01:00.6", "0000:01:00.7", "0000:01:01.0", "0000:01:01.1"]
    assert pf.vfs[7] == Vf(7, "0000:01:01.1", "mlx5_core", "enp1s0f0v7", "1e:2b:3c:4d:5e:07")


def test_atom_lvm_root_and_holders(atom: Topology) -> None:
    """/ is on dm-0 (LVM) on nvme0n1p2: the walk down the slaves finds nvme0n1."""
    disks = by_name(atom.disks)
    assert list(disks) == ["nvme0n1", "nvme1n1", "nvme2n1", "nvme3n1"]
    d0 = disks["nvme0n1"]
    assert d0.partitions == ("nvme0n1p1", "nvme0n1p2")
    assert d0.holders == ("dm-0", "dm-1")
    assert d0.mountpoints == ("/boot/efi",)
    assert d0.swap is False  # swap is on dm-1, reported through the holder
    assert d0.reasons == ("mounted at /boot/efi (nvme0n1p1)", "backs the root filesystem",
                          "holder dm-0 (device-mapper/LVM vg0-root)", "holder dm-1 (device-mapper/LVM vg0-swap)")
    assert disks["nvme2n1"].reasons == ("holder dm-2 (device-mapper/LVM vg1-data)",)
    assert [d.name for d in atom.disks if d.assignable] == ["nvme1n1", "nvme3n1"]
    assert all(d.node is None and d.size_bytes == 1953525168 * 512 for d in atom.disks)


def test_atom_udev_data_files_then_sysfs(atom: Topology) -> None:
    """nvme0-2 have /run/udev/data files (udev's ID_MODEL has underscores); nvme3n1
    has none, so its model and serial come from sysfs (spaces, padded serial stripped)."""
    disks = by_name(atom.disks)
    model = "INTEL SSDPE2KX010T8"
    for i in range(4):
        d = disks[f"nvme{i}n1"]
        serial = f"PHLJ9123004{i}1P0FGN"
        wwid = f"nvme.8086-{serial.encode().hex()}-{model.encode().hex()}-00000001"
        assert (d.id, d.wwn, d.serial) == (f"nvme-{wwid}", wwid, serial)
        assert d.model == (model.replace(" ", "_") if i < 3 else model)


# ---------------------------------------------------------------- the trees themselves


def test_regenerating_the_trees_gives_identical_trees(tmp_path: Path) -> None:
    """make_trees.py is the source of the trees: its output must match what is committed."""
    subprocess.run([sys.executable, str(HOSTS / "make_trees.py"), "--out", str(tmp_path)],
                   check=True, capture_output=True)
    for tree in ("2s-48c-smt-2pf-32vf", "amd-epyc-nps4", "1s-8c-nosmt-1pf-8vf"):
        want, got = _listing(HOSTS / tree), _listing(tmp_path / tree)
        assert sorted(got) == sorted(want), f"{tree}: file lists differ"
        for rel, kind in want.items():
            a, b = HOSTS / tree / rel, tmp_path / tree / rel
            if kind == "link":
                assert os.readlink(a) == os.readlink(b), rel
            else:
                assert filecmp.cmp(a, b, shallow=False), f"{tree}/{rel} differs"


def _listing(root: Path) -> dict[str, str]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = Path(dirpath) / n
            if p.is_symlink():
                out[str(p.relative_to(root))] = "link"
            elif p.is_file():
                out[str(p.relative_to(root))] = "file"
    return out
