"""Cordon, drain and uncordon record who holds the host out of "active", why and since
when. The owner is never taken from the request: it is the caller's principal, or
``rollout:<name>`` for the principal holding that rollout's lease, under its fence (a
stale fence is refused naming who took the lease). Another owner is refused (409
hyb.host.admin_owned) unless it forces, naming the hold it overrides. In process over
a real store: SQLite, and PostgreSQL (integration)."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from sqlalchemy import MetaData, Table

from sched_helpers import ADM, HOST, TA, auth, host_body, make_client, token_config, vm_body
from scheduler.db.engine import Store
from scheduler.db.migrate import downgrade, upgrade
from scheduler.errors import HostAdminOwned
from scheduler.repo import hosts as host_repo
from scheduler.schemas.hosts import AdminChange

OPS2 = auth("ops2")  # a second admin: another operator, or a fleet rollout's token
TOKENS = token_config() + [{"name": "ops2", "sha256": hashlib.sha256(b"ops2").hexdigest(), "scopes": ["admin"]}]
HOLD = ("admin_state", "admin_owner", "admin_reason", "admin_since", "generation")
T0 = "1970-01-12T13:46:40+00:00"  # the test clock's start


@pytest.fixture
def api(db_url, clock):  # type: ignore[no-untyped-def]
    with make_client(db_url, clock=clock, auth={"tokens": TOKENS}) as c:
        for name in ("h1", "h2"):
            assert c.post("/v1/hosts", json=host_body(name), headers=HOST).status_code == 201
        yield c


def hold(api, name="h1"):  # type: ignore[no-untyped-def]
    h = api.get(f"/v1/hosts/{name}", headers=ADM).json()
    return {k: h[k] for k in HOLD}


def audit(api):  # type: ignore[no-untyped-def]
    """The host state changes, oldest first: (principal, action, detail)."""
    items = api.get("/v1/audit?action=host.&limit=100", headers=ADM).json()["items"]
    return [(a["principal"], a["action"], a["detail"]) for a in reversed(items)
            if a["action"] not in ("host.register", "host.update")]


def test_the_owner_is_the_callers_principal_and_is_shown(api, clock):
    r = api.post("/v1/hosts/h1/cordon", json={"reason": "replace DIMM B3"}, headers=OPS2)
    assert r.status_code == 200, r.text
    want = {"admin_state": "cordoned", "admin_owner": "ops2", "admin_reason": "replace DIMM B3",
            "admin_since": clock.t}
    assert {k: r.json()[k] for k in want} == want
    assert {k: api.get("/v1/hosts/h1", headers=ADM).json()[k] for k in want} == want
    listed = {h["name"]: h for h in api.get("/v1/hosts", headers=ADM).json()["items"]}
    assert {k: listed["h1"][k] for k in want} == want
    assert [listed["h2"][k] for k in ("admin_owner", "admin_reason", "admin_since")] == [None, None, None]
    assert audit(api) == [("ops2", "host.cordoned", {"from": "active", "owner": "ops2", "reason": "replace DIMM B3",
                                                     "forced": False, "previous_owner": ""})]


@pytest.mark.parametrize("forged", ["alice@ops", "ops2", "rollout:r1", ""])
def test_a_forged_owner_is_refused_and_nothing_changes(api, forged):
    """An owner in the request is refused (422 naming ``owner``), not taken and not
    silently replaced: a client that still names owners finds out at once."""
    assert api.post("/v1/hosts/h2/cordon", json={"reason": "r"}, headers=OPS2).status_code == 200
    before, trail = {h: hold(api, h) for h in ("h1", "h2")}, audit(api)
    for verb in ("cordon", "drain", "uncordon"):
        for name in ("h1", "h2"):
            r = api.post(f"/v1/hosts/{name}/{verb}", json={"owner": forged, "reason": "mine"}, headers=ADM)
            err = r.json()["error"]
            assert (r.status_code, err["code"], err["field"]) == (422, "hyb.request.invalid", "owner"), r.text
    assert {h: hold(api, h) for h in ("h1", "h2")} == before and audit(api) == trail


def test_another_owner_is_refused_and_nothing_changes(api, clock):
    assert api.post("/v1/hosts/h1/cordon", json={"reason": "kernel 6.12"}, headers=ADM).status_code == 200
    before, trail = hold(api), audit(api)
    clock.t += 20  # later, within the heartbeat timeout
    tries = [("cordon", None), ("drain", None), ("uncordon", None), ("drain", {"reason": "mine now"})]
    for verb, body in tries:
        r = api.post(f"/v1/hosts/h1/{verb}", json=body, headers=OPS2)
        assert r.status_code == 409, (verb, r.text)
        err = r.json()["error"]
        assert (err["code"], err["field"]) == ("hyb.host.admin_owned", "owner"), err
        assert err["message"] == (f"host h1 is cordoned, held by adm since {T0} (reason 'kernel 6.12'); only adm may "
                                  'change its admin state, or send {"force": true, "expect_owner": "adm"} to '
                                  "override"), err
        assert hold(api) == before and audit(api) == trail, verb
    dry = api.post("/v1/vms?dry_run=true", json=vm_body(), headers=TA | {"Idempotency-Key": "p"}).json()
    assert dry["host"] == "h2" and dry["rejections"] == {"state": 1}  # still out of placement


def test_the_same_owner_may_repeat_and_move_between_cordon_and_drain(api, clock):
    since = clock.t
    assert api.post("/v1/hosts/h1/cordon", json={"reason": "disk swap"}, headers=ADM).status_code == 200
    clock.t += 10
    r = api.post("/v1/hosts/h1/cordon", headers=ADM)  # a repeat: the hold and its reason stay
    assert r.status_code == 200 and (r.json()["admin_since"], r.json()["admin_reason"]) == (since, "disk swap")
    clock.t += 10
    r = api.post("/v1/hosts/h1/drain", json={"expect_owner": "adm"}, headers=ADM)
    assert r.status_code == 200 and r.json()["admin_state"] == "draining", r.text
    assert (r.json()["admin_owner"], r.json()["admin_since"], r.json()["admin_reason"]) == ("adm", since, "disk swap")
    r = api.post("/v1/hosts/h1/cordon", json={"reason": "disk swapped, checking"}, headers=ADM)
    assert r.status_code == 200 and r.json()["admin_state"] == "cordoned"
    assert (r.json()["admin_since"], r.json()["admin_reason"]) == (since, "disk swapped, checking")
    r = api.post("/v1/hosts/h1/uncordon", json={"reason": "done"}, headers=ADM)
    assert r.status_code == 200, r.text
    assert [r.json()[k] for k in HOLD[:4]] == ["active", None, None, None]
    assert [(a, d["from"], d["forced"], d["previous_owner"]) for _, a, d in audit(api)] == [
        ("host.cordoned", "active", False, ""), ("host.cordoned", "cordoned", False, "adm"),
        ("host.draining", "cordoned", False, "adm"), ("host.cordoned", "draining", False, "adm"),
        ("host.active", "cordoned", False, "adm")]
    assert audit(api)[-1][2]["reason"] == "done"
    # uncordon cleared the hold: anyone may cordon again, and the hold starts anew
    clock.t += 10
    r = api.post("/v1/hosts/h1/cordon", headers=OPS2)
    assert r.status_code == 200 and (r.json()["admin_owner"], r.json()["admin_since"]) == ("ops2", clock.t)


def test_force_names_the_hold_it_overrides_and_is_audited_with_it(api, clock):
    assert api.post("/v1/hosts/h1/drain", json={"reason": "flaky NIC"}, headers=ADM).status_code == 200
    clock.t += 60
    before, trail = hold(api), audit(api)
    r = api.post("/v1/hosts/h1/uncordon", json={"force": True, "reason": "NIC replaced"}, headers=OPS2)
    err = r.json()["error"]
    assert (r.status_code, err["code"], err["field"]) == (422, "hyb.request.invalid", "expect_owner"), r.text
    # the hold it means to override is not the one there: refused, naming who holds it
    r = api.post("/v1/hosts/h1/uncordon", json={"force": True, "expect_owner": "alice"}, headers=OPS2)
    assert r.status_code == 409 and r.json()["error"] == {
        "code": "hyb.host.admin_stale", "field": "expect_owner",
        "message": f"expected alice to hold host h1, but host h1 is draining, held by adm since {T0} "
                   "(reason 'flaky NIC')"}, r.text
    assert hold(api) == before and audit(api) == trail
    r = api.post("/v1/hosts/h1/uncordon", json={"force": True, "expect_owner": "adm", "reason": "NIC replaced"},
                 headers=OPS2)
    assert r.status_code == 200, r.text
    assert [r.json()[k] for k in HOLD[:4]] == ["active", None, None, None]
    assert audit(api)[-1] == ("ops2", "host.active", {"from": "draining", "owner": "ops2", "reason": "NIC replaced",
                                                      "forced": True, "previous_owner": "adm"})
    # a forced cordon takes the hold over: the new owner, its reason, its time
    assert api.post("/v1/hosts/h1/cordon", json={"reason": "audit"}, headers=ADM).status_code == 200
    clock.t += 60
    r = api.post("/v1/hosts/h1/cordon", json={"force": True, "expect_owner": "adm"}, headers=OPS2)
    assert r.status_code == 200, r.text
    assert [r.json()[k] for k in HOLD[:4]] == ["cordoned", "ops2", "", clock.t]
    assert audit(api)[-1][2] == {"from": "cordoned", "owner": "ops2", "reason": "", "forced": True,
                                 "previous_owner": "adm"}
    # force where nobody else holds it overrides nothing: not audited as forced
    r = api.post("/v1/hosts/h2/cordon", json={"force": True, "expect_owner": ""}, headers=OPS2)
    assert r.status_code == 200 and audit(api)[-1][2]["forced"] is False
    r = api.post("/v1/hosts/h2/cordon", json={"force": True, "expect_owner": ""}, headers=ADM)
    assert r.json()["error"]["message"] == (f"expected nobody to hold host h2, but host h2 is cordoned, held by ops2 "
                                            f"since {time_of(clock.t)} (no reason given)"), r.text


def time_of(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


def rollout_over(api, name: str, *hosts: str) -> int:  # type: ignore[no-untyped-def]
    """A rollout over ``hosts``, its lease taken by adm's controller ctl-1: the fence."""
    body = {"name": name, "kind": "convert", "policy_digest": "", "spec": {},
            "waves": [[{"name": h, "address": f"{h}:7443", "rack": "r1", "host": {}} for h in hosts]]}
    assert api.post("/v1/rollouts", json=body, headers=ADM).status_code == 201
    r = api.post(f"/v1/rollouts/{name}/lease", json={"holder": "ctl-1", "ttl_s": 30}, headers=ADM)
    assert r.status_code == 200, r.text
    return r.json()["fence"]


def test_a_rollouts_hold_is_taken_only_under_its_lease_and_a_stale_fence_is_refused(api, clock):
    """``rollout`` + ``fence``: the hold is recorded as rollout:<name>, only by the
    principal that took its lease, only on the rollout's hosts; once another
    controller takes the lease, the first one's fence is refused naming it."""
    fence = rollout_over(api, "r1", "h1")
    r = api.post("/v1/hosts/h1/cordon", json={"rollout": "r1", "fence": fence, "reason": "fleet-rollout r1"},
                 headers=ADM)
    assert r.status_code == 200 and (r.json()["admin_owner"], r.json()["admin_reason"]) == (
        "rollout:r1", "fleet-rollout r1"), r.text
    assert audit(api)[-1] == ("adm", "host.cordoned", {"from": "active", "owner": "rollout:r1", "reason":
                                                       "fleet-rollout r1", "forced": False, "previous_owner": "",
                                                       "fence": 1})
    before, trail = hold(api), audit(api)
    # another principal with the rollout's fence: not its lease
    r = api.post("/v1/hosts/h1/uncordon", json={"rollout": "r1", "fence": fence}, headers=OPS2)
    assert (r.status_code, r.json()["error"]["code"], r.json()["error"]["field"]) == (
        403, "hyb.rollout.not_yours", "fence"), r.text
    assert "the lease at fence 1 is adm's controller ctl-1's, not ops2's" in r.json()["error"]["message"]
    # the lease's own principal, as itself, is another owner than the rollout
    for who in (ADM, OPS2):
        assert api.post("/v1/hosts/h1/uncordon", headers=who).json()["error"]["code"] == "hyb.host.admin_owned"
    # a host that is not the rollout's
    r = api.post("/v1/hosts/h2/cordon", json={"rollout": "r1", "fence": fence}, headers=ADM)
    assert (r.status_code, r.json()["error"]["code"]) == (404, "hyb.rollout.host_not_found"), r.text
    assert hold(api) == before and audit(api) == trail and hold(api, "h2")["admin_state"] == "active"
    # the controller dies; another one (another principal) takes the lease: the old fence is stale
    clock.t += 30
    r = api.post("/v1/rollouts/r1/lease", json={"holder": "ctl-2", "ttl_s": 30}, headers=OPS2)
    assert r.json()["fence"] == 2, r.text
    r = api.post("/v1/hosts/h1/drain", json={"rollout": "r1", "fence": 1}, headers=ADM)
    assert r.status_code == 409 and r.json()["error"] == {
        "code": "hyb.rollout.stale_fence", "field": "fence",
        "message": f"rollout r1: fence 1 is stale: ops2's controller ctl-2 took the lease at fence 2 at "
                   f"{time_of(clock.t)}"}, r.text
    assert hold(api) == before and audit(api) == trail
    r = api.post("/v1/hosts/h1/uncordon", json={"rollout": "r1", "fence": 2}, headers=OPS2)  # the rollout's own hold
    assert r.status_code == 200 and r.json()["admin_state"] == "active", r.text
    assert audit(api)[-1][0] == "ops2" and audit(api)[-1][2]["previous_owner"] == "rollout:r1"


def test_no_body_behaves_as_before(api):
    for verb, state in (("cordon", "cordoned"), ("drain", "draining"), ("uncordon", "active"), ("uncordon", "active")):
        r = api.post(f"/v1/hosts/h1/{verb}", headers=ADM)
        assert r.status_code == 200 and r.json()["admin_state"] == state, (verb, r.text)
    for body in (b"{}", b"null"):  # no change either
        r = api.post("/v1/hosts/h1/cordon", content=body, headers=ADM | {"Content-Type": "application/json"})
        assert r.status_code == 200 and r.json()["admin_owner"] == "adm", (body, r.text)
    assert [(p, a, d["owner"]) for p, a, d in audit(api)] == [
        ("adm", "host.cordoned", "adm"), ("adm", "host.draining", "adm"), ("adm", "host.active", "adm"),
        ("adm", "host.active", "adm"), ("adm", "host.cordoned", "adm"), ("adm", "host.cordoned", "adm")]
    assert api.post("/v1/hosts/h1/uncordon", headers=HOST).status_code == 403  # still admin only
    assert api.post("/v1/hosts/nope/cordon", headers=ADM).json()["error"]["code"] == "hyb.host.not_found"


def test_a_bad_body_names_the_field_and_changes_nothing(api):
    assert api.post("/v1/hosts/h1/cordon", json={"reason": "r"}, headers=ADM).status_code == 200
    before, trail = hold(api), audit(api)
    cases = [({"reason": "r", "surprise": 1}, "surprise"), ({"reason": "x" * 257}, "reason"),
             ({"force": "yes"}, "force"), ({"force": True}, "expect_owner"), ({"expect_owner": "a\nb"}, "expect_owner"),
             ({"expect_owner": "a" * 129}, "expect_owner"), ({"rollout": "r1"}, "fence"), ({"fence": 1}, "fence"),
             ({"rollout": "-r", "fence": 1}, "rollout"), ({"rollout": "r1", "fence": 0}, "fence"),
             ({"rollout": "r1", "fence": "1"}, "fence"), ([1], "body")]
    for verb in ("cordon", "drain", "uncordon"):
        for body, field in cases:
            r = api.post(f"/v1/hosts/h1/{verb}", json=body, headers=ADM)
            assert r.status_code == 422, (verb, body, r.text)
            err = r.json()["error"]
            assert err["code"] == "hyb.request.invalid" and err["field"] == field, (verb, body, err)
    assert hold(api) == before and audit(api) == trail


def blocked_writers(store: Store) -> int:
    """Writers of this process waiting for ``store``'s database: on PostgreSQL, sessions of
    the database waiting for a lock; on SQLite, waiters for the writer lock's ``flock``
    (``/proc/locks`` marks a waiter with ``->``)."""
    if not store.sqlite:
        with store.engine.connect() as c:
            return c.exec_driver_sql("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                     "AND wait_event_type = 'Lock'").scalar()
    inode = os.stat(f"{store.engine.url.database}.writer-lock").st_ino
    return sum(1 for ln in Path("/proc/locks").read_text().splitlines()
               if "->" in ln and ln.split()[-3].endswith(f":{inode}") and ln.split()[-4] == str(os.getpid()))


def test_two_owners_at_once_are_judged_one_after_the_other(api, clock, db_url):
    """The change reads the host under its row lock (PostgreSQL) or the writer lock
    (SQLite): a second owner that asks while the first one's cordon is being written
    sees that cordon, and is refused, instead of overwriting it. The first writer is a
    store of its own (another replica's), so that the second one's wait is one the
    database or the kernel shows."""
    svc = api.app.state.hosts
    first = Store.from_url(db_url)
    got: list[object] = []

    def second() -> None:
        try:
            got.append(svc.set_state("h1", "cordoned", actor="ops2", change=AdminChange()))
        except HostAdminOwned as e:
            got.append(e)

    t = threading.Thread(target=second)
    try:
        with first.write() as s:
            host_repo.get_host(session=s, name="h1", lock=True)
            t.start()
            deadline = time.monotonic() + 10
            while not blocked_writers(first):
                assert time.monotonic() < deadline and t.is_alive(), \
                    f"the second change never waited for the first one's lock (it got {got})"
                time.sleep(0.01)
            host_repo.set_admin_state(session=s, name="h1", state="cordoned", now=clock.t, owner="adm",
                                      reason="first", since=clock.t)
    finally:
        first.dispose()
    t.join(timeout=10)
    assert len(got) == 1 and isinstance(got[0], HostAdminOwned), got
    assert hold(api)["admin_owner"] == "adm"


def test_migration_0009_keeps_hosts_and_leaves_older_cordons_to_anyone(db_url, clock):
    """A host cordoned before 0009 has no owner: anyone may change it (and then owns it);
    a downgrade keeps the hosts and their admin states, without their owners."""
    store = Store.from_url(db_url)
    try:
        upgrade(store.engine, "0008")
        hosts = Table("hosts", MetaData(), autoload_with=store.engine)
        body = host_body("old")
        with store.engine.begin() as c:
            c.execute(hosts.insert().values(
                name="old", address=body["address"], rack="", labels={}, layout=body["layout"],
                siblings=body["cpu_siblings"], pf_min_rate={}, disk_classes={}, layout_rev=1, usage={}, generation=1,
                admin_state="cordoned", last_heartbeat=clock.t, seq=0, created=clock.t, updated=clock.t))
        upgrade(store.engine)
    finally:
        store.dispose()
    with make_client(db_url, clock=clock, auth={"tokens": TOKENS}) as api:
        assert hold(api, "old") == {"admin_state": "cordoned", "admin_owner": "", "admin_reason": "",
                                    "admin_since": None, "generation": 1}
        r = api.post("/v1/hosts/old/drain", json={"reason": "found cordoned", "expect_owner": ""}, headers=OPS2)
        assert r.status_code == 200 and (r.json()["admin_owner"], r.json()["admin_since"]) == ("ops2", clock.t)
        assert audit(api)[-1][2] == {"from": "cordoned", "owner": "ops2", "reason": "found cordoned", "forced": False,
                                     "previous_owner": ""}
        assert api.post("/v1/hosts/old/uncordon", headers=ADM).status_code == 409  # owned from now on
    store = Store.from_url(db_url)
    try:
        downgrade(store.engine, "0008")
        with store.engine.connect() as c:
            hosts = Table("hosts", MetaData(), autoload_with=c)
            assert "admin_owner" not in hosts.c
            assert c.execute(hosts.select().with_only_columns(hosts.c.name, hosts.c.admin_state)).all() == [
                ("old", "draining")]
        upgrade(store.engine)
        with store.engine.connect() as c:
            hosts = Table("hosts", MetaData(), autoload_with=c)
            assert c.execute(hosts.select().with_only_columns(hosts.c.admin_state, hosts.c.admin_owner,
                                                              hosts.c.admin_since)).all() == [("draining", "", None)]
    finally:
        store.dispose()
