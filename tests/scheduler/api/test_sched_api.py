"""REST API in-process (TestClient) over a real store: SQLite, and PostgreSQL (integration)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from api.states import HostState, VmStatus
from tools.dev.host_shapes import Shape
from sched_helpers import ADM, HOST, ONE_G, PLAIN, TA, TB, auth, host_body, vm_body

REPO = Path(__file__).resolve().parents[3]
SMALL = Shape("small", nodes=2, cores_per_node=4, smt=2, io_cores_per_node=1, host_cores=1,
              pages_2m_per_node=2048, vfs_per_node=2, pf_mbps=10000, disks_per_node=1)


def register(api, name, shape=SMALL, **kw):  # type: ignore[no-untyped-def]
    r = api.post("/v1/hosts", json=host_body(name, shape, **kw), headers=HOST)
    assert r.status_code in (200, 201), r.text
    return r.json()


def create(api, key, headers=TA, **kw):  # type: ignore[no-untyped-def]
    return api.post("/v1/vms", json=vm_body(**kw), headers=headers | {"Idempotency-Key": key})


def test_register_list_and_free_used(api):
    h = register(api, "h1", rack="r1", disk="nvme")
    assert h["state"] == "active" and [n["free_cpus"] for n in h["nodes"]] == [4, 6]
    assert h["nodes"][0]["vm_cpus"] == [2, 3, 10, 11]  # IO core (0,8) and host core (1,9) excluded
    assert api.post("/v1/hosts", json=host_body("h1", SMALL, rack="r1", disk="nvme"),
                    headers=HOST).status_code == 200
    r = create(api, "k1", vcpus=3, memory_mib=2048)
    assert r.status_code == 202, r.text
    vm = r.json()
    assert vm["status"] == "pending" and vm["host"] == "h1" and vm["tenant"] == "a"
    assert vm["placement"]["nodes"] == [0] and sorted(vm["placement"]["cpus"]) == [2, 3, 10]
    # the create path builds its JSON by hand; it must be what GET (through the models) says
    assert api.get(f"/v1/vms/{vm['id']}", headers=TA).json() == vm
    vf = create(api, "k-vf", vcpus=1, memory_mib=2048, vfs=[{"max_tx_rate_mbps": 100}],
                disks=[{"class": "nvme", "iotune": {"total_bytes_sec": 10**6, "total_iops_sec": 100}}])
    assert vf.status_code == 202, vf.text
    assert vf.json()["placement"]["vfs"] and vf.json()["placement"]["disks"]
    assert api.get(f"/v1/vms/{vf.json()['id']}", headers=TA).json() == vf.json()
    assert api.delete(f"/v1/vms/{vf.json()['id']}", headers=TA).status_code == 204
    h = api.get("/v1/hosts/h1", headers=ADM).json()
    assert h["nodes"][0]["free_cpus"] == 1 and h["nodes"][0]["hugepages"][0]["used"] == 1024
    assert h["vms"] == 1 and h["generation"] == 4
    assert [x["name"] for x in api.get("/v1/hosts", headers=ADM).json()["items"]] == ["h1"]


def test_idempotency_key_replay_and_mismatch(api):
    register(api, "h1")
    a = create(api, "same")
    b = create(api, "same")
    assert a.status_code == 202 and b.status_code == 200 and a.json()["id"] == b.json()["id"]
    c = create(api, "same", vcpus=4)
    assert c.status_code == 409 and c.json()["error"]["code"] == "hyb.idempotency.mismatch"
    assert c.json()["error"]["field"] == "Idempotency-Key"
    # the same key in another tenant is another VM
    d = create(api, "same", headers=TB)
    assert d.status_code == 202 and d.json()["id"] != a.json()["id"]
    missing = api.post("/v1/vms", json=vm_body(), headers=TA)
    assert missing.status_code == 422 and missing.json()["error"]["field"] == "Idempotency-Key"
    # a key recorded by a scheduler before the orjson hash (json.dumps spacing) still replays
    from scheduler.db.models import Vm
    from scheduler.service.vms import LATER_DEFAULTS, request_hash, request_hash_v1
    with api.app.state.store.write() as s:
        row = s.get(Vm, a.json()["id"])
        # the fields added later, at their defaults, hash as before they existed
        before = {k: v for k, v in row.request.items() if k not in LATER_DEFAULTS}
        assert row.request["on_maintenance"] == "block" and row.request["disruption_budget"] is None
        assert row.request_hash == request_hash(before) != request_hash_v1(before)
        row.request_hash = request_hash_v1(before)
    assert create(api, "same").json()["id"] == a.json()["id"]
    assert create(api, "same", vcpus=4).status_code == 409
    assert create(api, "same", on_maintenance="replace").status_code == 409


def test_the_fleet_default_on_maintenance_is_recorded_with_a_vm_that_does_not_say(db_url, clock):
    """``drain.on_maintenance``: a request without the field gets the fleet's default in
    its stored request; a replay of the same key and body is the same VM; a request that
    says is kept as it says."""
    from sched_helpers import make_client, settings
    with make_client(db_url, clock=clock, drain={"on_maintenance": "migrate"}) as api:
        assert api.post("/v1/hosts", json=host_body("h1"), headers=HOST).status_code == 201
        a = api.post("/v1/vms", json=vm_body("a"), headers=TA | {"Idempotency-Key": "k-a"})
        assert a.status_code == 202 and a.json()["request"]["on_maintenance"] == "migrate"
        again = api.post("/v1/vms", json=vm_body("a"), headers=TA | {"Idempotency-Key": "k-a"})
        assert again.status_code == 200 and again.json()["id"] == a.json()["id"]
        b = api.post("/v1/vms", json=vm_body("b", on_maintenance="stop"), headers=TA | {"Idempotency-Key": "k-b"})
        assert b.json()["request"]["on_maintenance"] == "stop"
    with pytest.raises(ValueError, match="drain.on_maintenance"):  # a bad default: the scheduler does not start
        settings(db_url, drain={"on_maintenance": "teleport"})


def test_bad_input_names_the_field(api):
    cases = [
        (vm_body(vcpus=0), "vcpus"),
        (vm_body(memory_mib=1025), "memory_mib"),
        (vm_body(vfs=[{"min_tx_rate_mbps": 5, "max_tx_rate_mbps": 1}]), "vfs[0].min_tx_rate_mbps"),
        (vm_body(vfs=[{"vlan": 5000}]), "vfs[0].vlan"),
        (vm_body(disks=[{}]), "disks[0]"),
        (vm_body(name="bad name"), "name"),
        (vm_body(page_size_kb=4), "page_size_kb"),
        ({**vm_body(), "surprise": 1}, "surprise"),
    ]
    for body, field in cases:
        r = api.post("/v1/vms", json=body, headers=TA | {"Idempotency-Key": "x"})
        assert r.status_code == 422, (body, r.text)
        err = r.json()["error"]
        assert err["code"] == "hyb.request.invalid" and err["field"] == field, (field, err)
    # the create route reads its query, header and body itself (routes/vms.create_inputs)
    raw = [(dict(content=b"{not json", headers={"Content-Type": "application/json"}), "body", "Invalid JSON"),
           (dict(content=b""), "body", "Invalid JSON"),
           (dict(content=b"{}", headers={"Content-Type": "text/plain"}), "body", "send the VM as JSON"),
           (dict(json=[1]), "body", "Input should be an object"),
           (dict(json=vm_body(), params={"dry_run": "maybe"}), "dry_run", "valid boolean"),
           (dict(json=vm_body(), headers={"Idempotency-Key": "a b"}), "Idempotency-Key", "should match pattern")]
    for kw, field, msg in raw:
        headers = TA | {"Idempotency-Key": "x"} | kw.pop("headers", {})
        r = api.post("/v1/vms", headers=headers, **kw)
        err = r.json()["error"]
        assert r.status_code == 422 and err["field"] == field and msg in err["message"], (kw, r.text)
    assert api.post("/v1/vms", json=vm_body(vcpus=0), headers={"Idempotency-Key": "x"}).status_code == 401
    bad = host_body("h9")
    bad["layout"]["nodes"][0]["vm_cpus"] = "nope"
    r = api.post("/v1/hosts", json=bad, headers=HOST)
    assert r.status_code == 422 and r.json()["error"]["code"] == "hyb.host.bad_layout"
    assert api.get("/v1/vms", headers=ADM).json()["items"] == []  # nothing half-created


def test_auth_scopes_and_tenant_isolation(api):
    register(api, "h1")
    assert api.get("/v1/vms").status_code == 401
    assert api.get("/v1/vms", headers=auth("nope")).json()["error"]["code"] == "hyb.auth.missing"
    assert api.post("/v1/hosts", json=host_body("h2"), headers=TA).status_code == 403
    assert api.post("/v1/hosts/h1/cordon", headers=HOST).status_code == 403
    assert api.post("/v1/vms", json=vm_body(), headers=HOST | {"Idempotency-Key": "k"}).status_code == 403
    a = create(api, "k1").json()
    b = create(api, "k2", headers=TB, name="db-1").json()
    assert [v["id"] for v in api.get("/v1/vms", headers=TA).json()["items"]] == [a["id"]]
    assert api.get(f"/v1/vms/{b['id']}", headers=TA).status_code == 404
    assert api.delete(f"/v1/vms/{b['id']}", headers=TA).status_code == 404
    assert {v["tenant"] for v in api.get("/v1/vms", headers=ADM).json()["items"]} == {"a", "b"}
    assert api.get("/v1/vms?tenant=b", headers=TA).json()["items"][0]["id"] == a["id"]  # filter ignored
    r = api.post("/v1/vms", json=vm_body(tenant="b"), headers=TA | {"Idempotency-Key": "k3"})
    assert r.status_code == 403 and r.json()["error"]["field"] == "tenant"


def test_dry_run_preview_counts_rejections(api):
    register(api, "h1", rack="r1")
    register(api, "h2", Shape("nopages", nodes=1, cores_per_node=4, smt=1, io_cores_per_node=1, host_cores=0,
                              pages_2m_per_node=16, vfs_per_node=0, disks_per_node=0))
    register(api, "h3", Shape("tiny", nodes=1, cores_per_node=2, smt=1, io_cores_per_node=1, host_cores=0,
                              vfs_per_node=0, disks_per_node=0))
    api.post("/v1/hosts/h1/cordon", headers=ADM)
    r = api.post("/v1/vms?dry_run=true", json=vm_body(vcpus=2, memory_mib=1024), headers=TA | {"Idempotency-Key": "p1"})
    assert r.status_code == 200, r.text
    p = r.json()
    assert p["fits"] is False and p["rejections"] == {"memory": 1, "state": 1, "vcpus": 1}
    why = {x["host"]: x["reason"] for x in p["rejected_hosts"]}
    assert why["h2"] == "node 0: 16 free 2048 kB pages, 512 needed" and why["h1"] == "host is cordoned"
    api.post("/v1/hosts/h1/uncordon", headers=ADM)
    p = api.post("/v1/vms?dry_run=true", json=vm_body(vcpus=2, vfs=[{"max_tx_rate_mbps": 100}]),
                 headers=TA | {"Idempotency-Key": "p2"}).json()
    assert p["fits"] and p["host"] == "h1" and p["placement"]["vfs"][0]["pf"] == "ens0f0"
    assert api.get("/v1/vms", headers=ADM).json()["items"] == []  # a preview claims nothing
    r = create(api, "big", vcpus=64)
    assert r.status_code == 507 and r.json()["error"]["code"] == "hyb.placement.no_valid_host"
    assert r.json()["error"]["rejections"] == {"vcpus": 3}


def test_delete_frees_everything_and_io_limits(api):
    register(api, "h1")
    vm = create(api, "k", disks=[{"class": "nvme", "iotune": {"total_bytes_sec": 10**8, "total_iops_sec": 1000}}],
                vfs=[{"min_tx_rate_mbps": 3000}]).json()
    assert vm["placement"]["disks"] == [{"name": "nvme0n1", "bytes_sec": 10**8, "iops": 1000}]
    h = api.get("/v1/hosts/h1", headers=ADM).json()
    assert h["pfs"][0]["reserved_mbps"] == 3000 and h["disks"][0]["used"]
    r = api.patch(f"/v1/vms/{vm['id']}/io-limits", headers=TA,
                  json={"disks": [{"disk": "nvme0n1", "iotune": {"total_bytes_sec": 5 * 10**8}}]})
    assert r.status_code == 200 and r.json()["placement"]["disks"][0]["bytes_sec"] == 5 * 10**8
    r = api.patch(f"/v1/vms/{vm['id']}/io-limits", headers=TA,
                  json={"disks": [{"disk": "nvme0n1", "iotune": {"total_bytes_sec": 10**12}}]})
    assert r.status_code == 422 and r.json()["error"]["field"] == "disks[0].iotune.total_bytes_sec"
    r = api.patch(f"/v1/vms/{vm['id']}/io-limits", headers=TA,
                  json={"disks": [{"disk": "nvme1n1", "iotune": {"total_bytes_sec": 1}}]})
    assert r.status_code == 422 and r.json()["error"]["field"] == "disks[0].disk"
    # VF tx rates: a higher guarantee is reserved from the PF's budget, or refused
    pf = h["pfs"][0]
    r = api.patch(f"/v1/vms/{vm['id']}/io-limits", headers=TA,
                  json={"vfs": [{"vf": 0, "max_tx_rate_mbps": 8000, "min_tx_rate_mbps": 5000}]})
    assert r.status_code == 200, r.text
    assert r.json()["placement"]["vfs"][0] | {"pf": "", "index": 0} == {
        "pf": "", "index": 0, "max_tx_rate_mbps": 8000, "min_tx_rate_mbps": 5000}
    assert r.json()["request"]["vfs"][0]["min_tx_rate_mbps"] == 5000
    assert api.get("/v1/hosts/h1", headers=ADM).json()["pfs"][0]["reserved_mbps"] == 5000
    bad = [({"vfs": [{"vf": 1, "max_tx_rate_mbps": 1}]}, "vfs[0].vf"),
           ({"vfs": [{"vf": 0, "max_tx_rate_mbps": 100, "min_tx_rate_mbps": 200}]}, "vfs[0].min_tx_rate_mbps"),
           ({"vfs": [{"vf": 0, "max_tx_rate_mbps": 0, "min_tx_rate_mbps": pf["bandwidth_mbps"] + 1}]},
            "vfs[0].min_tx_rate_mbps"),
           ({"vfs": [{"vf": 0, "max_tx_rate_mbps": pf["bandwidth_mbps"] + 1}]}, "vfs[0].max_tx_rate_mbps"),
           ({}, "disks")]
    for body, field in bad:
        r = api.patch(f"/v1/vms/{vm['id']}/io-limits", headers=TA, json=body)
        assert r.status_code == 422 and r.json()["error"]["field"] == field, (body, r.text)
    assert api.get("/v1/hosts/h1", headers=ADM).json()["pfs"][0]["reserved_mbps"] == 5000  # nothing changed
    assert api.get(f"/v1/vms/{vm['id']}", headers=TA).json()["placement"]["vfs"][0]["min_tx_rate_mbps"] == 5000
    assert api.delete(f"/v1/vms/{vm['id']}", headers=TA).status_code == 204
    h = api.get("/v1/hosts/h1", headers=ADM).json()
    assert h["vms"] == 0 and h["pfs"][0]["reserved_mbps"] == 0 and not h["disks"][0]["used"]
    assert all(n["used_cpus"] == [] for n in h["nodes"])
    assert api.get(f"/v1/vms/{vm['id']}", headers=TA).status_code == 404


def test_states_down_by_missed_heartbeat_and_drain(api, clock):
    register(api, "h1")
    register(api, "h2")
    clock.t += 61
    api.post("/v1/hosts/h2/heartbeat", headers=HOST)
    states = {h["name"]: h["state"] for h in api.get("/v1/hosts", headers=ADM).json()["items"]}
    assert states == {"h1": "down", "h2": "active"}
    assert create(api, "k1").json()["host"] == "h2"
    api.post("/v1/hosts/h2/drain", headers=ADM)
    r = create(api, "k2")
    assert r.status_code == 507 and r.json()["error"]["rejections"] == {"state": 2}
    assert api.get("/v1/hosts?state=draining", headers=ADM).json()["items"][0]["vms"] == 1
    assert api.post("/v1/hosts/nope/heartbeat", headers=HOST).json()["error"]["code"] == "hyb.host.not_found"


def test_hosts_page_by_name_and_a_state_filter_keeps_paging(api, clock):
    """`limit` + `after` page through the hosts by name (`next` absent on the last page);
    without `limit` every host comes at once, as before. A page filtered by state may
    hold fewer than `limit`, so `next` (not the count) says whether to ask again. The
    client helper hybctl and fleet-rollout share follows `next` to the end."""
    for n, rack in (("h3", "r1"), ("h1", "r1"), ("h5", "r2"), ("h2", "r2"), ("h4", "r1")):
        register(api, n, rack=rack)
    everything = api.get("/v1/hosts", headers=ADM).json()
    assert [h["name"] for h in everything["items"]] == ["h1", "h2", "h3", "h4", "h5"] and everything["next"] is None
    p1 = api.get("/v1/hosts?limit=2", headers=ADM).json()
    p2 = api.get(f"/v1/hosts?limit=2&after={p1['next']}", headers=ADM).json()
    p3 = api.get(f"/v1/hosts?limit=2&after={p2['next']}", headers=ADM).json()
    assert [[h["name"] for h in p["items"]] for p in (p1, p2, p3)] == [["h1", "h2"], ["h3", "h4"], ["h5"]]
    assert (p1["next"], p2["next"], p3["next"]) == ("h2", "h4", None)
    assert [h["name"] for h in api.get("/v1/hosts?rack=r1&limit=2&after=h1", headers=ADM).json()["items"]] == [
        "h3", "h4"]
    clock.t += 61
    for n in ("h2", "h5"):
        api.post(f"/v1/hosts/{n}/heartbeat", headers=HOST)
    p1 = api.get("/v1/hosts?state=active&limit=2", headers=ADM).json()
    assert [h["name"] for h in p1["items"]] == ["h2"] and p1["next"] == "h2"  # h1 is down: one item, more to ask
    r = api.get("/v1/hosts?limit=0", headers=ADM)
    assert r.status_code == 422 and r.json()["error"]["field"] == "limit"

    from api.rest import RestClient
    client = RestClient("http://testserver", ADM["Authorization"].split()[1], http=api)
    assert [h["name"] for h in client.every_page("/v1/hosts", {"state": "active"}, limit=2)] == ["h2", "h5"]


def test_the_fleet_summary_counts_what_the_host_list_shows(api, clock):
    """`GET /v1/fleet/hosts` (the console's fleet page) against sums over every page of
    `GET /v1/hosts`: hosts by state and by class (a host converting and one failed by an
    active rollout, one cordoned, one down, one carved), and the free capacity on the
    hosts that take VMs, with a VM's claim taken out of it."""
    names = [f"h{i}" for i in range(1, 8)]
    for n in names:
        body = host_body(n, SMALL, disk="nvme") | ({"carved_policy": "ab" * 32} if n == "h4" else {})
        assert api.post("/v1/hosts", json=body, headers=HOST).status_code in (200, 201)
    clock.t += 61
    for n in names[:-1]:
        api.post(f"/v1/hosts/{n}/heartbeat", headers=HOST)  # h7 misses its beats: down
    api.post("/v1/hosts/h5/cordon", headers=ADM)
    assert create(api, "k1", vcpus=4).status_code == 202  # on a host that takes VMs
    waves = [[{"name": n, "address": f"{n}:7443", "rack": "", "host": {"name": n}} for n in ("h1", "h2", "h3")]]
    assert api.post("/v1/rollouts", json={"name": "r", "kind": "convert", "policy_digest": "ab" * 32, "spec": {},
                                          "waves": waves}, headers=ADM).status_code == 201
    fence = api.post("/v1/rollouts/r/lease", json={"holder": "c", "ttl_s": 60}, headers=ADM).json()["fence"]
    for n, to in (("h1", "carving"), ("h2", "failed")):  # h3 stays pending
        r = api.post(f"/v1/rollouts/r/hosts/{n}/transition", json={"fence": fence, "from": "pending", "to": to},
                     headers=ADM)
        assert r.status_code == 200, r.text

    got = api.get("/v1/fleet/hosts", headers=ADM).json()
    from api.rest import RestClient
    hosts = RestClient("http://testserver", "adm", http=api).every_page("/v1/hosts", limit=3)
    live = [h for h in hosts if h["state"] == "active" and h["admin_state"] == "active"]
    assert got["hosts"] == 7 and got["states"] == {"active": 5, "cordoned": 1, "draining": 0, "down": 1}
    assert got["classes"] == {"unconverted": 2, "converting": 1, "carved": 1, "cordoned": 1, "down": 1,
                              "failed": 1}, got["classes"]
    assert got["cpus_free"] == sum(n["free_cpus"] for h in live for n in h["nodes"]) == 6 * 10 - 4 - 10
    assert got["cpus_total"] == sum(len(n["vm_cpus"]) for h in hosts for n in h["nodes"])
    pages = {p["size_kb"]: (p["free"], p["total"]) for p in got["pages"]}
    assert pages == {2048: (sum(pl["free"] for h in live for n in h["nodes"] for pl in n["hugepages"]),
                            sum(pl["total"] for h in live for n in h["nodes"] for pl in n["hugepages"]))}
    assert pages[2048][0] == pages[2048][1] - 512  # the VM's 1 GiB in 2 MiB pages
    assert (got["vfs_free"], got["vfs_total"]) == (sum(p["vfs_total"] - p["vfs_used"] for h in live for p in h["pfs"]),
                                                   sum(p["vfs_total"] for h in hosts for p in h["pfs"]))
    assert got["tx_free_mbps"] == sum(p["bandwidth_mbps"] - p["reserved_mbps"] for h in live for p in h["pfs"])
    assert (got["disks_free"], got["disks_total"]) == (sum(not d["used"] for h in live for d in h["disks"]),
                                                       sum(len(h["disks"]) for h in hosts))
    assert api.get("/v1/fleet/hosts", headers=TA).status_code == 403


def test_anti_affinity_across_hosts_and_racks(api):
    for n, rack in (("h1", "r1"), ("h2", "r1"), ("h3", "r2")):
        register(api, n, rack=rack)
    aa = {"group": "db", "scope": "host"}
    hosts = [create(api, f"k{i}", anti_affinity=aa, name=f"db-{i}").json()["host"] for i in range(3)]
    assert sorted(hosts) == ["h1", "h2", "h3"]
    assert create(api, "k9", anti_affinity=aa).status_code == 507
    rack = {"group": "web", "scope": "rack"}
    got = [create(api, f"w{i}", anti_affinity=rack).json().get("host") for i in range(3)]
    assert len({g for g in got[:2]}) == 2 and got[2] is None


def test_a_replacement_is_not_kept_out_of_its_rack_by_the_vm_it_replaces(api):
    """A drain's replacement (``replaces``) is placed with the VM it replaces left out of
    its anti-affinity group, as a VM moving live is: the old one runs until the new one
    does, then goes. With rack scope it kept the replacement out of its whole rack: here
    the only rack left with room."""
    from scheduler.schemas.vms import VmCreate
    for n, rack in (("h1", "r1"), ("h2", "r1"), ("h3", "r2")):
        register(api, n, rack=rack)
    rack = {"group": "web", "scope": "rack"}
    old = create(api, "w1", anti_affinity=rack, name="web-1").json()
    other = create(api, "w2", anti_affinity=rack, name="web-2").json()
    [moving] = [v for v in (old, other) if v["host"] in ("h1", "h2")]  # one member a rack
    assert {old["host"], other["host"]} - {moving["host"]} == {"h3"}, (old, other)
    draining = moving["host"]
    assert api.post(f"/v1/hosts/{draining}/cordon", json={"reason": "disk swap"}, headers=ADM).status_code == 200
    svc = api.app.state.vms
    body = VmCreate.model_validate({k: v for k, v in moving["request"].items() if k != "tenant"})
    # what the drain's replace step asks (scheduler/service/drains.py)
    [got] = svc.create_many([svc.prepare(body, tenant="a", key=f"drain:{moving['id']}", actor=f"drain:{draining}",
                                         replaces=moving["id"])])
    assert not isinstance(got, BaseException), got
    new, _ = got
    assert new.host == ({"h1", "h2"} - {draining}).pop() and new.replaces == moving["id"]
    # a third member of the group still finds no rack free of the group
    assert create(api, "w3", anti_affinity=rack, name="web-3").status_code == 507


def test_health_ready_metrics_and_list_filters(api):
    assert api.get("/healthz").json() == {"status": "ok"}
    assert api.get("/readyz").status_code == 200
    register(api, "h1")
    create(api, "k1")
    create(api, "k2", vcpus=99)
    text = api.get("/metrics", headers=ADM).text
    assert 'hyb_sched_placements_total{outcome="claimed"} 1.0' in text
    assert 'hyb_sched_placements_total{outcome="no_valid_host"} 1.0' in text
    assert 'hyb_sched_hosts{state="active"} 1.0' in text and 'hyb_sched_vms{status="pending"} 1.0' in text
    assert len(api.get("/v1/vms?host=h1&status=pending", headers=ADM).json()["items"]) == 1
    assert api.get("/v1/vms?status=running", headers=ADM).json()["items"] == []
    assert api.get("/v1/nope", headers=ADM).json()["error"]["code"] == "hyb.http.not_found"
    assert api.get("/v1/nope").status_code == 401  # no token: not even which paths exist


def test_the_gauges_export_every_host_state_and_vm_status(api):
    """A series per state, 0 when none is in it: a stopped VM (a drain's stop) is counted."""
    register(api, "h1")
    vm = create(api, "k1").json()
    api.app.state.vms.stop(vm["id"], actor="test", reason="maintenance", expect=VmStatus.PENDING)
    text = api.get("/metrics", headers=ADM).text
    assert 'hyb_sched_vms{status="stopped"} 1.0' in text and 'hyb_sched_vms{status="pending"} 0.0' in text
    assert all(f'hyb_sched_vms{{status="{s}"}}' in text for s in VmStatus)
    assert all(f'hyb_sched_hosts{{state="{s}"}}' in text for s in HostState)


def test_recent_1g_demand_keeps_the_last_1g_node_for_1g_vms(api):
    """Through the API: after a 1 GiB VM, one host can still take another and the recent
    demand expects one (half the requests, 20 free CPUs, 6 vCPUs mean), so a 2 MiB VM
    passes over that host's 8-CPU node (best fit on CPUs alone would take it) for the
    12-CPU host; the next 1 GiB VM still fits. Counted in hyb_sched_keep_1g_total."""
    for name, shape in (("g-1", ONE_G), ("g-2", ONE_G), ("p-1", PLAIN)):
        register(api, name, shape)
    big = {"vcpus": 8, "memory_mib": 16384, "page_size_kb": 1048576}
    assert create(api, "k1", name="db-1", **big).json()["host"] == "g-1"
    assert api.post("/v1/vms?dry_run=true", json=vm_body(name="x", vcpus=4, memory_mib=8192),
                    headers=TA | {"Idempotency-Key": "p3"}).json()["host"] == "p-1"  # the preview walks as the claim will
    assert create(api, "k2", name="web-1", vcpus=4, memory_mib=8192).json()["host"] == "p-1"
    assert create(api, "k3", name="db-2", **big).json()["host"] == "g-2"
    assert "hyb_sched_keep_1g_total 1.0" in api.get("/metrics", headers=ADM).text  # the preview is not counted


def test_openapi_snapshot_has_not_drifted(api):
    """api/openapi.json is the committed contract; regenerate with `scheduler openapi`."""
    live = json.loads(json.dumps(api.app.openapi(), sort_keys=True))
    committed = json.loads((REPO / "api/openapi.json").read_text())
    assert live == committed, "schema drifted: run `scheduler openapi > api/openapi.json` and review"


def test_audit_log_records_mutations(api):
    register(api, "h1")
    vm = create(api, "k1").json()
    api.post("/v1/hosts/h1/cordon", headers=ADM)
    api.delete(f"/v1/vms/{vm['id']}", headers=TA)
    from scheduler.repo.audit import list_audit
    with api.app.state.store.read() as s:
        acts = [(a.principal, a.action) for a in reversed(list_audit(session=s))]
    assert acts == [("hst", "host.register"), ("ta", "vm.create"), ("adm", "host.cordoned"), ("ta", "vm.delete")]
