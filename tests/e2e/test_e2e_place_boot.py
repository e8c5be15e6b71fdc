"""End to end on this machine: `scheduler serve` (SQLite) + `hostd serve` (libvirtd +
QEMU/TCG, mTLS gRPC). hostd registers its carve layout with the scheduler; a VM
POSTed to /v1/vms is placed, dispatched, boots the smoke guest (marker on its serial
log) with its vCPU pinned and its loop disk throttled; DELETE frees everything.

What this machine cannot show: a second host, SR-IOV VFs, more than one NUMA node
(covered by recorded trees and in-process hostd servers elsewhere)."""

from __future__ import annotations

import os
import ssl
import time
from pathlib import Path

import httpx
import libvirt
import pytest

from tools.dev.fleetsim import write_scheduler_config
from tools.dev.procs import Hostd, Scheduler, free_port, hostd_workdir, write_hostd_config

pytestmark = [pytest.mark.root, pytest.mark.integration, pytest.mark.slow]
PAGES = 128
ADMIN, HOST_TOKEN = "e2e-admin-token", "e2e-host-token"


@pytest.fixture
def stack(tmp_path: Path, libvirtd: str, smoke_guest, hugepages_2m, loop_disk: Path):
    hugepages_2m(PAGES)
    certs = hostd_workdir(tmp_path, smoke_guest, pages=PAGES, disk=loop_disk.name)
    sport, hport = free_port(), free_port()
    write_scheduler_config(tmp_path / "scheduler.toml", port=sport, certs=certs, db=tmp_path / "scheduler.db",
                           admin_token=ADMIN, host_token=HOST_TOKEN, log_level="INFO",
                           extra="[reconcile]\ninterval_s = 2\n")

    (tmp_path / "token").write_text(HOST_TOKEN)
    write_hostd_config(tmp_path / "hostd.toml", policy=tmp_path / "policy.toml", state=tmp_path / "state",
                       images=tmp_path / "images", certs=certs, libvirt_uri=libvirtd,
                       listen=f"127.0.0.1:{hport}", scheduler_url=f"https://127.0.0.1:{sport}",
                       scheduler_ca=certs / "ca.crt",
                       scheduler_token_file=tmp_path / "token", host_name="e2e-host",
                       advertise_address=f"localhost:{hport}", heartbeat_s=1, rack="r1",
                       heartbeat_stats=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOSTD_", "HYB_SCHED_"))}
    sched = Scheduler(tmp_path / "scheduler.toml", sport, env, tmp_path / "scheduler.log", ca=certs / "ca.crt")
    hostd = Hostd(tmp_path / "hostd.toml", env, tmp_path / "hostd.log")
    try:
        sched.start()
        hostd.start()
        yield {"url": sched.url, "ca": certs / "ca.crt", "disk": loop_disk.name, "state": tmp_path / "state", "hostd": hostd,
               "sched": sched}
    finally:
        hostd.stop()
        sched.stop()


def wait(fn, what: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def test_post_boot_get_delete(stack):
    with httpx.Client(base_url=stack["url"], headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30,
                      verify=ssl.create_default_context(cafile=str(stack["ca"]))) as api:
        host = wait(lambda: (r := api.get("/v1/hosts/e2e-host")).status_code == 200 and r.json(),
                    "hostd registration", 30)
        assert host["state"] == "active"
        body = {"name": "hyb-test-e2e", "vcpus": 1, "memory_mib": 256, "image": "smoke",
                "disks": [{"disk": stack["disk"], "iotune": {"total_bytes_sec": 8 * 2**20, "total_iops_sec": 300}}]}
        r = api.post("/v1/vms", json=body, headers={"Idempotency-Key": "e2e-1"})
        assert r.status_code in (201, 202), r.text
        vm_id = r.json()["id"]
        again = api.post("/v1/vms", json=body, headers={"Idempotency-Key": "e2e-1"})
        assert again.status_code in (200, 201, 202) and again.json()["id"] == vm_id

        vm = wait(lambda: (v := api.get(f"/v1/vms/{vm_id}").json())["status"] in ("running", "failed") and v,
                  "VM running")
        assert vm["status"] == "running", vm
        assert vm["host"] == "e2e-host" and vm["placement"]["nodes"] == [0] and vm["hostd_vm_id"]
        assert vm["placement"]["cpus"] == [1]
        assert vm["placement"]["hugepages"] == [{"node": 0, "size_kb": 2048, "count": 128}]
        dom_name = f"hyb-test-e2e-{vm_id[:8]}"  # the scheduler names domains <name>-<id prefix>
        log = stack["state"] / "vms" / dom_name / "console.log"
        wait(lambda: log.exists() and "HYB-SMOKE-OK" in log.read_text(errors="replace"), "guest marker", 300)

        c = libvirt.open("qemu:///system")
        try:
            dom = c.lookupByName(dom_name)
            assert list(dom.vcpuPinInfo(0)) == [(False, True)]
        finally:
            c.close()

        # Capacity is gone on the host: a second 1-vCPU VM is refused with the reason.
        r2 = api.post("/v1/vms", json=body | {"name": "hyb-test-e2e-2", "disks": []},
                      headers={"Idempotency-Key": "e2e-2"})
        assert r2.status_code == 507, r2.text
        assert "cpu" in r2.text.lower()

        # hostd's heartbeats carry its IO-health signal; the scheduler keeps it per host
        hist = wait(lambda: (h := api.get("/v1/hosts/e2e-host/stats").json())["items"] and h, "host stats", 30)
        last = hist["items"][-1]
        assert last["heartbeats"] >= 1 and last["samples"] >= 1 and last["cpu_vms"] > 0  # the TCG guest burns CPU

        assert api.delete(f"/v1/vms/{vm_id}").status_code == 204
        wait(lambda: api.get(f"/v1/vms/{vm_id}").status_code == 404, "VM deleted", 60)
        c = libvirt.open("qemu:///system")
        try:
            assert [d.name() for d in c.listAllDomains() if d.name().startswith("hyb-test-")] == []
        finally:
            c.close()
        free = api.get("/v1/hosts/e2e-host").json()
        assert free["nodes"][0]["used_cpus"] == [], free
