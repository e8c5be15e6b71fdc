"""Dispatch and reconcile against real hostd gRPC servers (mTLS, certificates from
tools/dev/make-dev-ca.sh) running in-process over libvirt's test driver with real SQLite
ledgers, the same construction as tests/hostd/rpc/test_grpc_service.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from api import hostd_pb2 as pb
from tools.dev.hostd_inproc import LAYOUT, TWO_NODES, dev_certs, start_hostd
from sched_helpers import ADM, HOST, TA, make_client, vm_body
from scheduler.config import DispatchConfig
from scheduler.dispatch import HostdClients
from scheduler.db.models import Vm
from scheduler.reconcile import alloc_of, reconcile_all
from scheduler.resources import Allocation
from scheduler.config import ReconcileConfig


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    return dev_certs(tmp_path_factory.mktemp("ca"))


@pytest.fixture
def cluster(tmp_path: Path, certs: Path):  # type: ignore[no-untyped-def]
    """Two hostd servers: h1 lacks the image (its CreateVM fails), h2 has it."""
    started = []
    try:
        for name, img in (("h1", False), ("h2", True)):
            d = tmp_path / name
            d.mkdir()
            started.append((name, start_hostd(d, certs, name, with_image=img, workers=4)))
        clients = HostdClients(DispatchConfig(ca=str(certs / "ca.crt"), cert=str(certs / "scheduler.crt"),
                                              key=str(certs / "scheduler.key"), timeout_s=10, max_attempts=3))
        with make_client(f"sqlite:///{tmp_path}/s.db", hostd=clients, dispatch={"enabled": True}) as api:
            for name, h in started:
                body = {"name": name, "address": f"localhost:{h.port}", "layout": json.loads(LAYOUT.to_json()),
                        "rack": name}
                assert api.post("/v1/hosts", json=body, headers=HOST).status_code == 201
            yield api, clients, {n: h.manager for n, h in started}
        clients.close()
    finally:
        for _n, h in started:
            h.stop("t-")


def test_create_fails_over_to_next_host_then_runs_and_delete_frees(cluster):
    api, _clients, managers = cluster
    body = vm_body("t-web", vcpus=1, memory_mib=128, labels={"app": "web"},
                   disks=[{"disk": "nvme0n1", "iotune": {"total_bytes_sec": 10**8, "total_iops_sec": 1000}}],
                   vfs=[{"max_tx_rate_mbps": 1000, "vlan": 7}])
    r = api.post("/v1/vms", json=body, headers=TA | {"Idempotency-Key": "k1"})
    assert r.status_code == 202 and r.json()["host"] == "h1"  # pack: tie -> name; h1 will refuse
    vm = api.get(f"/v1/vms/{r.json()['id']}", headers=TA).json()
    assert vm["status"] == "running", vm
    assert vm["host"] == "h2" and vm["attempts"] == 2 and vm["hostd_vm_id"]
    remote = managers["h2"].get(vm["hostd_vm_id"])
    assert remote.state == "running" and remote.request_id == vm["id"]
    assert managers["h1"].ledger.list() == []  # h1 rolled back its side
    h1 = api.get("/v1/hosts/h1", headers=ADM).json()
    assert h1["vms"] == 0 and h1["nodes"][0]["used_cpus"] == [] and not h1["disks"][0]["used"]
    h2 = api.get("/v1/hosts/h2", headers=ADM).json()
    assert h2["nodes"][0]["used_cpus"] == vm["placement"]["cpus"] and h2["disks"][0]["used"]
    # live IO limits go to hostd first; the test driver's domain has no disk, so hostd
    # refuses, the scheduler answers 502 with hostd's code and changes nothing
    r = api.patch(f"/v1/vms/{vm['id']}/io-limits", headers=TA,
                  json={"disks": [{"disk": "nvme0n1", "iotune": {"total_bytes_sec": 2 * 10**8}}]})
    assert r.status_code == 502 and "hyb.vm.refused [disks[0].disk]" in r.json()["error"]["message"]
    assert api.get(f"/v1/vms/{vm['id']}", headers=TA).json()["placement"]["disks"][0]["bytes_sec"] == 10**8
    # a VF rate change: reserved centrally, then set by hostd (its netlink double records it)
    vf = vm["placement"]["vfs"][0]
    r = api.patch(f"/v1/vms/{vm['id']}/io-limits", headers=TA,
                  json={"vfs": [{"vf": 0, "max_tx_rate_mbps": 3000, "min_tx_rate_mbps": 500}]})
    assert r.status_code == 200, r.text
    assert managers["h2"].vf_rates.get_rate(vf["pf"], vf["index"]) == (3000, 500)
    assert api.get("/v1/hosts/h2", headers=ADM).json()["pfs"][0]["reserved_mbps"] == 500
    # hostd fails to set the rate: 502, and the reservation made for it is given back

    def broken(*_a):  # type: ignore[no-untyped-def]
        raise OSError("netlink: Operation not supported")
    managers["h2"].vf_rates.set_rate = broken
    r = api.patch(f"/v1/vms/{vm['id']}/io-limits", headers=TA,
                  json={"vfs": [{"vf": 0, "max_tx_rate_mbps": 3000, "min_tx_rate_mbps": 2000}]})
    assert r.status_code == 502, r.text
    assert api.get("/v1/hosts/h2", headers=ADM).json()["pfs"][0]["reserved_mbps"] == 500
    assert api.get(f"/v1/vms/{vm['id']}", headers=TA).json()["placement"]["vfs"][0]["min_tx_rate_mbps"] == 500
    assert api.delete(f"/v1/vms/{vm['id']}", headers=TA).status_code == 204
    assert managers["h2"].ledger.list() == []
    h2 = api.get("/v1/hosts/h2", headers=ADM).json()
    assert h2["vms"] == 0 and h2["nodes"][0]["used_cpus"] == [] and h2["pfs"][0]["vfs_used"] == 0


def test_every_host_refuses_vm_fails_with_reasons_and_no_leak(cluster):
    api, _clients, managers = cluster
    r = api.post("/v1/vms", json=vm_body("t-x", vcpus=1, memory_mib=128, image="nope"),
                 headers=TA | {"Idempotency-Key": "k2"})
    vm = api.get(f"/v1/vms/{r.json()['id']}", headers=TA).json()
    assert vm["status"] == "failed" and vm["placement"] is None and vm["host"] is None
    assert "h1: CreateVM" in vm["reason"] and "h2: CreateVM" in vm["reason"]
    assert "hyb.image.unknown [image]" in vm["reason"]
    for h in api.get("/v1/hosts", headers=ADM).json()["items"]:
        assert h["nodes"][0]["used_cpus"] == [] and h["vms"] == 0
    assert all(m.ledger.list() == [] for m in managers.values())
    assert 'hyb_sched_dispatch_total{outcome="failed"} 2.0' in api.get("/metrics", headers=ADM).text


def test_reconcile_repairs_drift_hostd_is_the_truth(cluster):
    api, clients, managers = cluster
    r = api.post("/v1/vms", json=vm_body("t-a", vcpus=1, memory_mib=128), headers=TA | {"Idempotency-Key": "a"})
    vm = api.get(f"/v1/vms/{r.json()['id']}", headers=TA).json()
    assert vm["status"] == "running" and vm["host"] == "h2"
    # drift 1: the VM vanished from hostd behind the scheduler's back
    managers["h2"].delete(vm["hostd_vm_id"])
    # drift 2: a VM of ours runs on hostd with no scheduler row (e.g. a lost DB write)
    addr = api.get("/v1/hosts/h2", headers=ADM).json()["address"]
    orphan = clients.create(addr, pb.CreateVMRequest(
        request_id="00000000-0000-0000-0000-00000000beef", name="t-orphan", vcpus=1, memory_mib=128,
        image="smoke", labels={"hyb.vm": "00000000-0000-0000-0000-00000000beef", "hyb.tenant": "a",
                               "hyb.name": "orphan"}))
    got = reconcile_all(api.app, clients, ReconcileConfig(grace_s=0))
    assert sorted(got["h2"]) == sorted([f"vanished vm={vm['id']}",
                                        "orphan_adopted vm=00000000-0000-0000-0000-00000000beef"])
    assert api.get(f"/v1/vms/{vm['id']}", headers=TA).json()["status"] == "failed"
    adopted = api.get("/v1/vms/00000000-0000-0000-0000-00000000beef", headers=TA).json()
    assert adopted["status"] == "running" and adopted["placement"]["cpus"] == list(orphan.vcpu_pins)
    h2 = api.get("/v1/hosts/h2", headers=ADM).json()
    assert h2["nodes"][0]["used_cpus"] == list(orphan.vcpu_pins)
    assert reconcile_all(api.app, clients, ReconcileConfig(grace_s=0)) == {"h1": [], "h2": []}  # converged
    # drift 3: the host's usage row disagrees with its allocations -> recomputed from them
    from scheduler.db.models import Host
    with api.app.state.store.write() as s:
        s.get(Host, "h2").usage = {}
    assert reconcile_all(api.app, clients, ReconcileConfig(grace_s=0))["h2"] == ["usage_recomputed"]
    assert api.get("/v1/hosts/h2", headers=ADM).json()["nodes"][0]["used_cpus"] == list(orphan.vcpu_pins)
    assert 'hyb_sched_reconcile_repairs_total{kind="vanished"} 1.0' in api.get("/metrics", headers=ADM).text


@pytest.fixture
def two_node_host(tmp_path: Path, certs: Path):  # type: ignore[no-untyped-def]
    """One hostd whose layout has two NUMA nodes (2 VM CPUs, 128 x 2 MiB pages each)."""
    h = start_hostd(tmp_path, certs, "n2", layout=TWO_NODES)
    clients = HostdClients(DispatchConfig(ca=str(certs / "ca.crt"), cert=str(certs / "scheduler.crt"),
                                          key=str(certs / "scheduler.key"), timeout_s=10, max_attempts=1))
    try:
        with make_client(f"sqlite:///{tmp_path}/s.db", hostd=clients, dispatch={"enabled": True}) as api:
            body = {"name": "n2", "address": f"localhost:{h.port}", "layout": json.loads(TWO_NODES.to_json())}
            assert api.post("/v1/hosts", json=body, headers=HOST).status_code == 201
            yield api, clients, h.manager
    finally:
        clients.close()
        h.stop("t-")


def test_spanned_vm_runs_with_a_guest_cell_per_node_and_frees_both(two_node_host):
    """allow_span_nodes end to end: the scheduler's cells go to hostd as Placement.cells,
    hostd claims each cell's CPUs and pages on its node, and both sides agree."""
    api, clients, m = two_node_host
    r = api.post("/v1/vms", json=vm_body("t-big", vcpus=3, memory_mib=384, allow_span_nodes=True,
                                         vfs=[{"max_tx_rate_mbps": 1000}]),
                 headers=TA | {"Idempotency-Key": "span"})
    assert r.status_code == 202, r.text
    vm = api.get(f"/v1/vms/{r.json()['id']}", headers=TA).json()
    assert vm["status"] == "running", vm
    cells = vm["placement"]["cells"]
    assert [(c["node"], len(c["cpus"]), c["memory_mib"]) for c in cells] == [(0, 2, 256), (1, 1, 128)]
    rec = m.get(vm["hostd_vm_id"])
    assert rec.claim.spans and [(c.node, c.vcpus, c.pages) for c in rec.claim.cells] == [(0, 2, 128), (1, 1, 64)]
    assert [list(p) for p in rec.claim.cell_pins()] == [c["cpus"] for c in cells]
    assert rec.claim.vfs[0].pf == "ens1f0"  # its PF is on node 1, one of the VM's nodes
    inv = clients.inventory(api.get("/v1/hosts/n2", headers=ADM).json()["address"])
    assert [[p.used for p in n.hugepages] for n in inv.nodes] == [[128], [64]]
    # what hostd reports is what reconcile would adopt: the scheduler's own allocation
    (got,) = clients.list_vms(api.get("/v1/hosts/n2", headers=ADM).json()["address"])
    assert [(c.numa_node, list(c.cpus), c.memory_mib) for c in got.cells] == \
        [(c["node"], c["cpus"], c["memory_mib"]) for c in cells]
    with api.app.state.store.read() as s:
        stored = Allocation.from_dict(s.get(Vm, vm["id"]).allocation)
    assert alloc_of(got) == stored
    assert reconcile_all(api.app, clients, ReconcileConfig(grace_s=0)) == {"n2": []}
    assert api.delete(f"/v1/vms/{vm['id']}", headers=TA).status_code == 204
    assert m.ledger.list() == [] and m.ledger.usage().pages == {}
    h = api.get("/v1/hosts/n2", headers=ADM).json()
    assert all(n["used_cpus"] == [] for n in h["nodes"]) and h["vms"] == 0
    # a spanning VM hostd runs and the scheduler has no row for: adopted with its cells
    addr = h["address"]
    orphan = "00000000-0000-0000-0000-0000000051a2"
    clients.create(addr, pb.CreateVMRequest(
        request_id=orphan, name="t-span-orphan", vcpus=2, memory_mib=256, image="smoke",
        placement=pb.Placement(cells=[pb.NumaCell(numa_node=0, cpus=[2], memory_mib=128),
                                      pb.NumaCell(numa_node=1, cpus=[6], memory_mib=128)]),
        labels={"hyb.vm": orphan, "hyb.tenant": "a", "hyb.name": "span-orphan"}))
    assert reconcile_all(api.app, clients, ReconcileConfig(grace_s=0)) == \
        {"n2": [f"orphan_adopted vm={orphan}", "usage_recomputed"]}
    got = api.get(f"/v1/vms/{orphan}", headers=TA).json()
    assert got["request"]["allow_span_nodes"] is True
    assert [(c["node"], c["cpus"], c["memory_mib"]) for c in got["placement"]["cells"]] == [(0, [2], 128), (1, [6], 128)]
    h = api.get("/v1/hosts/n2", headers=ADM).json()
    assert [n["used_cpus"] for n in h["nodes"]] == [[2], [6]]
    assert api.delete(f"/v1/vms/{orphan}", headers=TA).status_code == 204 and m.ledger.list() == []
