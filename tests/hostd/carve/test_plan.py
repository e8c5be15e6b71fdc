"""The carve planner: examples that pin each rule, and properties over random topologies."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from synth import GIB_KB, disk, nic, topology

from api.layout import Layout, layout_problems
from hostd.carve.plan import plan_host
from hostd.carve.policy import policy_from_dict
from hostd.errors import NoFit


def plan(topo, **policy) -> Layout:
    out = plan_host(topo, policy_from_dict(policy))
    assert isinstance(out, Layout), out
    return out


def nofit(topo, **policy) -> NoFit:
    out = plan_host(topo, policy_from_dict(policy))
    assert isinstance(out, NoFit), out
    return out


# ---------------------------------------------------------------- CPUs


def test_demo_machine_cpu0_io_cpu1_vms():
    """This dev machine: 2 CPUs, no SMT, one node."""
    lay = plan(topology(cores=2), io_service={"cpus": "0", "process": "hyb-io-standin"},
               hugepages={"pools": [{"size": "2M", "count_per_node": 64}]})
    assert lay.io_cpus == (0,) and lay.vm_cpus == (1,) and lay.host_cpus == ()
    assert lay.nodes[0].hugepages[0].size_kb == 2048 and lay.nodes[0].hugepages[0].count == 64
    assert lay.io_service.kind == "process" and lay.io_service.name == "hyb-io-standin"
    assert [b.param for b in lay.reboot_required] == ["isolcpus", "irqaffinity"]
    assert lay.reboot_required[0].value == "managed_irq,domain,1"
    assert lay.reboot_required[1].value == "0"


def test_48cpu_intel_two_sockets_whole_cores_per_node():
    """2 sockets x 12 cores x 2 threads, Intel numbering (cpu N and N+24 are siblings)."""
    topo = topology(sockets=2, cores=12, threads=2)
    lay = plan(topo, io_service={"cpus_per_node": 4}, host={"cpus_per_node": 2})
    n0, n1 = lay.nodes
    assert n0.host_cpus == (0, 24)  # lowest core: housekeeping
    assert n0.io_cpus == (1, 2, 25, 26)  # next two whole cores
    assert n1.host_cpus == (12, 36) and n1.io_cpus == (13, 14, 37, 38)
    assert n0.vm_cpus == tuple(range(3, 12)) + tuple(range(27, 36))
    assert len(lay.vm_cpus) == 48 - 12


def test_odd_count_rounds_up_to_whole_cores_with_warning():
    lay = plan(topology(cores=4, threads=2), io_service={"cpus_per_node": 3})
    assert lay.io_cpus == (0, 1, 4, 5)
    assert any("rounded up to whole cores" in w for w in lay.warnings)


def test_split_cores_leftover_sibling_goes_to_host_unless_allowed():
    topo = topology(cores=4, threads=2)  # siblings (0,4) (1,5) (2,6) (3,7)
    lay = plan(topo, io_service={"cpus": "0", "whole_cores": False})
    assert lay.io_cpus == (0,) and lay.host_cpus == (4,) and 4 not in lay.vm_cpus
    assert any("share a core" in w for w in lay.warnings)
    lay = plan(topo, io_service={"cpus": "0", "whole_cores": False}, vm={"allow_split_cores": True})
    assert lay.io_cpus == (0,) and 4 in lay.vm_cpus and lay.host_cpus == ()


def test_explicit_list_widened_to_whole_cores():
    lay = plan(topology(cores=4, threads=2), io_service={"cpus": "1"})
    assert lay.io_cpus == (1, 5)
    assert any("added SMT siblings 5" in w for w in lay.warnings)


def test_count_without_whole_cores_takes_one_thread_per_core_first():
    lay = plan(topology(cores=4, threads=2), io_service={"cpus_per_node": 2, "whole_cores": False},
               vm={"allow_split_cores": True})
    assert lay.io_cpus == (0, 1)
    assert lay.vm_cpus == (2, 3, 4, 5, 6, 7)


def test_amd_nps4_four_nodes_per_socket():
    topo = topology(sockets=1, cores=32, threads=2, nodes_per_socket=4)
    lay = plan(topo, io_service={"cpus_per_node": 2})
    assert [n.io_cpus for n in lay.nodes] == [(0, 32), (8, 40), (16, 48), (24, 56)]
    assert all(len(n.vm_cpus) == 14 for n in lay.nodes)


def test_adjacent_sibling_numbering():
    lay = plan(topology(cores=4, threads=2, adjacent=True), io_service={"cpus_per_node": 2})
    assert lay.io_cpus == (0, 1) and lay.vm_cpus == (2, 3, 4, 5, 6, 7)


def test_offline_cpus_are_not_carved():
    lay = plan(topology(cores=4), io_service={"cpus": "0"}, )
    assert lay.vm_cpus == (1, 2, 3)
    lay = plan(topology(cores=4, offline=(3,)), io_service={"cpus": "0"})
    assert lay.vm_cpus == (1, 2) and any("offline" in w for w in lay.warnings)
    assert nofit(topology(cores=4, offline=(3,)), io_service={"cpus": "3"}).field == "io_service.cpus"


@pytest.mark.parametrize("policy, field, words", [
    ({"io_service": {"cpus": "9"}}, "io_service.cpus", "does not exist"),
    ({"io_service": {"cpus_per_node": 5}}, "io_service.cpus_per_node", "asked for 5"),
    ({"io_service": {"cpus": "0-3"}}, "io_service", "no CPU is left for VMs"),
    ({"host": {"cpus": "0"}, "io_service": {"cpus": "0"}}, "io_service.cpus", "already reserved"),
    ({"host": {"cpus": "0", "whole_cores": False}, "io_service": {"cpus": "4"}},
     "io_service.cpus", "sibling CPUs 0"),
])
def test_cpu_nofit_names_the_field(policy, field, words):
    out = nofit(topology(cores=4, threads=1 if "9" in str(policy) or "0-3" in str(policy)
                         or "cpus_per_node" in str(policy) else 2), **policy)
    assert out.field == field and words in out.reason, out


# ---------------------------------------------------------------- hugepages


def test_hugepages_percent_and_floor():
    topo = topology(sockets=2, cores=4, mem_gib_per_node=64)
    lay = plan(topo, hugepages={"pools": [{"size": "1G", "percent": 50}, {"size": "2M", "count_per_node": 1024}]})
    for n in lay.nodes:
        assert [(t.size_kb, t.count) for t in n.hugepages] == [(2048, 1024), (GIB_KB, 32)]
    out = nofit(topo, hugepages={"pools": [{"size": "1G", "percent": 70}, {"size": "2M", "count_per_node": 8192}]})
    assert out.field == "hugepages.pools" and "io_floor_percent" in out.reason


def test_hugepages_only_on_listed_nodes_and_boot_param_for_1g():
    topo = topology(sockets=2, cores=4)
    lay = plan(topo, hugepages={"pools": [{"size": "1G", "count_per_node": 16, "nodes": [1]}]})
    assert lay.nodes[0].hugepages == () and lay.nodes[1].hugepages[0].count == 16
    boot = {b.param: b for b in lay.reboot_required}
    assert boot["hugepagesz=1G hugepages"].value == "16"


def test_hugepage_nofit():
    assert nofit(topology(sizes=(2048,)), hugepages={"pools": [{"size": "1G", "count_per_node": 1}]}
                 ).field == "hugepages.pools[0].size"
    assert nofit(topology(), hugepages={"pools": [{"size": "2M", "count_per_node": 1, "nodes": [3]}]}
                 ).field == "hugepages.pools[0].nodes"
    out = nofit(topology(), hugepages={"pools": [{"size": "2M", "count_per_node": 1},
                                                 {"size": "2M", "count_per_node": 2}]})
    assert out.field == "hugepages.pools[1]" and "second pool" in out.reason


# ---------------------------------------------------------------- SR-IOV and disks


def test_sriov_slots_and_budget():
    topo = topology(sockets=2, cores=4, nics=(nic("ens1f0", node=1, total=64, speed=25000),))
    lay = plan(topo, sriov={"pfs": [{"name": "ens1f0", "vfs": 16, "max_tx_rate_mbps": 2000,
                                     "min_tx_rate_mbps": 500}]})
    (pf,) = lay.pfs
    assert (pf.name, pf.node, pf.numvfs, pf.bandwidth_mbps) == ("ens1f0", 1, 16, 25000)
    assert [s.index for s in pf.slots] == list(range(16))
    assert all((s.max_tx_rate_mbps, s.min_tx_rate_mbps) == (2000, 500) for s in pf.slots)


@pytest.mark.parametrize("pf, field, words", [
    ({"name": "eth9", "vfs": 1}, "sriov.pfs[0].name", "no NIC named eth9"),
    ({"name": "ens1f0", "vfs": 65}, "sriov.pfs[0].vfs", "supports 64"),
    ({"name": "ens1f0", "vfs": 16, "min_tx_rate_mbps": 2000}, "sriov.pfs[0].min_tx_rate_mbps", "exceeds"),
    ({"name": "ens1f0", "vfs": 1, "max_tx_rate_mbps": 30000}, "sriov.pfs[0].max_tx_rate_mbps", "above"),
    ({"name": "down0", "vfs": 1}, "sriov.pfs[0].bandwidth_mbps", "link speed is unknown"),
    ({"name": "plain0", "vfs": 1}, "sriov.pfs[0].name", "not SR-IOV capable"),
])
def test_sriov_nofit(pf, field, words):
    topo = topology(nics=(nic("ens1f0"), nic("down0", speed=None), nic("plain0", total=0)))
    out = nofit(topo, sriov={"pfs": [pf]})
    assert out.field == field and words in out.reason, out


def test_disks_allow_list_budgets_and_blockers():
    topo = topology(disks=(
        disk("nvme0n1", reasons=("not in the allow-list",)),
        disk("nvme1n1", id="nvme-eui.0025", reasons=("not in the allow-list",)),
        disk("sda", reasons=("mounted at / (sda2)", "not in the allow-list")),
        disk("sdb", reasons=()),
    ))
    lay = plan(topo, disks={"allow": ["nvme*", "sda", "sdz"], "default_bytes_sec": 100,
                            "default_iops": 10,
                            "budget": {"nvme-eui.0025": {"bytes_sec": 5, "iops": 1}}})
    assert [(d.name, d.bytes_sec, d.iops) for d in lay.disks] == [("nvme0n1", 100, 10), ("nvme1n1", 5, 1)]
    assert any("sda matches 'sda' but is not assignable: mounted at / (sda2)" in w for w in lay.warnings)
    assert any("'sdz' matches no disk" in w for w in lay.warnings)
    out = nofit(topo, disks={"allow": ["nvme*"], "budget": {"sda": {"bytes_sec": 1, "iops": 1}}})
    assert out.field == "disks.budget.sda"


def test_disk_matched_by_dev_path_and_by_id():
    topo = topology(disks=(disk("nvme0n1", id="nvme-eui.77"),))
    assert plan(topo, disks={"allow": ["/dev/nvme0n1"]}).disks[0].name == "nvme0n1"
    assert plan(topo, disks={"allow": ["/dev/disk/by-id/nvme-eui.77"]}).disks[0].name == "nvme0n1"
    assert plan(topo, disks={"allow": []}).disks == ()


def test_isolated_vm_cpus_need_no_isolcpus_change():
    lay = plan(topology(cores=4, isolated=(1, 2, 3)), io_service={"cpus": "0"})
    assert "isolcpus" not in [b.param for b in lay.reboot_required]


def test_layout_json_roundtrip():
    topo = topology(sockets=2, cores=4, threads=2, nics=(nic("ens1f0"),), disks=(disk("nvme0n1"),))
    lay = plan(topo, io_service={"cpus_per_node": 2, "unit": "storage.service"},
               hugepages={"pools": [{"size": "2M", "count_per_node": 8}]},
               sriov={"pfs": [{"name": "ens1f0", "vfs": 4}]}, disks={"allow": ["nvme*"]})
    assert Layout.from_json(lay.to_json()) == lay
    d = lay.to_dict()
    assert d["vm_cpus"] == {"0": list(lay.nodes[0].vm_cpus), "1": list(lay.nodes[1].vm_cpus)}


# ---------------------------------------------------------------- properties


@st.composite
def topologies(draw):
    threads = draw(st.sampled_from([1, 2]))
    sockets = draw(st.integers(1, 2))
    nps = draw(st.sampled_from([1, 2, 4]))
    cores = nps * draw(st.integers(1, 6))
    ncpu = sockets * cores * threads
    offline = draw(st.sets(st.integers(1, ncpu - 1), max_size=2)) if ncpu > 1 else set()
    return topology(sockets=sockets, cores=cores, threads=threads, nodes_per_socket=nps,
                    adjacent=draw(st.booleans()), offline=tuple(offline))


@st.composite
def cpu_policies(draw):
    def res(extra):
        kind = draw(st.sampled_from(["none", "count", "list"]))
        d = {"whole_cores": draw(st.booleans())} | extra
        if kind == "count":
            d["cpus_per_node"] = draw(st.integers(0, 4))
        elif kind == "list":
            d["cpus"] = ",".join(map(str, sorted(draw(st.sets(st.integers(0, 15), min_size=1, max_size=4)))))
        return d
    return {"io_service": res({}), "host": res({}),
            "vm": {"allow_split_cores": draw(st.booleans())}}


@settings(max_examples=300, deadline=None)
@given(topologies(), cpu_policies())
def test_property_cpu_sets(topo, pol):
    """Disjoint, covering every online CPU, node-local, SMT-respecting, deterministic."""
    out = plan_host(topo, policy_from_dict(pol))
    assert out == plan_host(topo, policy_from_dict(pol))  # deterministic
    if isinstance(out, NoFit):
        assert out.field.split(".")[0] in ("io_service", "host") and out.reason
        return
    assert layout_problems(out) == []  # what the scheduler checks at registration
    io, host, vm = set(out.io_cpus), set(out.host_cpus), set(out.vm_cpus)
    assert not (io & host) and not (io & vm) and not (host & vm)
    online = {c.id for c in topo.cpus if c.online}
    assert io | host | vm == online
    assert vm, "a layout always leaves VMs something"
    for n in out.nodes:
        for cpu in n.io_cpus + n.host_cpus + n.vm_cpus:
            assert topo.cpu(cpu).node == n.node
    if not pol["vm"]["allow_split_cores"]:
        for cpu in vm:  # a VM CPU's online siblings are all VM CPUs
            assert {s for s in topo.cpu(cpu).siblings if s in online} <= vm
    if pol["io_service"]["whole_cores"]:
        for cpu in io:
            assert {s for s in topo.cpu(cpu).siblings if s in online} <= io | host
    explicit = pol["io_service"].get("cpus")
    if explicit:
        assert {int(c) for c in explicit.split(",")} <= io


@settings(max_examples=200, deadline=None)
@given(topologies(), st.integers(0, 100), st.integers(0, 40_000), st.floats(0, 60))
def test_property_hugepages_respect_floor(topo, count, mem_pct, floor):
    pol = {"hugepages": {"io_floor_percent": floor,
                         "pools": [{"size": "2M", "count_per_node": count * 100}]
                         + ([{"size": "1G", "percent": mem_pct / 1000}] if mem_pct else [])}}
    out = plan_host(topo, policy_from_dict(pol))
    if isinstance(out, NoFit):
        assert out.field == "hugepages.pools"
        return
    for n in out.nodes:
        total = topo.node(n.node).memory_total_kb
        assert sum(t.memory_kb for t in n.hugepages) <= total * (100 - floor) / 100
