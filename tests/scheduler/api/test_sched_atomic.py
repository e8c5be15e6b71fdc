"""A VM disk that asks for an atomic-write unit (issue #41): only a disk whose layout
offers that unit fits, the dry run names why the others do not, and bad values are
refused naming the field. Real store (SQLite; PostgreSQL under the integration mark)."""

from __future__ import annotations

import pytest

from sched_helpers import ADM, HOST, TA, host_body, vm_body
from scheduler.fit import DiskWant, HostView, VmWant, fit_vm
from scheduler.resources import host_from_layout
from scheduler.service.vms import hashed, request_hash
from tools.dev.host_shapes import Shape, make_layout

ONE_DISK = Shape("one-disk", nodes=1, cores_per_node=4, smt=2, io_cores_per_node=1, host_cores=1,
                 pages_2m_per_node=2048, vfs_per_node=0, disks_per_node=1)
VIRTIO = "device unit 16384 B, but no path carries it to the guest: virtio-blk does not tell the guest an atomic unit"


def _body(name: str, offered: int, unit: int = 16384, note: str = "") -> dict:
    body = host_body(name, ONE_DISK)
    for d in body["layout"]["disks"]:
        d.update(atomic_unit_bytes=unit, atomic_write_bytes=offered,
                 atomic_note=note or (f"{offered} B through vfio-nvme" if offered else VIRTIO))
    return body


def _register(api, body: dict) -> None:  # type: ignore[no-untyped-def]
    r = api.post("/v1/hosts", json=body, headers=HOST)
    assert r.status_code in (200, 201), r.text


def _disk(atomic: object) -> list[dict]:
    return [{"class": "nvme", "atomic_write_bytes": atomic, "iotune": {"total_bytes_sec": 10**8}}]


def _dry(api, key: str, atomic: int):  # type: ignore[no-untyped-def]
    return api.post("/v1/vms?dry_run=true", json=vm_body(disks=_disk(atomic)), headers=TA | {"Idempotency-Key": key})


def test_only_the_atomic_disk_fits_and_the_dry_run_says_why(api):
    _register(api, _body("h-virtio", 0))
    _register(api, _body("h-small", 4096, unit=4096))
    _register(api, _body("h-atomic", 16384))
    disk = api.get("/v1/hosts/h-virtio", headers=ADM).json()["disks"][0]
    assert (disk["atomic_write_bytes"], disk["atomic_note"]) == (0, VIRTIO)
    p = _dry(api, "a1", 16384).json()
    assert p["fits"] and p["host"] == "h-atomic" and p["placement"]["disks"][0]["name"] == "nvme0n1"
    why = {x["host"]: x["reason"] for x in p["rejected_hosts"]}
    assert why["h-virtio"] == f"node 0: disks[0]: nvme0n1 is not offered as atomic ({VIRTIO})"
    assert why["h-small"] == "node 0: disks[0]: nvme0n1 guarantees 4096 B atomic writes, 16384 B wanted"
    assert p["rejections"] == {"disks": 2}
    # nothing offers 64 KiB: no host fits, and a create is refused with the same counts
    p = _dry(api, "a2", 65536).json()
    assert p["fits"] is False and p["rejections"] == {"disks": 3}
    r = api.post("/v1/vms", json=vm_body(disks=_disk(65536)),
                 headers=TA | {"Idempotency-Key": "a3"})
    assert r.status_code == 507 and r.json()["error"]["rejections"] == {"disks": 3}
    # a real create takes the atomic host's disk and keeps the ask in the stored request
    r = api.post("/v1/vms", json=vm_body(disks=_disk(16384)),
                 headers=TA | {"Idempotency-Key": "a4"})
    assert r.status_code == 202 and r.json()["host"] == "h-atomic", r.text
    # and with that disk taken, the next atomic ask has nowhere to go
    assert _dry(api, "a5", 16384).json()["fits"] is False
    # no atomic ask: any disk does
    assert _dry(api, "a6", 0).json()["fits"] is True


@pytest.mark.parametrize("value", [12288, 256, 2 << 20, -1, "16k"])
def test_bad_atomic_values_name_the_field(api, value):  # type: ignore[no-untyped-def]
    _register(api, _body("h-atomic", 16384))
    r = api.post("/v1/vms", json=vm_body(disks=_disk(value)),
                 headers=TA | {"Idempotency-Key": "bad"})
    assert r.status_code == 422, r.text
    assert "atomic_write_bytes" in r.text
    assert api.get("/v1/vms", headers=TA).json()["items"] == []  # nothing changed


def test_a_request_without_the_ask_hashes_as_before() -> None:
    """Idempotency keys recorded before the field existed still replay."""
    old = {"name": "w", "disks": [{"disk": "", "class": "nvme", "min_size_bytes": 0, "iotune": {}}]}
    new = {"name": "w", "disks": [{"disk": "", "class": "nvme", "min_size_bytes": 0, "iotune": {},
                                   "atomic_write_bytes": 0}]}
    assert request_hash(hashed(new)) == request_hash(hashed(old))
    asked = {**new, "disks": [{**new["disks"][0], "atomic_write_bytes": 16384}]}
    assert request_hash(hashed(asked)) != request_hash(hashed(old))


def test_fit_named_disk_without_the_unit() -> None:
    layout, sib = make_layout(ONE_DISK)
    h = HostView(host_from_layout("h", layout, siblings=sib))
    res = fit_vm([h], VmWant(1, 1024, disks=(DiskWant(disk="nvme0n1", bytes_sec=10**8, atomic_write_bytes=4096),)), explain=True)
    assert not res.candidates
    assert res.rejections[0].reason == "node 0: disks[0]: nvme0n1 is not offered as atomic (no atomic-write unit)"


def test_a_layout_offering_more_than_its_unit_is_refused_at_registration(api):
    body = _body("h-liar", 32768, unit=16384)
    r = api.post("/v1/hosts", json=body, headers=HOST)
    assert r.status_code == 422, r.text
    assert "layout.disks[0].atomic_write_bytes" in r.text
    assert api.get("/v1/hosts", headers=ADM).json()["items"] == []
