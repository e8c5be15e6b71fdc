"""The domain cases the golden files pin down, built the way hostd builds them:
a VmSpec, a claim made by the real ``hostd.carve.vmclaim.claim`` on a synthetic layout,
and the real ``VmMetadata`` element. No libvirt, no IO.

The layout is a made-up 2-node, 16-CPU SMT host (CPU n and n+8 are siblings),
not a recorded one: the designer only sees the claim, which is what is checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from api.layout import DiskBudget, HugepageTarget, IoServiceTarget, Layout, NodeLayout, PfLayout, VfSlot
from hostd.carve.vmclaim import CellReq, Claim, Usage, VfReq, claim
from hostd.carve.vmspec import DiskSpec, IoTune, VmSpec
from hostd.domain.designer import Boot, HostFacts, design
from hostd.domain.elements import Domain
from hostd.domain.metadata import VmMetadata
from hostd.errors import NoFit

SIBLINGS = {c: (c % 8, c % 8 + 8) for c in range(16)}
LAYOUT = Layout(
    nodes=(NodeLayout(0, io_cpus=(0, 8), host_cpus=(1, 9), vm_cpus=(2, 3, 4, 5, 10, 11, 12, 13),
                      hugepages=(HugepageTarget(2048, 8192),)),
           NodeLayout(1, io_cpus=(), host_cpus=(6, 14), vm_cpus=(7, 15),
                      hugepages=(HugepageTarget(1048576, 8), HugepageTarget(2048, 1024)))),
    pfs=(PfLayout("ens1f0", "0000:3b:00.0", 0, 2, 25000,
                  (VfSlot(0, 10000, 0), VfSlot(1, 10000, 0))),),
    disks=(DiskBudget("nvme0n1", "nvme-eui.0025388a01", 0, 4 * 10**12, 800 * 2**20, 100000),
           DiskBudget("nvme1n1", "nvme-eui.0025388a02", 0, 4 * 10**12, 800 * 2**20, 100000),
           DiskBudget("loop0", None, 0, 256 * 2**20, 0, 0)),
    io_service=IoServiceTarget("none", ""), vm_cgroup="machine", reboot_required=())
VF_PCI = {("ens1f0", 0): "0000:3b:02.0", ("ens1f0", 1): "0000:3b:02.1"}
STATE = Path("/var/lib/hostd")
SMOKE = Path("/var/cache/hybrid-kvm/smoke")
KERNEL = Boot(kernel=str(SMOKE / "vmlinuz"), initrd=str(SMOKE / "initrd.img"),
              cmdline="console=ttyS0 panic=-1")
CREATED = 1763900000


@dataclass(frozen=True)
class Case:
    name: str
    spec: VmSpec
    boot: Boot
    host: HostFacts
    layout: Layout = LAYOUT

    def claim(self) -> Claim:
        got = claim(self.layout, SIBLINGS, Usage(), self.spec.request())
        assert not isinstance(got, NoFit), got
        return got

    def metadata(self) -> VmMetadata:
        return VmMetadata(vm_id=vm_id(self.name), request_id=self.spec.request_id, created=CREATED,
                          claim=self.claim(), spec=self.spec)

    def domain(self) -> Domain:
        md = self.metadata()
        return design(vm_id=md.vm_id, spec=self.spec, claim=md.claim, boot=self.boot, host=self.host,
                      metadata=(md.to_xml(),))


def vm_id(name: str) -> str:
    """A fixed UUID per case, so the golden files are stable."""
    n = sum(ord(c) * (i + 1) for i, c in enumerate(name))
    return f"6b1a4f3e-{n % 65536:04x}-4000-8000-{n:012x}"


def spec(name: str, **kw) -> VmSpec:
    return VmSpec(request_id=f"req-{name}", name=name, vcpus=kw.pop("vcpus", 1),
                  memory_mib=kw.pop("memory_mib", 256), image="smoke", **kw)


def host(virt_type: str = "kvm", **kw) -> HostFacts:
    return HostFacts(virt_type=virt_type, console_dir=STATE / "vms", siblings=SIBLINGS, vf_pci=VF_PCI, **kw)


CASES = (
    Case("minimal", spec("minimal", emulator_policy="share"), KERNEL, host()),
    Case("pinned-hugepages-2m", spec("pinned-hugepages-2m", vcpus=4, memory_mib=4096, node=0),
         KERNEL, host()),
    Case("hugepages-1g-numa-cell",
         spec("hugepages-1g-numa-cell", vcpus=2, memory_mib=4096, hugepage_size_kb=1048576, node=1,
              guest_numa=True), KERNEL, host()),
    Case("dedicated-emulator-core",
         spec("dedicated-emulator-core", vcpus=3, memory_mib=2048, node=0, emulator_policy="isolate",
              disks=(DiskSpec("nvme1n1", IoTune(total_bytes_sec=100 * 2**20, total_iops_sec=5000)),)),
         KERNEL, host()),
    Case("vf-vlan",
         spec("vf-vlan", vcpus=2, memory_mib=1024,
              vfs=(VfReq(pf="ens1f0", mac="52:54:00:12:34:56", vlan=100, max_tx_rate_mbps=2000),)),
         KERNEL, host()),
    # Issue 38 item 3: VFs that may move live. VF 0 as the primary of a failover pair (its
    # virtio-net standby on the host's failover bridge, the same MAC, teaming), VF 1 to be
    # unplugged for a move (only its alias). The PCI addresses are the recorded tree's
    # (tests/data/hosts/1s-8c-nosmt-1pf-8vf): this machine has no SR-IOV.
    Case("vf-failover",
         spec("vf-failover", vcpus=2, memory_mib=1024,
              vfs=(VfReq(pf="ens1f0", mac="52:54:00:12:34:57", migration="failover"),
                   VfReq(pf="ens1f0", mac="52:54:00:12:34:58", vlan=7, migration="interrupt"))),
         KERNEL, host(failover_bridge="br-failover")),
    Case("raw-disk-iotune",
         spec("raw-disk-iotune", vcpus=2, memory_mib=1024, disks=(
             DiskSpec("nvme-eui.0025388a01", IoTune(
                 read_bytes_sec=200 * 2**20, write_bytes_sec=100 * 2**20, read_iops_sec=20000,
                 write_iops_sec=10000, group_name="tenant-a")),
             # bursts go with total rates (QEMU refuses a total burst without its base)
             DiskSpec("nvme1n1", IoTune(total_bytes_sec=300 * 2**20, total_iops_sec=30000,
                                        total_bytes_sec_max=600 * 2**20, total_iops_sec_max=60000,
                                        total_bytes_sec_max_length=10, total_iops_sec_max_length=5,
                                        group_name="tenant-a")))),
         KERNEL, host()),
    Case("tcg-qemu",
         spec("tcg-qemu", vcpus=2, memory_mib=512, guest_numa=True,
              disks=(DiskSpec("nvme0n1", IoTune(total_bytes_sec=50 * 2**20, total_iops_sec=1000)),)),
         KERNEL, host("qemu", lock_memory=False)),
    Case("boot-from-disk", spec("boot-from-disk", vcpus=2, memory_mib=1024),
         Boot(disk="/var/lib/hostd/vms/boot-from-disk/root.qcow2", disk_format="qcow2"), host()),
    # Spanning both host nodes: two guest cells (4 vCPUs + 4 GiB on node 0, 2 + 2 GiB on
    # node 1), each bound to its node, without guest_numa (a spanning VM always has cells).
    Case("span-two-nodes",
         spec("span-two-nodes", vcpus=6, memory_mib=6144,
              cells=(CellReq(0, 4, 4096), CellReq(1, 2, 2048, prefer_cpus=(7, 15)))),
         KERNEL, host()),
)


def smoke_case(disk: str, state_dir: Path, kernel: Path, initrd: Path) -> Case:
    """The integration guest (and its golden twin): TCG, 1 vCPU on CPU 1, emulator
    on CPU 0, 256 MiB of 2 MiB pages, one loop disk with iotune, no <locked/>."""
    layout = Layout(nodes=(NodeLayout(0, io_cpus=(), host_cpus=(0,), vm_cpus=(1,),
                                      hugepages=(HugepageTarget(2048, 128),)),),
                    pfs=(), disks=(DiskBudget(disk, None, 0, 256 * 2**20, 0, 0),),
                    io_service=IoServiceTarget("none", ""), vm_cgroup="machine", reboot_required=())
    s = spec("hyb-test-domain-smoke", vcpus=1, memory_mib=256, node=0, emulator_policy="host", disks=(
        DiskSpec(disk, IoTune(total_bytes_sec=4 * 2**20, total_iops_sec=200,
                              total_bytes_sec_max=8 * 2**20, total_bytes_sec_max_length=2,
                              group_name="smoke")),))
    return Case("smoke-direct-kernel", s,
                Boot(kernel=str(kernel), initrd=str(initrd), cmdline="console=ttyS0 panic=-1"),
                HostFacts(virt_type="qemu", console_dir=state_dir / "vms", lock_memory=False), layout)


def span_smoke_case(state_dir: Path, kernel: Path, initrd: Path) -> Case:
    """A smoke guest spanning two host nodes (synthetic layout: CPU 1 on node 0, CPU 0 on
    node 1, 64 x 2 MiB pages each): two guest cells of 1 vCPU + 128 MiB each."""
    layout = Layout(nodes=(NodeLayout(0, io_cpus=(), host_cpus=(), vm_cpus=(1,),
                                      hugepages=(HugepageTarget(2048, 64),)),
                           NodeLayout(1, io_cpus=(), host_cpus=(), vm_cpus=(0,),
                                      hugepages=(HugepageTarget(2048, 64),))),
                    pfs=(), disks=(), io_service=IoServiceTarget("none", ""), vm_cgroup="machine",
                    reboot_required=())
    s = spec("hyb-test-domain-span", vcpus=2, memory_mib=256, emulator_policy="share",
             cells=(CellReq(0, 1, 128), CellReq(1, 1, 128)))
    return Case("span-smoke", s, Boot(kernel=str(kernel), initrd=str(initrd), cmdline="console=ttyS0 panic=-1"),
                HostFacts(virt_type="qemu", console_dir=state_dir / "vms", lock_memory=False), layout)


GOLDEN_CASES = CASES + (smoke_case("loop0", STATE, SMOKE / "vmlinuz", SMOKE / "initrd.img"),)
