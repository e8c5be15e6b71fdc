"""Dispatch and reconcile against real hostd gRPC servers (mTLS, certificates from
tools/make-dev-ca.sh) running in-process over libvirt's test driver with real SQLite
ledgers, the same construction as tests/hostd/service/test_grpc_service.py."""

from __future__ import annotations

import json
import subprocess
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from api import hostd_pb2 as pb
from api import hostd_pb2_grpc as pb_grpc
from hostd.carve.layout import (DiskBudget, HugepageTarget, IoServiceTarget, Layout, NodeLayout,
                                PfLayout, VfSlot)
from hostd.images import ImageStore
from hostd.ledger import Ledger
from hostd.metadata import NS, VmMetadata
from hostd.runtime import LibvirtHost
from hostd.service import HostdService
from hostd.vms import VmManager
from sched_helpers import ADM, HOST, TA, make_client, vm_body
from scheduler.config import DispatchConfig
from scheduler.dispatch import HostdClients
from scheduler.reconcile import reconcile_all
from scheduler.config import ReconcileConfig

REPO = Path(__file__).resolve().parents[2]
LAYOUT = Layout(
    nodes=(NodeLayout(0, (0,), (1,), (2, 3), (HugepageTarget(2048, 256),)),),
    pfs=(PfLayout("ens1f0", "0000:3b:00.0", 0, 2, 10000, (VfSlot(0, 0, 0), VfSlot(1, 0, 0))),),
    disks=(DiskBudget("nvme0n1", "nvme-eui.01", 0, 10**12, 10**9, 10**5),),
    io_service=IoServiceTarget("none", ""), vm_cgroup="machine", reboot_required=())


class Rates:
    def __init__(self):
        self.rates = {}

    def get_rate(self, pf, vf):
        return self.rates.get((pf, vf), (0, 0))

    def set_rate(self, pf, vf, mx, mn):
        self.rates[(pf, vf)] = (mx, mn)


def render(md: VmMetadata, image) -> str:
    return (f"<domain type='test'><name>{md.spec.name}</name><uuid>{md.vm_id}</uuid>"
            f"<metadata>{md.to_xml()}</metadata><memory unit='MiB'>{md.spec.memory_mib}</memory>"
            f"<vcpu>{md.spec.vcpus}</vcpu><os><type arch='x86_64'>hvm</type></os></domain>")


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ca")
    subprocess.run(["bash", str(REPO / "tools/make-dev-ca.sh"), str(d)], check=True, capture_output=True)
    return d


def start_hostd(tmp: Path, certs: Path, name: str, *, with_image: bool = True):  # type: ignore[no-untyped-def]
    (tmp / "vmlinuz").write_bytes(b"k")
    images = ImageStore(tmp / "images")
    if with_image:
        images.add("smoke", "1", "kernel", {"kernel": tmp / "vmlinuz"})
    lv = LibvirtHost("test:///default", NS)
    m = VmManager(layout=LAYOUT, siblings={}, ledger=Ledger(tmp / "l.db"), libvirt=lv, images=images,
                  render=render, disk_check=lambda n: [], vf_rates=Rates(), pf_drivers={"ens1f0": "ice"},
                  vf_pci={("ens1f0", 0): "0000:3b:02.0", ("ens1f0", 1): "0000:3b:02.1"})
    server = grpc.server(futures.ThreadPoolExecutor(4))
    pb_grpc.add_HostdServicer_to_server(HostdService(m, host=name, layout_json=LAYOUT.to_json(None),
                                                     health=lambda: pb.HealthResponse(ok=True)), server)
    creds = grpc.ssl_server_credentials([((certs / "hostd.key").read_bytes(), (certs / "hostd.crt").read_bytes())],
                                        root_certificates=(certs / "ca.crt").read_bytes(),
                                        require_client_auth=True)
    port = server.add_secure_port("127.0.0.1:0", creds)
    server.start()
    return server, port, m, lv


@pytest.fixture
def cluster(tmp_path: Path, certs: Path):  # type: ignore[no-untyped-def]
    """Two hostd servers: h1 lacks the image (its CreateVM fails), h2 has it."""
    started = []
    try:
        for name, img in (("h1", False), ("h2", True)):
            d = tmp_path / name
            d.mkdir()
            started.append((name,) + start_hostd(d, certs, name, with_image=img))
        clients = HostdClients(DispatchConfig(ca=str(certs / "ca.crt"), cert=str(certs / "scheduler.crt"),
                                              key=str(certs / "scheduler.key"), timeout_s=10, max_attempts=3))
        with make_client(f"sqlite:///{tmp_path}/s.db", hostd=clients, dispatch={"enabled": True}) as api:
            for name, _srv, port, _m, _lv in started:
                body = {"name": name, "address": f"localhost:{port}", "layout": json.loads(LAYOUT.to_json()),
                        "rack": name}
                assert api.post("/v1/hosts", json=body, headers=HOST).status_code == 201
            yield api, clients, {n: m for n, _s, _p, m, _l in started}
        clients.close()
    finally:
        for _n, srv, _p, m, lv in started:
            srv.stop(0).wait()
            for dom in lv.conn().listAllDomains():
                if dom.name().startswith("t-"):
                    if dom.isActive():
                        dom.destroy()
                    dom.undefine()
            m.ledger.close()
            lv.close()


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
    assert 'hyb_sched_dispatch_total{outcome="failed"} 2.0' in api.get("/metrics").text


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
    assert 'hyb_sched_reconcile_repairs_total{kind="vanished"} 1.0' in api.get("/metrics").text
