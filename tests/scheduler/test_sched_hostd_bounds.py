"""The scheduler and hostd agree on the bounds of what reaches hostd (api/bounds.py):
a request the scheduler takes is one hostd serves, and what hostd would refuse the
scheduler refuses first (422, naming the field, nothing stored). A real hostd gRPC
server in-process over libvirt's test driver, as tests/scheduler/test_sched_dispatch.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sched_helpers import HOST, TA, host_body, make_client, vm_body

from api import bounds
from api.states import VmStatus
from scheduler.config import DispatchConfig
from scheduler.dispatch import HostdClients
from tools.dev.hostd_inproc import LAYOUT, dev_certs, start_hostd


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    return dev_certs(tmp_path_factory.mktemp("ca"))


@pytest.fixture
def cluster(tmp_path: Path, certs: Path):  # type: ignore[no-untyped-def]
    h = start_hostd(tmp_path, certs, "h1", workers=4)
    clients = HostdClients(DispatchConfig(ca=str(certs / "ca.crt"), cert=str(certs / "scheduler.crt"),
                                          key=str(certs / "scheduler.key"), timeout_s=10, max_attempts=1))
    try:
        with make_client(f"sqlite:///{tmp_path}/s.db", hostd=clients, dispatch={"enabled": True}) as api:
            body = {"name": "h1", "address": f"localhost:{h.port}", "layout": json.loads(LAYOUT.to_json())}
            assert api.post("/v1/hosts", json=body, headers=HOST).status_code == 201
            yield api, h.manager
    finally:
        clients.close()
        h.stop("b")


def test_a_request_at_the_scheduler_s_bounds_is_served_by_hostd(cluster) -> None:  # type: ignore[no-untyped-def]
    api, manager = cluster
    per = bounds.USER_LABELS_BYTES_MAX // bounds.USER_LABELS_MAX - 3  # keys "k00".."k31"
    labels = {f"k{i:02d}": "v" * per for i in range(bounds.USER_LABELS_MAX)}
    tune = {"total_bytes_sec": 10**8, "total_bytes_sec_max": bounds.IOTUNE_VALUE_MAX // 10,
            "total_bytes_sec_max_length": 10, "total_iops_sec": 1000, "group_name": "g" * 64}
    body = vm_body("b" * 48, vcpus=1, memory_mib=128, labels=labels, disks=[{"disk": "nvme0n1", "iotune": tune}])
    r = api.post("/v1/vms", json=body, headers=TA | {"Idempotency-Key": "edge"})
    assert r.status_code == 202, r.text
    vm = api.get(f"/v1/vms/{r.json()['id']}", headers=TA).json()
    assert vm["status"] == VmStatus.RUNNING, vm
    remote = manager.get(vm["hostd_vm_id"])
    assert remote.name.startswith("b" * 48 + "-") and remote.spec["labels"]["k31"] == "v" * per


@pytest.mark.parametrize("change, field", [
    ({"labels": {"k": "v" * 256}}, "labels"),
    ({"labels": {"bad key": "v"}}, "labels"),
    ({"labels": {f"k{i:02d}": "v" * 130 for i in range(30)}}, "labels"),  # 3,990 bytes: no room for hostd's own
    ({"image": "Smoke:1"}, "image"),
    ({"profile": "a b"}, "profile"),
    ({"disks": [{"disk": "nvme0n1", "iotune": {"total_bytes_sec_max": 10**8}}]},
     "disks[0].iotune.total_bytes_sec_max"),  # QEMU refuses a burst without its base
    ({"disks": [{"disk": "nvme0n1", "iotune": {"total_bytes_sec": 10**15 + 1}}]}, "disks[0].iotune.total_bytes_sec"),
], ids=["value", "key", "bytes", "image", "profile", "burst-without-base", "past-qemu"])
def test_what_hostd_would_refuse_the_scheduler_refuses_first(cluster, change: dict, field: str) -> None:  # type: ignore[no-untyped-def]
    api, manager = cluster
    r = api.post("/v1/vms", json=vm_body("b1", vcpus=1, memory_mib=128, **change),
                 headers=TA | {"Idempotency-Key": "out"})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "hyb.request.invalid" and r.json()["error"]["field"] == field, r.text
    assert api.get("/v1/vms", headers=TA).json()["items"] == [] and manager.ledger.list() == []


def test_io_limits_hostd_would_refuse_are_refused_first(cluster) -> None:  # type: ignore[no-untyped-def]
    api, _ = cluster
    r = api.post("/v1/vms", json=vm_body("b2", vcpus=1, memory_mib=128, disks=[
        {"disk": "nvme0n1", "iotune": {"total_bytes_sec": 10**8, "total_iops_sec": 100}}]),
        headers=TA | {"Idempotency-Key": "io"})
    assert r.status_code == 202, r.text
    r = api.patch(f"/v1/vms/{r.json()['id']}/io-limits", headers=TA,
                  json={"disks": [{"disk": "nvme0n1", "iotune": {"total_iops_sec_max": 200}}]})
    assert r.status_code == 422 and r.json()["error"]["field"] == "disks[0].iotune.total_iops_sec_max", r.text


@pytest.mark.parametrize("labels, ok", [
    ({f"k{i}": "v" for i in range(32)}, True),
    ({"rack-role": "x" * 255}, True),
    ({"k": "x" * 256}, False),
    ({"bad key": "v"}, False),
    ({"k": "tab\there"}, False),
])
def test_host_labels_hostd_starts_with_are_the_ones_the_scheduler_registers(tmp_path: Path, labels: dict,
                                                                            ok: bool) -> None:
    """The reverse direction: a hostd config's labels go to the scheduler's registration."""
    from hostd.config import load_config
    from hostd.errors import ConfigError
    from scheduler.schemas.hosts import HostRegister
    from tools.dev.procs import toml_value

    cfg = tmp_path / "hostd.toml"
    cfg.write_text("[labels]\n" + "".join(f"{json.dumps(k)} = {toml_value(v)}\n" for k, v in labels.items()))
    try:
        load_config(cfg)
        hostd_ok = True
    except ConfigError as e:
        hostd_ok = False
        assert e.field == "labels"
    try:
        HostRegister.model_validate(host_body("h9") | {"labels": labels})
        scheduler_ok = True
    except ValueError:
        scheduler_ok = False
    assert hostd_ok == scheduler_ok == ok
