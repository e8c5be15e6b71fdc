#!/usr/bin/env python3
"""Write the recorded host trees under tests/data/hosts/<name>/ from the compact
descriptions below (the writer is treegen.py).

Each tree holds only the files `hostd discover` reads, with the names, formats and
symlinks of a real Linux 6.1 kernel (Debian 12): /sys/devices/system/{cpu,node},
/sys/kernel/mm/hugepages, PCI functions with ``sriov_*`` and ``virtfnN``/``physfn``
links, /sys/class/net and /sys/block as relative symlinks into /sys/devices,
holders/slaves links between disks and md/dm devices, /proc/{cpuinfo,meminfo,
mounts,self/mountinfo,swaps}, and where the host runs udev, /dev/disk/by-id links
and /run/udev/data/b<maj>:<min> files. ``.hostd-probe.json`` stands in for the
probes that need the real machine (KVM_GET_API_VERSION, virsh/qemu versions).

    python tests/data/hosts/make_trees.py            # rewrite every tree in place
    python tests/data/hosts/make_trees.py --out DIR  # write them under DIR instead

The trees are committed; tests/hostd/discover/test_trees.py checks that running
this script gives identical trees. Change a tree here, never by hand.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.dont_write_bytecode = True  # keep __pycache__ out of the data directory

from treegen import (  # noqa: E402
    CpuDesc,
    DiskDesc,
    HostDesc,
    MountDesc,
    NicDesc,
    NodeDesc,
    PartDesc,
    StackDesc,
    VfDesc,
    write_host,
)

G1 = 1024 * 1024
M2 = 2048
PROBE_FULL = {"kvm": {"present": True, "api_version": 12},
              "libvirt_version": "9.0.0", "qemu_version": "7.2.0"}

INTEL_FLAGS = ("fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush dts "
               "acpi mmx fxsr sse sse2 ss ht tm pbe syscall nx pdpe1gb rdtscp lm constant_tsc "
               "arch_perfmon pebs bts rep_good nopl xtopology nonstop_tsc cpuid aperfmperf pni "
               "pclmulqdq dtes64 monitor ds_cpl vmx smx est tm2 ssse3 sdbg fma cx16 xtpr pdcm pcid "
               "dca sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer aes xsave avx f16c rdrand "
               "lahf_lm abm 3dnowprefetch cpuid_fault epb cat_l3 cdp_l3 invpcid_single pti intel_ppin "
               "ssbd mba ibrs ibpb stibp tpr_shadow vnmi flexpriority ept vpid ept_ad fsgsbase "
               "tsc_adjust bmi1 hle avx2 smep bmi2 erms invpcid rtm cqm mpx rdt_a avx512f avx512dq "
               "rdseed adx smap clflushopt clwb intel_pt avx512cd avx512bw avx512vl xsaveopt xsavec "
               "xgetbv1 xsaves cqm_llc cqm_occup_llc cqm_mbm_total cqm_mbm_local dtherm ida arat pln "
               "pts pku ospke md_clear flush_l1d arch_capabilities")
AMD_FLAGS = ("fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr "
             "sse sse2 ht syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl "
             "nonstop_tsc cpuid extd_apicid aperfmperf rapl pni pclmulqdq monitor ssse3 fma cx16 sse4_1 "
             "sse4_2 movbe popcnt aes xsave avx f16c rdrand lahf_lm cmp_legacy svm extapic cr8_legacy "
             "abm sse4a misalignsse 3dnowprefetch osvw ibs skinit wdt tce topoext perfctr_core "
             "perfctr_nb bpext perfctr_llc mwaitx cpb cat_l3 cdp_l3 hw_pstate ssbd mba ibrs ibpb stibp "
             "vmmcall fsgsbase bmi1 avx2 smep bmi2 cqm rdt_a rdseed adx smap clflushopt clwb sha_ni "
             "xsaveopt xsavec xgetbv1 xsaves cqm_llc cqm_occup_llc cqm_mbm_total cqm_mbm_local clzero "
             "irperf xsaveerptr rdpru wbnoinvd amd_ppin arat npt lbrv svm_lock nrip_save tsc_scale "
             "vmcb_clean flushbyasid decodeassists pausefilter pfthreshold avic v_vmsave_vmload vgif "
             "v_spec_ctrl umip rdpid overflow_recov succor smca sme sev sev_es")
ATOM_FLAGS = ("fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush dts acpi "
              "mmx fxsr sse sse2 ss ht tm pbe syscall nx pdpe1gb rdtscp lm constant_tsc art "
              "arch_perfmon pebs bts rep_good nopl xtopology nonstop_tsc cpuid aperfmperf tsc_known_freq "
              "pni pclmulqdq dtes64 monitor ds_cpl vmx est tm2 ssse3 sdbg cx16 xtpr pdcm sse4_1 sse4_2 "
              "x2apic movbe popcnt tsc_deadline_timer aes xsave rdrand lahf_lm 3dnowprefetch cpuid_fault "
              "epb cat_l2 pti ssbd ibrs ibpb stibp tpr_shadow vnmi flexpriority ept vpid ept_ad "
              "fsgsbase tsc_adjust smep erms mpx rdt_a rdseed smap clflushopt intel_pt sha_ni xsaveopt "
              "xsavec xgetbv1 xsaves dtherm ida arat pln pts md_clear arch_capabilities")


def _lvm_uuid(n: int) -> str:
    return "LVM-" + f"Vg{n}Xq3hTQ2sNd9aB7cKfLmP0rStUvWxYz".ljust(32, "0")[:32] + f"Lv{n}".ljust(32, "9")


# ---------------------------------------------------------------- 2 sockets, 48 CPUs, 2 PFs, 12 disks

def _intel_2s() -> HostDesc:
    ahci = "pci0000:00/0000:00:17.0"
    hba = "pci0000:17/0000:17:00.0/0000:18:00.0"
    hdd_model = "ST8000NM0055-1RM112"
    disks = [DiskDesc(
        "sda", "8:0", 937703088, f"{ahci}/ata1/host0/target0:0:0/0:0:0:0", model="INTEL SSDSC2KB48",
        wwid="naa.55cd2e414f1a2b3c", numa_node=0, pci=ahci,
        parts=(PartDesc("sda1", "8:1", 2097152), PartDesc("sda2", "8:2", 935603887)),
        by_id=("ata-INTEL_SSDSC2KB480G8_PHYF812345AB480BGN", "wwn-0x55cd2e414f1a2b3c"),
        udev={"DEVTYPE": "disk", "ID_BUS": "ata", "ID_MODEL": "INTEL_SSDSC2KB480G8",
              "ID_SERIAL": "INTEL_SSDSC2KB480G8_PHYF812345AB480BGN",
              "ID_SERIAL_SHORT": "PHYF812345AB480BGN", "ID_WWN": "0x55cd2e414f1a2b3c",
              "ID_WWN_WITH_EXTENSION": "0x55cd2e414f1a2b3c"})]
    for i, letter in enumerate("bcdefgh"):
        name, minor = f"sd{letter}", 16 * (i + 1)
        serial, wwn = f"ZA1A000{i + 1}", f"0x5000c500a1b2c30{i + 1}"
        parts: tuple[PartDesc, ...] = ()
        if letter in "bc":
            parts = (PartDesc(f"{name}1", f"8:{minor + 1}", 15628050432, holders=("md0",)),)
        elif letter == "d":
            parts = (PartDesc(f"{name}1", f"8:{minor + 1}", 134217728),)
        disks.append(DiskDesc(
            name, f"8:{minor}", 15628053168, f"{hba}/host1/port-1:{i}/end_device-1:{i}/target1:0:{i}/1:0:{i}:0",
            rotational=1, ro=1 if letter == "h" else 0, model=hdd_model[:16], wwid=f"naa.{wwn[2:]}",
            numa_node=0, pci=hba, parts=parts,
            by_id=(f"scsi-3{wwn[2:]}", f"scsi-SATA_{hdd_model[:16]}_{serial}", f"wwn-{wwn}"),
            udev={"DEVTYPE": "disk", "ID_BUS": "ata", "ID_MODEL": hdd_model,
                  "ID_SERIAL": f"{hdd_model}_{serial}", "ID_SERIAL_SHORT": serial, "ID_WWN": wwn,
                  "ID_WWN_WITH_EXTENSION": wwn}))
    nvme_pci = ["pci0000:5d/0000:5d:00.0/0000:5e:00.0", "pci0000:5d/0000:5d:02.0/0000:5f:00.0",
                "pci0000:d7/0000:d7:00.0/0000:d8:00.0", "pci0000:d7/0000:d7:02.0/0000:d9:00.0"]
    model = "SAMSUNG MZQLB3T8HALS-00007"
    for i, pci in enumerate(nvme_pci):
        serial, wwid = f"S438NA0N10000{i}", f"eui.36344730521{i:05d}0025384500000001"
        disks.append(DiskDesc(
            f"nvme{i}n1", f"259:{i}", 7501476528, f"{pci}/nvme/nvme{i}", model=model, wwid=wwid,
            serial=serial, numa_node=0 if i < 2 else 1, pci=pci,
            by_id=(f"nvme-{wwid}", f"nvme-{model.replace(' ', '_')}_{serial}"),
            udev={"DEVTYPE": "disk", "ID_MODEL": model.replace(" ", "_"),
                  "ID_SERIAL": f"{model.replace(' ', '_')}_{serial}",
                  "ID_SERIAL_SHORT": serial, "ID_WWN": wwid}))
    disks.append(DiskDesc("loop0", "7:0", 0, "", virtual=True))  # not attached: not reported
    vf0 = tuple(VfDesc(f"0000:3b:{2 + i // 8:02x}.{i % 8}", "iavf", f"ens1f0v{i}", f"ba:4c:1e:7a:00:{i:02x}")
                for i in range(16))
    vf1 = tuple(VfDesc(f"0000:af:{2 + i // 8:02x}.{i % 8}", "vfio-pci" if i < 8 else None)
                for i in range(16))
    return HostDesc(
        name="2s-48c-smt-2pf-32vf", hostname="oss-2s48-01", kernel="6.1.0-18-amd64",
        cpu=CpuDesc("GenuineIntel", "Intel(R) Xeon(R) Gold 6126 CPU @ 2.60GHz", 6, 85, INTEL_FLAGS,
                    sockets=2, cores=(0, 1, 2, 3, 4, 5, 8, 9, 10, 11, 12, 13), threads=2),
        nodes=(NodeDesc(196294656, 150011904, {M2: (1024, 1000, 0), G1: (8, 8, 0)}, (10, 21)),
               NodeDesc(197132288, 180224512, {M2: (1024, 1024, 0), G1: (8, 6, 0)}, (21, 10))),
        sizes=(M2, G1), resv={M2: 8, G1: 0}, hugepagesize_kb=M2, nohz_full="(null)",
        nics=(NicDesc("eno1", "pci0000:00/0000:00:1c.5/0000:04:00.0", "tg3", 0, 1000, "d0:94:66:1a:2b:3c"),
              NicDesc("ens1f0", "pci0000:3a/0000:3a:00.0/0000:3b:00.0", "i40e", 0, 40000,
                      "3c:fd:fe:a1:b2:c0", totalvfs=64, vfs=vf0),
              NicDesc("ens2f0", "pci0000:ae/0000:ae:00.0/0000:af:00.0", "i40e", 1, 40000,
                      "3c:fd:fe:a1:c3:d0", totalvfs=64, vfs=vf1)),
        disks=tuple(disks),
        stacks=(StackDesc("md0", "9:0", 15628050432, ("sdb1", "sdc1"), md_level="raid1"),),
        mounts=(MountDesc("8:2", "/", "ext4", "/dev/sda2", "rw,relatime,errors=remount-ro"),
                MountDesc("8:1", "/boot", "ext4", "/dev/sda1"),
                MountDesc("9:0", "/srv/oss-meta", "xfs", "/dev/md0", "rw,noatime"),
                MountDesc("0:45", "/dev/hugepages", "hugetlbfs", "hugetlbfs", "rw,relatime,pagesize=2M"),
                MountDesc("0:46", "/dev/hugepages1G", "hugetlbfs", "hugetlbfs", "rw,relatime,pagesize=1024M")),
        swaps=("/dev/sdd1",), udev=True, by_id_dir=True, probe=PROBE_FULL)


# ---------------------------------------------------------------- AMD EPYC, NPS4

def _epyc_nps4() -> HostDesc:
    sata = "pci0000:00/0000:00:08.1/0000:03:00.2"
    disks = [DiskDesc(
        "sda", "8:0", 937703088, f"{sata}/ata1/host0/target0:0:0/0:0:0:0", model="SAMSUNG MZ7LH480",
        wwid="naa.5002538e40a1b2c3", numa_node=0, pci=sata,
        parts=(PartDesc("sda1", "8:1", 1048576), PartDesc("sda2", "8:2", 869545984),
               PartDesc("sda3", "8:3", 67106816)))]
    model = "Micron_7300_MTFDHBE3T8TDF"
    for i, root in enumerate(("00", "40", "80", "c0")):
        bus = f"{int(root, 16) + 1:02x}"
        pci = f"pci0000:{root}/0000:{root}:03.1/0000:{bus}:00.0"
        disks.append(DiskDesc(
            f"nvme{i}n1", f"259:{i}", 7501476528, f"{pci}/nvme/nvme{i}", model=model,
            wwid=f"eui.00000000000000{i:02d}00a07501234567{i:02d}", serial=f"MSA2301{i:05d}",
            numa_node=i, pci=pci))
    disks += [DiskDesc("loop0", "7:0", 2097152, "", virtual=True, backing_file="/var/lib/hyb/scratch.img"),
              DiskDesc("loop1", "7:1", 0, "", virtual=True),
              DiskDesc("zram0", "252:0", 0, "", virtual=True)]
    dist = ((10, 11, 12, 12), (11, 10, 12, 12), (12, 12, 10, 11), (12, 12, 11, 10))
    free_1g = (16, 12, 16, 16)
    return HostDesc(
        name="amd-epyc-nps4", hostname="oss-epyc-07", kernel="6.1.0-18-amd64",
        cpu=CpuDesc("AuthenticAMD", "AMD EPYC 7502P 32-Core Processor", 23, 49, AMD_FLAGS, sockets=1,
                    # APIC-derived core ids: 2 of 4 slots per CCX enabled on the 7502P
                    cores=tuple(4 * (i // 2) + i % 2 for i in range(32)), threads=2, nodes_per_socket=4),
        nodes=tuple(NodeDesc(65843212, 41234560 - n * 1024, {G1: (16, free_1g[n], 0)}, dist[n])
                    for n in range(4)),
        sizes=(M2, G1), resv={G1: 2}, hugepagesize_kb=M2, isolated="8-15,40-47", nohz_full="8-15,40-47",
        cgroup="v1",
        nics=(NicDesc("enp97s0f0", "pci0000:60/0000:60:03.1/0000:61:00.0", "i40e", -1, -1,
                      "3c:fd:fe:b0:0e:10", totalvfs=64),),
        disks=tuple(disks),
        mounts=(MountDesc("8:2", "/", "ext4", "/dev/sda2"),
                MountDesc("8:1", "/boot/efi", "vfat", "/dev/sda1", "rw,relatime,fmask=0077,dmask=0077"),
                MountDesc("259:3", "/var/lib/oss", "xfs", "/dev/nvme3n1", "rw,noatime"),
                MountDesc("0:45", "/dev/hugepages", "hugetlbfs", "hugetlbfs", "rw,relatime"),
                MountDesc("0:46", "/dev/hugepages1G", "hugetlbfs", "hugetlbfs", "rw,relatime,pagesize=1G")),
        swaps=("/dev/sda3",), probe={"kvm": {"present": True, "api_version": 12}})


# ---------------------------------------------------------------- 1 socket, 8 cores, mlx5 PF, LVM

def _atom_1s() -> HostDesc:
    model = "INTEL SSDPE2KX010T8"
    pcis = ["pci0000:00/0000:00:0a.0/0000:02:00.0", "pci0000:00/0000:00:0b.0/0000:03:00.0",
            "pci0000:00/0000:00:0c.0/0000:04:00.0", "pci0000:00/0000:00:0e.0/0000:05:00.0"]
    disks = []
    minor = 0
    for i, pci in enumerate(pcis):
        serial = f"PHLJ9123004{i}1P0FGN"
        wwid = f"nvme.8086-{serial.encode().hex()}-{model.encode().hex()}-00000001"
        parts: tuple[PartDesc, ...] = ()
        devnum = f"259:{minor}"
        if i == 0:
            parts = (PartDesc("nvme0n1p1", "259:1", 1050624),
                     PartDesc("nvme0n1p2", "259:2", 1952472064, holders=("dm-0", "dm-1")))
        minor += 1 + len(parts)
        sid = f"{model.replace(' ', '_')}_{serial}"
        disks.append(DiskDesc(
            f"nvme{i}n1", devnum, 1953525168, f"{pci}/nvme/nvme{i}", model=model, wwid=wwid, serial=serial,
            numa_node=-1, pci=pci, parts=parts, holders=("dm-2",) if i == 2 else (),
            by_id=(f"nvme-{wwid}", f"nvme-{sid}") if i < 3 else (),
            # nvme3n1 was hot-added after udevd's database was copied: no udev data
            udev={"DEVTYPE": "disk", "ID_MODEL": model.replace(" ", "_"), "ID_SERIAL": sid, "ID_SERIAL_SHORT": serial,
                  "ID_WWN": wwid} if i < 3 else {}))
    vfs = tuple(VfDesc(f"0000:01:{(2 + i) // 8:02x}.{(2 + i) % 8}", "mlx5_core", f"enp1s0f0v{i}",
                       f"1e:2b:3c:4d:5e:{i:02x}") for i in range(8))
    return HostDesc(
        name="1s-8c-nosmt-1pf-8vf", hostname="edge-s01", kernel="6.1.0-18-amd64",
        cpu=CpuDesc("GenuineIntel", "Intel(R) Atom(TM) CPU C3758 @ 2.20GHz", 6, 95, ATOM_FLAGS,
                    sockets=1, cores=tuple(range(8)), threads=1),
        nodes=(NodeDesc(32727236, 27981220, {M2: (512, 500, 2)}, (10,)),),
        sizes=(M2, G1), resv={M2: 4}, hugepagesize_kb=M2,
        nics=(NicDesc("enp1s0f0np0", "pci0000:00/0000:00:09.0/0000:01:00.0", "mlx5_core", -1, 25000,
                      "b8:ce:f6:12:34:56", totalvfs=8, vfs=vfs),),
        disks=tuple(disks),
        stacks=(StackDesc("dm-0", "253:0", 104857600, ("nvme0n1p2",), dm_name="vg0-root", dm_uuid=_lvm_uuid(0)),
                StackDesc("dm-1", "253:1", 16777216, ("nvme0n1p2",), dm_name="vg0-swap", dm_uuid=_lvm_uuid(1)),
                StackDesc("dm-2", "253:2", 1953517568, ("nvme2n1",), dm_name="vg1-data", dm_uuid=_lvm_uuid(2))),
        mounts=(MountDesc("253:0", "/", "ext4", "/dev/mapper/vg0-root"),
                MountDesc("259:1", "/boot/efi", "vfat", "/dev/nvme0n1p1"),
                MountDesc("253:2", "/var/lib/oss", "xfs", "/dev/mapper/vg1-data", "rw,noatime")),
        swaps=("/dev/dm-1",), udev=True, probe=PROBE_FULL)


# ---------------------------------------------------------------- atomic-write disks (issue #41)
#
# Two small hosts for the atomic-write unit (hostd/discover/atomic.py). The numbers
# are constructed, not captured from a device: the sysfs files and values follow
# Linux 6.12's block queue limits (block/blk-sysfs.c, the NVMe driver's
# nvme_update_atomic_write_disk_info), and the `nvme id-ns|id-ctrl -o json` records
# use nvme-cli 2.x's field names and number formats (0's based AWUPF/NAWUPF/NABSPF in
# logical blocks, NSFEAT bit 1 for the namespace fields, lbafs[].ds as log2 bytes),
# set to the values the NVMe Base Specification 2.0 defines for such a device.

def _nvme_ctrl_json(sn: str, mn: str, awupf: int, awun: int = 0) -> dict:
    """An `nvme id-ctrl -o json` record (nvme-cli 2.x field names, a subset of them)."""
    return {"vid": 5197, "ssvid": 5197, "sn": sn.ljust(20), "mn": mn.ljust(40), "fr": "GDC7302Q",
            "rab": 2, "ieee": 9528, "cmic": 0, "mdts": 9, "cntlid": 65, "ver": 131072, "rtd3r": 8000000,
            "rtd3e": 8000000, "oaes": 768, "ctratt": 128, "oacs": 95, "acl": 7, "aerl": 3, "frmw": 23,
            "lpa": 14, "elpe": 63, "npss": 0, "avscc": 1, "apsta": 0, "wctemp": 353, "cctemp": 356,
            "sqes": 102, "cqes": 68, "maxcmd": 0, "nn": 32, "oncs": 95, "fuses": 0, "fna": 4, "vwc": 6,
            "awun": awun, "awupf": awupf, "icsvscc": 1, "nwpc": 0, "acwu": 0, "ocfs": 0, "sgls": 0,
            "mnan": 0, "subnqn": f"nqn.1994-11.com.samsung:nvme:{mn.split()[0]}:U.2:{sn}"}


def _nvme_ns_json(nsze: int, lba_ds: int, nsfeat: int = 0, nawupf: int = 0, nawun: int = 0,
                  nabspf: int = 0, nabsn: int = 0, nabo: int = 0) -> dict:
    """An `nvme id-ns -o json` record: LBA format 0 is 512 B, format 1 is 4 KiB; ``flbas``
    selects the one whose ``ds`` is ``lba_ds``."""
    lbafs = [{"ms": 0, "ds": 9, "rp": 2}, {"ms": 0, "ds": 12, "rp": 0}]
    flbas = next(i for i, f in enumerate(lbafs) if f["ds"] == lba_ds)
    return {"nsze": nsze, "ncap": nsze, "nuse": nsze // 3, "nsfeat": nsfeat, "nlbaf": len(lbafs) - 1,
            "flbas": flbas, "mc": 0, "dpc": 0, "dps": 0, "nmic": 0, "rescap": 0, "fpi": 0, "dlfeat": 9,
            "nawun": nawun, "nawupf": nawupf, "nacwu": 0, "nabsn": nabsn, "nabo": nabo,
            "nabspf": nabspf, "noiob": 0, "nvmcap": nsze << lba_ds, "mssrl": 0, "mcl": 0, "msrc": 0,
            "nulbaf": 0, "anagrpid": 0, "nsattr": 0, "nvmsetid": 0, "endgid": 0,
            "nguid": "36344730530000010025384500000001", "eui64": "0025384500000001", "lbafs": lbafs}


def _small_host(name: str, kernel: str, disks: list[DiskDesc], **kw) -> HostDesc:
    return HostDesc(
        name=name, hostname=name.replace(".", "-"), kernel=kernel,
        cpu=CpuDesc("GenuineIntel", "Intel(R) Xeon(R) Silver 4310 CPU @ 2.10GHz", 6, 106, INTEL_FLAGS,
                    sockets=1, cores=(0, 1, 2, 3), threads=2),
        nodes=(NodeDesc(65536000, 60000000, {M2: (2048, 2048, 0)}, (10,)),),
        sizes=(M2, G1), resv={}, hugepagesize_kb=M2, disks=tuple(disks),
        mounts=(MountDesc("8:2", "/", "ext4", "/dev/sda2"),),
        probe=PROBE_FULL | kw.pop("probe", {}), **kw)


def _sata_root(atomic: tuple[int, int, int, int] | None) -> DiskDesc:
    ahci = "pci0000:00/0000:00:17.0"
    return DiskDesc("sda", "8:0", 937703088, f"{ahci}/ata1/host0/target0:0:0/0:0:0:0", model="INTEL SSDSC2KB48",
                    wwid="naa.55cd2e414f1a2b4d", numa_node=0, pci=ahci, atomic=atomic,
                    parts=(PartDesc("sda1", "8:1", 2097152), PartDesc("sda2", "8:2", 935603887)))


def _nvme(i: int, atomic: tuple[int, int, int, int] | None, sectors: int = 7501476528) -> DiskDesc:
    pci = f"pci0000:00/0000:00:{0x1a + i:02x}.0/0000:{0x31 + i:02x}:00.0"
    return DiskDesc(f"nvme{i}n1", f"259:{i}", sectors, f"{pci}/nvme/nvme{i}", model="SAMSUNG MZQL23T8HCLS-00A07",
                    wwid=f"eui.36344730530000{i:02d}0025384500000001", serial=f"S64HNE0T10000{i}", numa_node=0,
                    pci=pci, atomic=atomic)


def _atomic_612() -> HostDesc:
    """Linux 6.12: the kernel's queue limits. nvme0n1 writes 16 KiB whole (NAWUPF 3 on
    4 KiB blocks), nvme1n1 reports none (6.12 leaves the limits 0 for AWUPF 0), the SATA
    root disk none. statx on /dev/nvme0n1 agrees with sysfs."""
    return _small_host(
        "1s-4c-nvme-atomic-6.12", "6.12.12+bpo-amd64",
        [_sata_root((0, 0, 0, 0)), _nvme(0, (4096, 16384, 0, 16384)), _nvme(1, (0, 0, 0, 0))],
        probe={"statx": {"nvme0n1": {"atomic_write_unit_min": 4096, "atomic_write_unit_max": 16384,
                                     "atomic_write_segments_max": 1}}})


def _identify_61() -> HostDesc:
    """Linux 6.1 (no atomic_write_* files): the units come from recorded identify data.
    nvme0n1: NSFEAT bit 1, NAWUPF 3 on 4 KiB blocks -> 16 KiB, no boundary;
    nvme1n1: NSFEAT bit 1 clear -> the controller's AWUPF 0 -> one 4 KiB block;
    nvme2n1: NAWUPF 15 on 512 B blocks with NABSPF 7 -> unit 8 KiB, capped by a 4 KiB boundary;
    nvme3n1: NABO 8 (an atomic boundary offset) -> none;
    nvme4n1: nothing recorded -> unknown."""
    disks = [_sata_root(None)] + [_nvme(i, None) for i in range(5)]
    ctrl = {f"nvme{i}.id-ctrl.json": _nvme_ctrl_json(f"S64HNE0T10000{i}", "SAMSUNG MZQL23T8HCLS-00A07",
                                                     awupf=0, awun=0) for i in range(4)}
    ns = {"nvme0n1.id-ns.json": _nvme_ns_json(937684566, 12, nsfeat=0x1a, nawupf=3, nawun=3),
          "nvme1n1.id-ns.json": _nvme_ns_json(937684566, 12, nsfeat=0x18, nawupf=3),
          "nvme2n1.id-ns.json": _nvme_ns_json(7501476528, 9, nsfeat=0x1a, nawupf=15, nabspf=7),
          "nvme3n1.id-ns.json": _nvme_ns_json(937684566, 12, nsfeat=0x1a, nawupf=3, nabspf=7, nabo=8)}
    return _small_host("1s-4c-nvme-identify-6.1", "6.1.0-18-amd64", disks, nvme_json=ctrl | ns)


HOSTS = (_intel_2s(), _epyc_nps4(), _atom_1s(), _atomic_612(), _identify_61())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Write the recorded host trees (tests/data/hosts).")
    ap.add_argument("--out", type=Path, default=HERE, help="directory to write the trees under")
    args = ap.parse_args(argv)
    for h in HOSTS:
        write_host(h, args.out)
        print(f"wrote {args.out / h.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
