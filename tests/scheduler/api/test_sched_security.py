"""Hosts are not taken on trust: a host principal acts only for the hosts it registered
(or the one its token is bound to), a layout is checked as a whole before it is stored,
and a re-registration that would take resources from running VMs is refused. Each
attack below was tried against the API before this check existed and succeeded.
TestClient over a real store (SQLite; PostgreSQL under the integration marker)."""

from __future__ import annotations

import copy

import pytest
from sqlalchemy import select

from tools.dev.host_shapes import Shape
from sched_helpers import ADM, HOST, TA, TB, Clock, auth, host_body, make_client, vm_body
from scheduler.db.models import Audit
from scheduler.errors import HostNotYours
from scheduler.schemas.hosts import HostRegister

SMALL = Shape("small", nodes=2, cores_per_node=4, smt=2, io_cores_per_node=1, host_cores=1,
              pages_2m_per_node=2048, vfs_per_node=2, pf_mbps=10000, disks_per_node=1)
HOST2, OSS1 = auth("hst2"), auth("oss1")


@pytest.fixture
def api(db_url):  # type: ignore[no-untyped-def]
    with make_client(db_url, clock=Clock()) as c:
        yield c


def audit(api, action: str) -> list[Audit]:  # type: ignore[no-untyped-def]
    with api.app.state.store.read() as s:
        return list(s.scalars(select(Audit).where(Audit.action == action)).all())


def test_a_host_token_cannot_take_over_another_host(api) -> None:
    assert api.post("/v1/hosts", json=host_body("oss-1", SMALL, rack="r1"), headers=HOST).status_code == 201
    evil = host_body("oss-1", SMALL, rack="evil", address="10.66.66.66:7443")
    r = api.post("/v1/hosts", json=evil, headers=HOST2)
    assert r.status_code == 403 and r.json()["error"]["code"] == "hyb.host.not_yours", r.text
    assert r.json()["error"]["field"] == "name"
    h = api.get("/v1/hosts/oss-1", headers=ADM).json()
    assert (h["address"], h["rack"]) == ("oss-1:7443", "r1")  # unchanged
    hb = api.post("/v1/hosts/oss-1/heartbeat", headers=HOST2)
    assert hb.status_code == 403 and hb.json()["error"]["code"] == "hyb.host.not_yours"
    denied = audit(api, "host.register.denied") + audit(api, "host.heartbeat.denied")
    assert [(a.principal, a.target) for a in denied] == [("hst2", "oss-1"), ("hst2", "oss-1")]
    assert denied[0].detail["address"] == "10.66.66.66:7443"
    # its registrar still can, and an admin may
    assert api.post("/v1/hosts/oss-1/heartbeat", headers=HOST).status_code == 200
    assert api.post("/v1/hosts", json=host_body("oss-1", SMALL, rack="r2"), headers=ADM).status_code == 200


def test_the_host_service_takes_no_default_caller(api) -> None:
    """Who calls is a required keyword of every host write: a caller that forgets it gets a
    TypeError, not an admin's rights (the heartbeat defaulted to ``admin=True``, so a beat
    for a host another principal registered went through)."""
    assert api.post("/v1/hosts", json=host_body("oss-1", SMALL), headers=HOST).status_code == 201
    svc = api.app.state.hosts
    with pytest.raises(TypeError):
        svc.heartbeat("oss-1", actor="hst2")
    with pytest.raises(TypeError):
        svc.register(HostRegister(**host_body("oss-1", SMALL)), actor="hst2")
    with pytest.raises(HostNotYours):
        svc.heartbeat("oss-1", actor="hst2", admin=False, bound_host=None)
    with pytest.raises(HostNotYours):
        svc.heartbeat("oss-1", actor="hst", admin=False, bound_host="oss-2")
    assert svc.heartbeat("oss-1", actor="hst", admin=False, bound_host=None).name == "oss-1"
    assert [a.principal for a in audit(api, "host.heartbeat.denied")] == ["hst2", "hst"]


def test_a_bound_token_acts_only_as_its_host(api) -> None:
    assert api.post("/v1/hosts", json=host_body("oss-2", SMALL), headers=OSS1).status_code == 403
    assert audit(api, "host.register.denied")[0].principal == "oss1"
    assert api.post("/v1/hosts", json=host_body("oss-1", SMALL), headers=OSS1).status_code == 201
    assert api.post("/v1/hosts/oss-1/heartbeat", headers=OSS1).status_code == 200
    assert api.get("/v1/hosts/oss-1", headers=OSS1).status_code == 200  # reads, like any host token


def _lie(path: str, value):  # type: ignore[no-untyped-def]
    """The SMALL host's registration with one layout value replaced."""
    body = host_body("liar", SMALL)
    node = body["layout"]
    *keys, last = path.split(".")
    for k in keys:
        node = node[int(k)] if k.isdigit() else node[k]
    node[int(last) if last.isdigit() else last] = value(copy.deepcopy(node[int(last) if last.isdigit() else last]))
    return body


@pytest.mark.parametrize("path, value, field", [
    ("nodes.0.vm_cpus", lambda v: v + [0], "layout.nodes[0].vm_cpus"),  # an IO-service CPU handed to VMs
    ("nodes.0.hugepages.0.count", lambda v: -5, "layout.nodes[0].hugepages[0].count"),
    ("nodes.0.hugepages.0.count", lambda v: 10**18, "layout.nodes[0].hugepages[0].count"),
    ("nodes.0.vm_cpus", lambda v: [-1] + v, "layout.nodes[0].vm_cpus"),
    ("nodes.1.vm_cpus", lambda v: v + [2], "layout.nodes[1].vm_cpus"),  # CPU 2 is node 0's
    ("pfs.0.bandwidth_mbps", lambda v: -1000, "layout.pfs[0].bandwidth_mbps"),
    ("nodes.1.node", lambda v: 0, "layout.nodes[1].node"),
    ("pfs.0.slots.0.index", lambda v: 99, "layout.pfs[0].slots[0].index"),
])
def test_a_lying_layout_is_refused_naming_the_field(api, path, value, field) -> None:
    r = api.post("/v1/hosts", json=_lie(path, value), headers=HOST)
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["code"] == "hyb.host.bad_layout" and err["field"] == field, err
    assert api.get("/v1/hosts/liar", headers=ADM).status_code == 404


def test_a_shrink_under_running_vms_is_refused_and_changes_nothing(api) -> None:
    assert api.post("/v1/hosts", json=host_body("h1", SMALL), headers=HOST).status_code == 201
    vm = api.post("/v1/vms", json=vm_body(vcpus=3, memory_mib=2048), headers=TA | {"Idempotency-Key": "k1"})
    assert vm.status_code == 202, vm.text
    before = api.get("/v1/hosts/h1", headers=ADM).json()
    small = host_body("h1", SMALL)
    small["layout"]["nodes"][0]["vm_cpus"] = [11]
    small["layout"]["nodes"][0]["hugepages"][0]["count"] = 16
    r = api.post("/v1/hosts", json=small, headers=HOST)
    assert r.status_code == 409 and r.json()["error"]["code"] == "hyb.host.layout_shrink", r.text
    msg = r.json()["error"]["message"]
    assert "allocated CPUs [2, 3, 10] are no longer VM CPUs" in msg
    assert "node 0 would have 16 2048 kB pages, 1024 allocated" in msg
    assert api.get("/v1/hosts/h1", headers=ADM).json() == before
    # growing is fine
    bigger = host_body("h1", SMALL)
    bigger["layout"]["nodes"][0]["hugepages"][0]["count"] += 100
    assert api.post("/v1/hosts", json=bigger, headers=HOST).status_code == 200


@pytest.mark.parametrize("field, value", [("vcpus", True), ("vcpus", "2"), ("vcpus", 2.0), ("memory_mib", "1024"),
                                          ("guest_numa", "yes"), ("guest_numa", 1)])
def test_vm_fields_are_not_coerced(api, field, value) -> None:
    r = api.post("/v1/vms", json=vm_body(**{field: value}), headers=TA | {"Idempotency-Key": "c1"})
    assert r.status_code == 422 and r.json()["error"]["field"] == field, r.text


def test_host_fields_are_not_coerced(api) -> None:
    body = host_body("h1", SMALL)
    body["cpu_siblings"]["2"] = ["10", 2]
    r = api.post("/v1/hosts", json=body, headers=HOST)
    assert r.status_code == 422 and r.json()["error"]["field"].startswith("cpu_siblings"), r.text


def test_the_contract_says_what_the_server_enforces(api) -> None:
    spec = api.app.openapi()
    key = next(p for p in spec["paths"]["/v1/vms"]["post"]["parameters"] if p["name"] == "idempotency-key")
    assert key["required"] is True
    r = api.post("/v1/vms?dry_run=true", json=vm_body(), headers=TA)  # a dry run needs one too
    assert r.status_code == 422 and r.json()["error"]["field"] == "Idempotency-Key"
    io = spec["components"]["schemas"]["IoLimitsUpdate"]
    assert io["anyOf"] and api.patch("/v1/vms/x/io-limits", json={}, headers=ADM).status_code == 422
    r = api.put("/v1/hosts", json={}, headers=ADM)
    assert r.status_code == 405 and "POST" in r.headers["allow"]


def test_the_audit_trail_is_readable_and_a_tenant_sees_only_its_own(api) -> None:
    assert api.post("/v1/hosts", json=host_body("h1", SMALL), headers=HOST).status_code == 201
    a = api.post("/v1/vms", json=vm_body(name="a-1"), headers=TA | {"Idempotency-Key": "a1"}).json()
    b = api.post("/v1/vms", json=vm_body(name="b-1"), headers=TB | {"Idempotency-Key": "b1"}).json()
    assert api.delete(f"/v1/vms/{b['id']}", headers=TB).status_code == 204
    # a refused call is audited too: tenant a trying to create for tenant b
    r = api.post("/v1/vms", json=vm_body(name="x", tenant="b"), headers=TA | {"Idempotency-Key": "x"})
    assert r.status_code == 403
    everything = api.get("/v1/audit", headers=ADM).json()["items"]
    assert [(x["action"], x["target"]) for x in everything][:4] == [
        ("auth.denied", "/v1/vms"), ("vm.delete", b["id"]), ("vm.create", b["id"]), ("vm.create", a["id"])]
    mine = api.get("/v1/audit", headers=TA).json()["items"]
    assert [(x["action"], x["target"]) for x in mine] == [("auth.denied", "/v1/vms"), ("vm.create", a["id"])]
    theirs = api.get("/v1/audit", headers=TB).json()["items"]
    assert {x["target"] for x in theirs} == {b["id"]}
    assert api.get("/v1/audit", headers=HOST).status_code == 403
    # filters and pages
    creates = api.get("/v1/audit?action=vm.create", headers=ADM).json()["items"]
    assert [x["target"] for x in creates] == [b["id"], a["id"]]
    assert [x["action"] for x in api.get("/v1/audit?action=vm.", headers=ADM).json()["items"]] == \
        ["vm.delete", "vm.create", "vm.create"]
    page = api.get("/v1/audit?limit=2", headers=ADM).json()
    rest = api.get(f"/v1/audit?limit=100&before={page['next']}", headers=ADM).json()
    now = api.get("/v1/audit", headers=ADM).json()["items"]
    assert now[0]["action"] == "auth.denied" and now[0]["principal"] == "hst"  # the host's refused read
    assert [x["id"] for x in page["items"] + rest["items"]] == [x["id"] for x in now]
    assert api.get("/v1/audit?principal=tb", headers=ADM).json()["items"][0]["action"] == "vm.delete"
    assert api.get("/v1/audit?since=1e12", headers=ADM).json()["items"] == []
