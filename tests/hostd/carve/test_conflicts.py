"""Which VMs a new layout would not hold (hostd/carve/conflicts.py): what a carve, from
the command line or the Carve RPC, refuses to strand."""

from __future__ import annotations

from api.layout import DiskBudget, HugepageTarget, IoServiceTarget, Layout, NodeLayout, PfLayout, VfSlot
from hostd.apply.ledger import VmRecord
from hostd.carve.conflicts import vm_conflicts
from hostd.carve.vmclaim import Claim, ClaimCell, ClaimedDisk, ClaimedVf


def layout(vm_cpus=(2, 3), pages=64, vfs=2, disks=("nvme0n1",), bytes_sec=0) -> Layout:
    return Layout(
        nodes=(NodeLayout(0, (0,), (1,), tuple(vm_cpus), (HugepageTarget(2048, pages),)),),
        pfs=(PfLayout("ens1f0", "0000:3b:00.0", 0, vfs, 10000, tuple(VfSlot(i, 0, 0) for i in range(vfs))),),
        disks=tuple(DiskBudget(d, None, 0, 10**12, bytes_sec, 0) for d in disks),
        io_service=IoServiceTarget("none", ""), vm_cgroup="machine", reboot_required=())


def rec(name: str, pins=(2,), pages=32, vf=None, disk=None, emu=(1,), state="running", cells=()) -> VmRecord:
    c = Claim(node=0, vcpu_pins=tuple(pins), emulator_cpus=tuple(emu), size_kb=2048, pages=pages,
              vfs=(ClaimedVf("ens1f0", vf, 0, 0, "52:54:00:00:00:01", 0),) if vf is not None else (),
              disks=(ClaimedDisk(disk, 10**8, 0),) if disk else (), cells=cells)
    return VmRecord(f"id-{name}", f"r-{name}", name, state, "", c, {}, 0.0)


def test_vms_the_layout_holds_are_no_conflict() -> None:
    assert vm_conflicts(layout(), [rec("a", vf=1, disk="nvme0n1"), rec("b", pins=(3,))]) == []


def test_each_vm_is_named_with_every_reason() -> None:
    vms = [rec("a", pins=(2, 3), vf=1, disk="nvme0n1", state="stopped"), rec("b", pins=(4,), emu=(0,))]
    out = vm_conflicts(layout(vm_cpus=(2,), pages=40, vfs=1, disks=()), vms)
    assert out == [
        "a (id-a, stopped): vCPUs on CPUs 3, not VM CPUs of the new layout; VF ens1f0/1 is not a VF slot "
        "of the new layout; disk nvme0n1 is not assignable in the new layout; node 0 2048 kB hugepages: "
        "VMs hold 64, the new pool has 40",
        "b (id-b, running): vCPUs on CPUs 4, not VM CPUs of the new layout; emulator on CPUs 0, IO-service "
        "CPUs of the new layout; node 0 2048 kB hugepages: VMs hold 64, the new pool has 40",
    ]


def test_pages_of_a_spanning_vm_count_per_node_and_disk_budgets_in_total() -> None:
    span = rec("s", pins=(2, 3), pages=64, cells=(ClaimCell(0, 1, 32), ClaimCell(1, 1, 32)))
    out = vm_conflicts(layout(), [span])
    assert out == ["s (id-s, running): node 1 2048 kB hugepages: VMs hold 32, the new pool has 0"]
    two = [rec("a", disk="nvme0n1"), rec("b", pins=(3,), disk="nvme0n1")]
    assert [c.split(":", 1)[1] for c in vm_conflicts(layout(bytes_sec=10**8), two)] == \
        [" disk nvme0n1: VMs use 200000000 bytes/s, the new budget is 100000000"] * 2
