"""Drains that move VMs, end to end in the scheduler: three real hostd gRPC servers
in-process (libvirt's test driver, real SQLite ledgers, mTLS; tools/dev/hostd_inproc.py),
the scheduler's own drain loop (scheduler/service/drains.py) in its lifespan, on SQLite
and PostgreSQL. The test samples the fleet while the loop works: what the scheduler
records and what the hostds run."""

from __future__ import annotations

import threading
import time

from drain_fleet import Fleet, certs, create, fleet, private_fleet, wait  # noqa: F401 - fixtures
from sched_helpers import ADM, HOST, TA, TB, Clock, vm_body
from tools.dev.procs import free_port

from api.states import VmStatus
from scheduler.repo import vms as vm_repo

def test_replace_vms_under_a_budget_of_one_move_one_at_a_time(fleet) -> None:  # type: ignore[no-untyped-def]
    api, managers = fleet
    web = {"on_maintenance": "replace", "disruption_budget": {"group": "web", "max_unavailable": 1}}
    old = {n: create(api, n, **web) for n in ("web-1", "web-2", "web-3")}
    stop_me = create(api, "batch-1", on_maintenance="stop")  # pack: all four on h1
    hosts = {v["id"]: v["host"] for v in api.get("/v1/vms", headers=ADM).json()["items"]}
    assert set(hosts.values()) == {"h1"}
    view = api.get("/v1/hosts/h1/drain", headers=HOST).json()  # before the drain: what it would do
    assert view["admin_state"] == "active" and not view["drained"] and view["left"] == 4

    samples: list[tuple[int, int]] = []  # (replacements in flight, web VMs running on the hostds)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            vms = api.get("/v1/vms", headers=ADM).json()["items"]
            flight = sum(1 for v in vms if v["replaces"])
            running = sum(1 for m in managers.values() for v in m.list()
                          if v.state == "running" and v.name.startswith("web-"))
            samples.append((flight, running))
            time.sleep(0.02)
    t = threading.Thread(target=sample)
    t.start()
    try:
        r = api.post("/v1/hosts/h1/drain", json={"reason": "disk swap"}, headers=ADM)
        assert r.status_code == 200
        view = wait(lambda: (v := api.get("/v1/hosts/h1/drain", headers=HOST).json())["drained"] and v,
                    "h1 drained", 60)
    finally:
        done.set()
        t.join()
    assert view["left"] == 0 and all(s["action"] == "done" for s in view["steps"])
    # one move at a time, and no member of the group was ever down (the old one runs
    # until its replacement does)
    assert samples and max(f for f, _ in samples) == 1 and min(r for _, r in samples) >= 3, samples[:20]
    vms = {v["id"]: v for v in api.get("/v1/vms", headers=ADM).json()["items"]}
    assert not set(old.values()) & set(vms)  # the old ones are deleted
    moved = [v for v in vms.values() if v["name"].startswith("web-")]
    assert sorted(v["name"] for v in moved) == ["web-1", "web-2", "web-3"]
    assert all(v["status"] == "running" and v["host"] in ("h2", "h3") and v["replaces"] is None for v in moved)
    assert [v.name for v in managers["h1"].list()] == []  # nothing left on the host
    assert vms[stop_me]["status"] == "stopped" and vms[stop_me]["placement"] is None
    assert vms[stop_me]["reason"] == "stopped for the drain of h1"
    assert api.get("/v1/hosts/h1", headers=HOST).json()["vms"] == 0
    audit = [a["action"] for a in api.get("/v1/audit", headers=ADM).json()["items"]
             if a["principal"] == "drain:h1"]
    assert sorted(audit) == ["vm.create"] * 3 + ["vm.delete"] * 3 + ["vm.stop"]


def test_the_drain_says_what_it_waits_for(fleet) -> None:  # type: ignore[no-untyped-def]
    api, managers = fleet
    owned = create(api, "db-1")  # on_maintenance defaults to block
    zero = {"on_maintenance": "replace", "disruption_budget": {"group": "quorum", "max_unavailable": 0}}
    q = create(api, "quorum-1", **zero)
    # a VM the drain stops at once: the view is read for the others only after the loop has
    # acted on it (the view itself is planned on read, loop or no loop)
    batch = create(api, "batch-1", on_maintenance="stop")
    assert {v["host"] for v in api.get("/v1/vms", headers=ADM).json()["items"]} == {"h1"}
    assert api.post("/v1/hosts/h1/drain", headers=ADM).status_code == 200
    wait(lambda: api.get(f"/v1/vms/{batch}", headers=TA).json()["status"] == "stopped",
         "the drain loop to stop batch-1 on h1", 30)
    view = api.get("/v1/hosts/h1/drain", headers=HOST).json()
    why = {s["name"]: (s["action"], s["why"]) for s in view["steps"]}
    assert why == {"db-1": ("wait", "on_maintenance = block: its owner moves or deletes it"),
                   "quorum-1": ("wait", "group a/quorum: 0 of its VMs unavailable, max_unavailable = 0"),
                   "batch-1": ("done", "stopped")}
    assert not view["drained"] and view["left"] == 2
    assert {v.name.split("-")[0] + "-" + v.name.split("-")[1] for v in managers["h1"].list()} == {"db-1", "quorum-1"}
    # the owners act: the drain finishes
    assert api.delete(f"/v1/vms/{owned}", headers=TA).status_code == 204
    assert api.delete(f"/v1/vms/{q}", headers=TA).status_code == 204
    assert wait(lambda: api.get("/v1/hosts/h1/drain", headers=HOST).json()["drained"], "h1 drained")


def test_a_replacement_placement_refuses_is_shown_until_a_round_places_it(fleet) -> None:  # type: ignore[no-untyped-def]
    """Every other host cordoned: the drain cannot place the replacement; the drain view and
    the VM say why (placement's own answer) and when, every round, and nothing is created.
    A host back in service: the next round places it and the drain finishes."""
    api, managers = fleet
    old = create(api, "web-9", on_maintenance="replace")
    assert api.get(f"/v1/vms/{old}", headers=TA).json()["host"] == "h1"
    for h in ("h2", "h3"):
        assert api.post(f"/v1/hosts/{h}/cordon", json={"reason": "full"}, headers=ADM).status_code == 200
    assert api.post("/v1/hosts/h1/drain", headers=ADM).status_code == 200

    def noted():  # type: ignore[no-untyped-def]
        step = api.get("/v1/hosts/h1/drain", headers=HOST).json()["steps"][0]
        return step if "no host for its replacement" in step["why"] else None
    step = wait(noted, "the drain view saying the replacement found no host")
    assert step["action"] == "replace" and step["why"].startswith(
        "on_maintenance = replace; drain: no host for its replacement (tried "), step
    assert "again every round): no host fits:" in step["why"], step
    vm = api.get(f"/v1/vms/{old}", headers=TA).json()
    assert vm["status"] == "running" and vm["reason"] == step["why"].split("; ", 1)[1]
    assert [v["id"] for v in api.get("/v1/vms", headers=ADM).json()["items"]] == [old]   # nothing half-made
    assert api.post("/v1/hosts/h3/uncordon", headers=ADM).status_code == 200
    assert wait(lambda: api.get("/v1/hosts/h1/drain", headers=HOST).json()["drained"], "h1 drained")
    (moved,) = api.get("/v1/vms", headers=ADM).json()["items"]
    assert moved["name"] == "web-9" and moved["host"] == "h3" and moved["reason"] == "" and moved["id"] != old


def test_bad_maintenance_fields_are_refused_naming_the_field(fleet) -> None:  # type: ignore[no-untyped-def]
    api, _ = fleet
    for body, field in ((vm_body("x", on_maintenance="teleport"), "on_maintenance"),
                        (vm_body("x", disruption_budget={"group": "web", "max_unavailable": -1}),
                         "disruption_budget.max_unavailable"),
                        (vm_body("x", disruption_budget={"max_unavailable": 1}), "disruption_budget.group")):
        r = api.post("/v1/vms", json=body, headers=TA | {"Idempotency-Key": "bad"})
        assert r.status_code == 422 and r.json()["error"]["field"] == field, r.text
    assert api.get("/v1/vms", headers=ADM).json()["items"] == []


def test_a_replacement_sent_to_a_hostd_that_was_down_is_made_again_once_it_is_back(private_fleet: Fleet) -> None:
    """Issue 38, item 6: the replacement is placed on h2, whose hostd cannot be reached
    (registered at an address nothing listens on), and fails there with nowhere else to
    go; the drain deletes the failed one and places it again each round, so once h2's
    hostd is back (re-registered at its address) the drain finishes, without an operator."""
    f = private_fleet
    with f.scheduler() as api:
        for h in ("h1", "h3"):
            f.register(api, h)
        assert api.post("/v1/hosts/h3/cordon", json={"reason": "full"}, headers=ADM).status_code == 200
        old = create(api, "web-1", on_maintenance="replace")
        f.register(api, "h2", address=f"localhost:{free_port()}")  # h2's hostd is down
        assert api.post("/v1/hosts/h1/drain", headers=ADM).status_code == 200

        def failed():  # type: ignore[no-untyped-def]
            return [v for v in api.get("/v1/vms", headers=ADM).json()["items"] if v["status"] == "failed"]
        [first] = wait(failed, "the replacement on h2 to fail")
        assert first["replaces"] == old and "h2: CreateVM" in first["reason"], first
        # the drain deletes it and tries again while h2 is down: failed replacements come and go
        wait(lambda: any(v["id"] != first["id"] for v in failed()), "a second failed replacement")
        assert len([v for v in api.get("/v1/vms", headers=ADM).json()["items"] if v["replaces"] == old]) <= 1
        f.register(api, "h2")  # its hostd is back
        assert wait(lambda: api.get("/v1/hosts/h1/drain", headers=HOST).json()["drained"], "h1 drained", 30)
        [new] = api.get("/v1/vms", headers=ADM).json()["items"]
        assert new["name"] == "web-1" and new["host"] == "h2" and new["status"] == "running" and new["id"] != old
        assert [v.name.split("-")[0] for v in f.hostds["h2"].manager.list()] == ["web"]
        # asked by target: a slow h2 can leave more than a page of failed rounds in the audit
        for vm in (first["id"], old):
            deletes = api.get("/v1/audit", params={"action": "vm.delete", "target": vm}, headers=ADM).json()["items"]
            assert [a["principal"] for a in deletes] == ["drain:h1"], (vm, deletes)


def test_a_replacement_left_creating_by_a_stopped_scheduler_is_dispatched_again(private_fleet: Fleet) -> None:
    """Issue 38, item 6: a scheduler claims the replacement and stops in the middle of
    dispatching it (left ``creating``); the next scheduler's drain dispatches it again at
    once (hostd's CreateVM is idempotent by request id) instead of holding the drain until
    a reconcile."""
    f = private_fleet
    with f.scheduler(register=True) as api:
        old = create(api, "web-1", on_maintenance="replace")
    with f.scheduler(dispatch={"enabled": False}) as api:  # claims, never sends: as if killed mid-CreateVM
        assert api.post("/v1/hosts/h1/drain", headers=ADM).status_code == 200
        api.app.state.drains.round()
        [new] = [v for v in api.get("/v1/vms", headers=ADM).json()["items"] if v["replaces"] == old]
        assert new["status"] == VmStatus.PENDING and new["host"] in ("h2", "h3")
        with api.app.state.store.write() as s:
            assert vm_repo.set_status(session=s, vm_id=new["id"], expect=(VmStatus.PENDING,),
                                      status=VmStatus.CREATING, reason="", now=new["updated"])
    # the next scheduler, two seconds on: past the dispatch bound (PostgreSQL: another
    # replica might still be dispatching it until then; SQLite, one process: at once)
    with f.scheduler(dispatch={"enabled": True, "timeout_s": 1, "max_attempts": 1}, clock=Clock(1_000_002.0)) as api:
        assert wait(lambda: api.get("/v1/hosts/h1/drain", headers=HOST).json()["drained"], "h1 drained", 15)
        [moved] = api.get("/v1/vms", headers=ADM).json()["items"]
        assert moved["id"] == new["id"] and moved["status"] == VmStatus.RUNNING and moved["replaces"] is None
        assert [v.request_id for v in f.hostds[moved["host"]].manager.list()] == [new["id"]]
        assert f.hostds["h1"].manager.list() == []


def test_a_vm_the_drain_stopped_starts_again_on_a_host_that_fits_once(fleet) -> None:  # type: ignore[no-untyped-def]
    """A VM the drain stopped (``on_maintenance = "stop"``) starts again from its own
    request (``POST /v1/vms/{id}/start``): placed on a host that fits it now, never the
    draining one, and created there by that host's hostd, with the same id and name. With
    nowhere to go it is 507 and stays stopped with nothing claimed; a retried start
    starts nothing twice; another tenant does not see it; only a stopped VM starts."""
    api, managers = fleet
    vm_id = create(api, "batch-1", on_maintenance="stop")
    create(api, "db-1", on_maintenance="replace")
    assert api.get(f"/v1/vms/{vm_id}", headers=TA).json()["host"] == "h1"  # pack: the first host
    assert api.post("/v1/hosts/h1/drain", json={"reason": "disk swap"}, headers=ADM).status_code == 200
    wait(lambda: api.get(f"/v1/vms/{vm_id}", headers=TA).json()["status"] == "stopped", "the drain's stop")
    wait(lambda: api.get("/v1/hosts/h1/drain", headers=HOST).json()["drained"], "h1 drained")
    [other] = api.get("/v1/vms", headers=TA, params={"name": "db-1"}).json()["items"]  # replaced: a new VM
    moved_to = other["host"]
    for h in ("h2", "h3"):
        assert api.post(f"/v1/hosts/{h}/cordon", json={"reason": "full"}, headers=ADM).status_code == 200
    used = {h: api.get(f"/v1/hosts/{h}", headers=HOST).json()["vms"] for h in ("h1", "h2", "h3")}

    r = api.post(f"/v1/vms/{vm_id}/start", headers=TA)
    assert r.status_code == 507 and r.json()["error"]["code"] == "hyb.placement.no_valid_host", r.text
    vm = api.get(f"/v1/vms/{vm_id}", headers=TA).json()
    assert vm["status"] == "stopped" and vm["placement"] is None and vm["host"] == "h1"
    assert {h: api.get(f"/v1/hosts/{h}", headers=HOST).json()["vms"] for h in used} == used
    assert api.post(f"/v1/vms/{vm_id}/start", headers=TB).status_code == 404

    target = "h3" if moved_to == "h2" else "h2"
    assert api.post(f"/v1/hosts/{target}/uncordon", headers=ADM).status_code == 200
    r = api.post(f"/v1/vms/{vm_id}/start", headers=TA)
    assert r.status_code == 202, r.text
    assert r.json()["id"] == vm_id and r.json()["host"] == target and r.json()["status"] == "pending"
    vm = wait(lambda: (v := api.get(f"/v1/vms/{vm_id}", headers=TA).json())["status"] == "running" and v,
              "the started VM to run")
    assert vm["host"] == target and vm["reason"] == "" and vm["placement"]["cpus"]
    assert [(v.name, v.state) for v in managers[target].list() if v.name.startswith("batch-1")] == \
        [(f"batch-1-{vm_id[:8]}", "running")]
    assert not [v for v in managers["h1"].list()]  # the drained host stays empty

    again = api.post(f"/v1/vms/{vm_id}/start", headers=TA)
    assert again.status_code == 200 and again.json()["host"] == target and again.json()["status"] == "running"
    starts = api.get("/v1/audit", headers=ADM, params={"action": "vm.start", "target": vm_id}).json()["items"]
    assert len(starts) == 1 and starts[0]["principal"] == "ta" and starts[0]["detail"]["host"] == target, starts
    assert len([v for v in managers[target].list() if v.name.startswith("batch-1")]) == 1

    with api.app.state.store.write() as s:
        vm_repo.set_status(session=s, vm_id=other["id"], expect=(VmStatus.RUNNING,), status=VmStatus.FAILED,
                           reason="test", now=0)
    r = api.post(f"/v1/vms/{other['id']}/start", headers=TA)
    err = r.json()["error"]
    assert r.status_code == 409 and err["code"] == "hyb.vm.busy" and err["field"] == "vm_id", r.text
    assert "failed" in err["message"]
