"""Host-side claim (pure): exact CPUs, pages, VFs and disks for a VM request."""

from __future__ import annotations

import pytest

from api.cpus import cores_of, pick_cpus
from api.layout import (
    DiskBudget,
    HugepageTarget,
    IoServiceTarget,
    Layout,
    NodeLayout,
    PfLayout,
    VfSlot,
)
from hostd.carve.vmclaim import CellReq, Claim, ClaimCell, DiskReq, Usage, VfReq, VmRequest, claim
from hostd.errors import NoFit

# 2 nodes x 4 cores x 2 threads; siblings n and n+8 (Intel-style enumeration).
SIBLINGS = {c: tuple(sorted({c % 8, c % 8 + 8})) for c in range(16)}
LAYOUT = Layout(
    nodes=(NodeLayout(0, io_cpus=(0, 8), host_cpus=(1, 9), vm_cpus=(2, 3, 10, 11),
                      hugepages=(HugepageTarget(2048, 512),)),
           NodeLayout(1, io_cpus=(4, 12), host_cpus=(), vm_cpus=(5, 6, 7, 13, 14, 15),
                      hugepages=(HugepageTarget(2048, 256), HugepageTarget(1048576, 4)))),
    pfs=(PfLayout("ens1f0", "0000:3b:00.0", 0, 2, 10000, (VfSlot(0, 1000, 0), VfSlot(1, 1000, 0))),
         PfLayout("ens2f0", "0000:af:00.0", 1, 1, 25000, (VfSlot(0, 0, 0),))),
    disks=(DiskBudget("nvme0n1", "wwn-0x1", 0, 10**12, 500 * 2**20, 50000),
           DiskBudget("sdf", "wwn-0x2", 1, 10**12, 0, 0)),
    io_service=IoServiceTarget("none", ""), vm_cgroup="machine", reboot_required=())


def _req(**kw) -> VmRequest:
    base = dict(request_id="r1", name="vm1", vcpus=2, memory_mib=512)
    base.update(kw)
    return VmRequest(**base)


def test_whole_cores_first_and_emulator_on_host_cpus() -> None:
    c = claim(LAYOUT, SIBLINGS, Usage(), _req())
    assert isinstance(c, Claim)
    assert c.node == 0 and c.vcpu_pins == (2, 10)  # one whole core, both threads
    assert c.emulator_cpus == (1, 9)
    assert (c.size_kb, c.pages) == (2048, 256)


def test_odd_remainder_comes_from_a_split_core() -> None:
    """The scheduler's rule (api/cpus.py): whole cores while a whole core fits, the odd
    vCPU from a core that is split already, so core 7/15 stays whole for the next VM."""
    used = Usage(cpus=frozenset({5}))
    c = claim(LAYOUT, SIBLINGS, used, _req(node=1, vcpus=3))
    assert isinstance(c, Claim)
    assert c.vcpu_pins == (6, 14, 13)  # whole core 6/14, then 13 (sibling of used 5), not 7


def test_node_without_host_cpus_falls_back_to_any_host_cpu() -> None:
    c = claim(LAYOUT, SIBLINGS, Usage(), _req(node=1))
    assert isinstance(c, Claim) and c.emulator_cpus == (1, 9)


def test_isolate_takes_one_more_cpu_for_the_emulator() -> None:
    c = claim(LAYOUT, SIBLINGS, Usage(), _req(emulator_policy="isolate"))
    assert isinstance(c, Claim)
    assert c.vcpu_pins == (2, 10) and c.emulator_cpus == (3,)


def test_falls_through_to_next_node_when_first_is_full() -> None:
    used = Usage(cpus=frozenset({2, 3, 10}))
    c = claim(LAYOUT, SIBLINGS, used, _req())
    assert isinstance(c, Claim) and c.node == 1


@pytest.mark.parametrize("req,used,field,text", [
    (_req(vcpus=5, node=0), Usage(), "vcpus", "node 0 has 4 free VM CPUs, 5 needed"),
    (_req(memory_mib=2048, node=0), Usage(pages={(0, 2048): 0}), "memory_mib", "512 free 2048 kB pages, 1024 needed"),
    (_req(memory_mib=100, hugepage_size_kb=1048576), Usage(), "memory_mib", "multiple of the 1048576 kB"),
    (_req(node=7), Usage(), "node", "node 7 has no VM resources"),
    (_req(disks=(DiskReq("sda"),)), Usage(), "disks[0].disk", "not an assignable disk"),
    (_req(disks=(DiskReq("nvme0n1", 600 * 2**20, 10),)), Usage(), "disks[0].bytes_sec", "above nvme0n1's budget"),
    (_req(disks=(DiskReq("nvme0n1"),)), Usage(), "disks[0].bytes_sec", "has an IO budget"),
    (_req(disks=(DiskReq("wwn-0x2"),)), Usage(disks={"sdf": (0, 0)}), "disks[0].disk", "already belongs"),
    (_req(vfs=(VfReq(pf="nope"),)), Usage(), "vfs[0].pf", "no PF 'nope'"),
    (_req(vfs=(VfReq(max_tx_rate_mbps=20000),), node=0), Usage(), "vfs[0].max_tx_rate_mbps", "above ens1f0"),
    (_req(vfs=(VfReq(mac="AA:BB:CC:DD:EE:FF"),)), Usage(), "vfs[0].mac", "lower-case MAC"),
    (_req(vfs=(VfReq(vlan=5000),)), Usage(), "vfs[0].vlan", "4094"),
    (_req(vfs=(VfReq(min_tx_rate_mbps=6000),), node=0), Usage(min_rate_mbps={"ens1f0": 5000}), "vfs[0]", "unreserved bandwidth"),
])
def test_refusals_name_the_field(req, used, field, text) -> None:
    r = claim(LAYOUT, SIBLINGS, used, req)
    assert isinstance(r, NoFit), r
    assert r.field == field and text in r.reason


def test_vfs_are_node_local_and_not_reused() -> None:
    used = Usage(vfs=frozenset({("ens1f0", 0)}))
    c = claim(LAYOUT, SIBLINGS, used, _req(vfs=(VfReq(min_tx_rate_mbps=100),)))
    assert isinstance(c, Claim)
    assert [(v.pf, v.index, v.max_tx_rate_mbps) for v in c.vfs] == [("ens1f0", 1, 1000)]
    full = Usage(vfs=frozenset({("ens1f0", 0), ("ens1f0", 1)}))
    r = claim(LAYOUT, SIBLINGS, full, _req(node=0, vfs=(VfReq(),)))
    assert isinstance(r, NoFit) and r.field == "vfs[0]"


def test_pick_cpus_never_returns_more_or_used() -> None:
    cores = cores_of([2, 3, 10, 11], SIBLINGS)
    assert cores == ((2, 10), (3, 11))
    assert pick_cpus(cores, {11}, 4) == [2, 10, 3]
    assert pick_cpus(cores, {11}, 2) == [2, 10]
    c = claim(LAYOUT, SIBLINGS, Usage(cpus=frozenset({11})), _req(node=0, vcpus=4))
    assert isinstance(c, NoFit) and c.field == "vcpus" and "3 free VM CPUs, 4 needed" in c.reason


def test_preferred_cpus_are_taken_where_free_and_must_be_vm_cpus():
    req = VmRequest("r", "vm", vcpus=2, memory_mib=2, hugepage_size_kb=2048, node=0, prefer_cpus=(11, 3))
    got = claim(LAYOUT, SIBLINGS, Usage(), req)
    assert isinstance(got, Claim) and got.vcpu_pins == (11, 3)
    # Every CPU preferred and free: nothing left to pick (the last free CPUs of a node).
    last = claim(LAYOUT, SIBLINGS, Usage(cpus=frozenset(set(LAYOUT.vm_cpus) - {3})),
                 VmRequest("r", "vm", 1, 2, 2048, 0, prefer_cpus=(3,)))
    assert isinstance(last, Claim) and last.vcpu_pins == (3,)
    got = claim(LAYOUT, SIBLINGS, Usage(cpus=frozenset({11})), req)
    assert isinstance(got, Claim) and 3 in got.vcpu_pins and 11 not in got.vcpu_pins
    bad = claim(LAYOUT, SIBLINGS, Usage(), VmRequest("r", "vm", 1, 2, 2048, 0, prefer_cpus=(0,)))
    assert isinstance(bad, NoFit) and bad.field == "placement.cpus" and "not VM CPUs" in bad.reason


# ---------------------------------------------------------------- guest NUMA cells (spanning)


def test_spanned_claim_takes_each_cells_cpus_and_pages_from_its_node() -> None:
    cells = (CellReq(0, 2, 512, prefer_cpus=(3, 11)), CellReq(1, 3, 256))
    c = claim(LAYOUT, SIBLINGS, Usage(), _req(vcpus=5, memory_mib=768, cells=cells))
    assert isinstance(c, Claim), c
    assert c.spans and c.node == 0 and c.pages == 384
    assert c.cells == (ClaimCell(0, 2, 256), ClaimCell(1, 3, 128))
    assert c.cell_pins() == ((3, 11), (5, 13, 6))  # the scheduler's pick on node 0, whole cores on 1
    assert c.emulator_cpus == (1, 9)  # host CPUs of the nodes used (node 1 has none)
    iso = claim(LAYOUT, SIBLINGS, Usage(), _req(vcpus=5, memory_mib=768, cells=cells, emulator_policy="isolate"))
    assert isinstance(iso, Claim) and iso.emulator_cpus == (2,) and iso.cell_pins()[0] == (3, 11)
    assert set(iso.dedicated_cpus) == {2, 3, 11, 5, 13, 6}


def test_spanned_claim_vfs_may_come_from_any_cell_node() -> None:
    cells = (CellReq(0, 1, 2), CellReq(1, 1, 2))
    c = claim(LAYOUT, SIBLINGS, Usage(vfs=frozenset({("ens1f0", 0), ("ens1f0", 1)})),
              _req(vcpus=2, memory_mib=4, cells=cells, vfs=(VfReq(),)))
    assert isinstance(c, Claim) and [v.pf for v in c.vfs] == ["ens2f0"]  # node 0's PF is full


@pytest.mark.parametrize("cells,field,reason", [
    ((CellReq(0, 2, 512),), "placement.cells", "two or more cells"),
    ((CellReq(0, 2, 256), CellReq(0, 0, 256)), "placement.cells[1].cpus", "needs a vCPU"),
    ((CellReq(0, 1, 511), CellReq(1, 1, 1)), "placement.cells[0].memory_mib", "multiple of the 2048 kB"),
    ((CellReq(0, 1, 256), CellReq(0, 1, 256)), "placement.cells", "a host node is given twice"),
    ((CellReq(0, 1, 256), CellReq(1, 2, 256)), "placement.cells", "the cells hold 3 vCPUs, the VM has 2"),
    ((CellReq(0, 1, 256), CellReq(1, 1, 512)), "placement.cells", "the cells hold 768 MiB, the VM has 512"),
    ((CellReq(0, 1, 256), CellReq(7, 1, 256)), "placement.cells", "nodes [7] have no VM resources"),
    ((CellReq(0, 1, 256), CellReq(1, 1, 256, prefer_cpus=(2,))), "placement.cells[1].cpus",
     "CPUs [2] are not VM CPUs of node 1"),
    ((CellReq(0, 1, 2), CellReq(1, 1, 510)), "memory_mib", "node 1 has 254 free 2048 kB pages, 255 needed"),
])
def test_bad_cells_are_refused_naming_the_field(cells, field, reason) -> None:
    got = claim(LAYOUT, SIBLINGS, Usage(pages={(1, 2048): 2}), _req(vcpus=2, memory_mib=512, cells=cells))
    assert isinstance(got, NoFit) and got.field == field and reason in got.reason, got
