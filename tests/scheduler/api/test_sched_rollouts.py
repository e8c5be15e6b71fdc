"""/v1/rollouts: fleet-rollout's durable state kept by the scheduler. A host belongs to at
most one active rollout (409 hyb.rollout.overlap, atomic against a concurrent create);
a controller writes under the rollout's lease, each write carrying the fence the
scheduler handed out with it (the test clock lapses it), with a compare-and-set on each
host's state; the operator's verbs need no lease and say which state they replace. In
process over a real store: SQLite, and PostgreSQL (integration). Fences across
principals, and a rollout's holds on hosts: test_sched_admin_owner.py."""

from __future__ import annotations

import logging
import sqlite3
import threading
from datetime import datetime, timezone

import pytest
from sqlalchemy import event, func, select

from fastapi.testclient import TestClient
from sched_helpers import ADM, HOST, TA, Clock, host_body, settings
from scheduler.api.app import create_app
from scheduler.db.engine import Store
from scheduler.db.migrate import upgrade
from scheduler.db.models import RolloutHost, RolloutTransition

SPEC = {"name": "convert-r12", "kind": "convert", "limits": {"concurrency": 4, "per_rack": 1},
        "gates": [{"metric": "psi", "max": 0.25}, {"metric": "probe_p99_ms", "max": 5}],
        "policy": "[io]\ncores = 2\n", "zeta": None, "alpha": "ünïcode ✓"}  # key order is kept too
DIGEST = "ab" * 32
TERMINAL = ("done", "aborted", "rolled_back")
STATES = ("running", "paused", "halted", "aborting", "aborted", "rolling_back", "rolled_back", "done")
ALLOWED = {"pause": ("paused", ("running",)), "resume": ("running", ("paused", "halted", "done")),
           "abort": ("aborting", ("running", "paused", "halted", "aborting")),
           "rollback": ("rolling_back", ("running", "paused", "halted", "done", "aborted", "rolling_back"))}


def host_in(name: str, rack: str = "r1") -> dict:
    return {"name": name, "address": f"{name}:7443", "rack": rack,
            "host": {"name": name, "address": f"{name}:7443", "rack": rack, "labels": {"disk": "nvme"},
                     "admin_state": "active"}}


def rollout_body(name: str, *waves: list[str], **kw) -> dict:  # type: ignore[no-untyped-def]
    return {"name": name, "kind": "convert", "policy_digest": DIGEST, "spec": SPEC,
            "waves": [[host_in(h) for h in w] for w in waves], **kw}


def create(api, name: str, *waves: list[str], **kw):  # type: ignore[no-untyped-def]
    r = api.post("/v1/rollouts", json=rollout_body(name, *waves, **kw), headers=ADM)
    assert r.status_code == 201, r.text
    return r.json()


def take(api, name: str, holder: str = "ctl-1", ttl_s: float = 30, **kw):  # type: ignore[no-untyped-def]
    return api.post(f"/v1/rollouts/{name}/lease", json={"holder": holder, "ttl_s": ttl_s, **kw}, headers=ADM)


def move(api, name: str, host: str, frm: str, to: str, fence: int = 1, **kw):  # type: ignore[no-untyped-def]
    return api.post(f"/v1/rollouts/{name}/hosts/{host}/transition",
                    json={"fence": fence, "from": frm, "to": to, **kw}, headers=ADM)


def state_of(api, name: str) -> str:  # type: ignore[no-untyped-def]
    return api.get(f"/v1/rollouts/{name}", headers=ADM).json()["state"]


def set_state(api, name: str, state: str, fence: int = 1, **kw):  # type: ignore[no-untyped-def]
    """The controller's state change; ``expect``: the state now, unless given."""
    kw.setdefault("expect", state_of(api, name))
    return api.post(f"/v1/rollouts/{name}/state", json={"fence": fence, "state": state, **kw}, headers=ADM)


def verb(api, name: str, verb: str, expect: str | None = None, **kw):  # type: ignore[no-untyped-def]
    """An operator's verb; ``expect``: the state now, unless given."""
    return api.post(f"/v1/rollouts/{name}/{verb}", json={"expect": expect or state_of(api, name), **kw},
                    headers=ADM)


def error(r) -> tuple[int, str, str | None, str]:  # type: ignore[no-untyped-def]
    e = r.json()["error"]
    return r.status_code, e["code"], e["field"], e["message"]


def audit(api, name: str) -> list[tuple[str, str, dict]]:  # type: ignore[no-untyped-def]
    """The rollout's audit rows, oldest first: (principal, action, detail)."""
    items = api.get(f"/v1/audit?action=rollout.&target={name}&limit=100", headers=ADM).json()["items"]
    return [(a["principal"], a["action"], a["detail"]) for a in reversed(items)]


def test_create_list_show_hosts_and_transitions_round_trip(api, clock):
    skipped = [{"host": "h9", "reason": "hostd refused PlanCarve: no IO cores"}]
    out = create(api, "convert-r12", ["h1"], ["h2", "h3"], skipped=skipped)
    assert out == {"name": "convert-r12", "kind": "convert", "policy_digest": DIGEST, "spec": SPEC,
                   "state": "running", "reason": "", "wave": 0, "waves": 2, "skipped": skipped,
                   "created": clock.t, "updated": clock.t, "created_by": "adm", "lease": None,
                   "counts": [{"pending": 1}, {"pending": 2}]}
    assert list(out["spec"]) == list(SPEC)  # returned as given, in its order
    assert api.get("/v1/rollouts/convert-r12", headers=ADM).json() == out
    clock.t += 1
    create(api, "upgrade-r13", ["h4"])
    assert [r["name"] for r in api.get("/v1/rollouts", headers=ADM).json()["items"]] == ["convert-r12", "upgrade-r13"]
    assert api.get("/v1/rollouts", headers=ADM).json()["items"][0] == out

    hosts = api.get("/v1/rollouts/convert-r12/hosts", headers=ADM).json()["items"]
    assert [(h["name"], h["wave"], h["seq"], h["state"], h["data"]) for h in hosts] == [
        ("h1", 0, 0, "pending", {}), ("h2", 1, 1, "pending", {}), ("h3", 1, 2, "pending", {})]
    assert hosts[1] == {**{k: host_in("h2")[k] for k in ("name", "address", "rack", "host")}, "wave": 1, "seq": 1,
                        "state": "pending", "data": {}, "updated": clock.t - 1}
    assert api.get("/v1/rollouts/convert-r12/hosts/h2", headers=ADM).json() == hosts[1]
    assert api.get("/v1/rollouts/convert-r12/transitions", headers=ADM).json()["items"] == [
        {"id": 1, "host": "-", "from": "", "to": "running", "at": clock.t - 1, "holder": "adm", "principal": "adm",
         "fence": None, "detail": {"hosts": 3, "waves": 2}}]
    assert audit(api, "convert-r12") == [("adm", "rollout.create", {"kind": "convert", "hosts": 3, "waves": 2})]

    # a controller's steps: data merges key by key; brief keeps only a set rollback_failed
    assert take(api, "convert-r12").status_code == 200
    baseline = {"psi": [0.01] * 500, "probe_p99_ms": 1.5}
    r = move(api, "convert-r12", "h1", "pending", "baselined", detail={"gate": "ok"},
             data={"baseline": baseline, "rollback_failed": False})
    assert r.status_code == 200 and r.json()["data"] == {"baseline": baseline, "rollback_failed": False}, r.text
    r = move(api, "convert-r12", "h1", "baselined", "failed", data={"prior_digest": "", "rollback_failed": True})
    assert r.json()["data"] == {"baseline": baseline, "rollback_failed": True, "prior_digest": ""}
    assert r.json()["state"] == "failed" and r.json()["host"] == host_in("h1")["host"]
    assert move(api, "convert-r12", "h2", "pending", "failed",
                data={"rollback_failed": "Uncarve refused: hyb.carve.conflict", "x": [1]}).status_code == 200
    brief = api.get("/v1/rollouts/convert-r12/hosts?brief=true", headers=ADM).json()["items"]
    assert [(h["name"], h["host"], h["data"], h["state"]) for h in brief] == [
        ("h1", None, {"rollback_failed": True}, "failed"),
        ("h2", None, {"rollback_failed": "Uncarve refused: hyb.carve.conflict"}, "failed"),
        ("h3", None, {}, "pending")]
    assert brief[2] == {**hosts[2], "host": None}
    assert [h["name"] for h in api.get("/v1/rollouts/convert-r12/hosts?wave=1&brief=true",
                                       headers=ADM).json()["items"]] == ["h2", "h3"]
    assert [h["name"] for h in api.get("/v1/rollouts/convert-r12/hosts?wave=0",
                                       headers=ADM).json()["items"]] == ["h1"]
    assert api.get("/v1/rollouts/convert-r12/hosts?wave=5", headers=ADM).json()["items"] == []
    assert api.get("/v1/rollouts/convert-r12", headers=ADM).json()["counts"] == [{"failed": 1},
                                                                                 {"failed": 1, "pending": 1}]
    h1 = api.get("/v1/rollouts/convert-r12/transitions?host=h1", headers=ADM).json()["items"]
    assert [(t["from"], t["to"], t["holder"], t["principal"], t["fence"], t["detail"]) for t in h1] == [
        ("pending", "baselined", "ctl-1", "adm", 1, {"gate": "ok"}), ("baselined", "failed", "ctl-1", "adm", 1, {})]
    assert [t["host"] for t in api.get("/v1/rollouts/convert-r12/transitions?host=-",
                                       headers=ADM).json()["items"]] == ["-"]


def test_overlap_is_refused_naming_the_rollouts_and_hosts_and_nothing_is_created(api):
    create(api, "a", [f"h{i:02}" for i in range(15)])
    create(api, "c", ["c1"])
    assert take(api, "c").status_code == 200 and set_state(api, "c", "paused").status_code == 200
    r = api.post("/v1/rollouts", json=rollout_body("b", ["x1", "h03"], [f"h{i:02}" for i in range(4, 15)]),
                 headers=ADM)
    assert error(r) == (409, "hyb.rollout.overlap", "waves",
                        "rollout b shares hosts with another active rollout (a host belongs to at most one): "
                        "a (running) holds h03, h04, h05, h06, h07, h08, h09, h10, h11, h12 and 2 more (`fleet-rollout "
                        "status a` shows it; it keeps them until it ends, or `fleet-rollout abort a`)")
    r = api.post("/v1/rollouts", json=rollout_body("d", ["c1"], ["x2", "h14"]), headers=ADM)
    assert error(r)[:2] == (409, "hyb.rollout.overlap")
    assert "shares hosts with 2 other active rollouts" in error(r)[3], r.text
    assert error(r)[3].endswith(": a (running) holds h14 (`fleet-rollout status a` shows it; it keeps them until "
                                "it ends, or `fleet-rollout abort a`); c (paused) holds c1 (a paused rollout keeps its hosts "
                                "until it is aborted: `fleet-rollout abort c` frees them, or `hybctl rollout "
                                "abort c` for its controller to act on)"), r.text
    for name in ("b", "d"):
        assert error(api.get(f"/v1/rollouts/{name}", headers=ADM))[:2] == (404, "hyb.rollout.not_found")
        assert audit(api, name) == []
    assert [r["name"] for r in api.get("/v1/rollouts", headers=ADM).json()["items"]] == ["a", "c"]
    store = api.app.state.store
    with store.read() as s:
        assert s.scalar(select(func.count()).select_from(RolloutHost).where(RolloutHost.rollout.in_(["b", "d"]))) == 0
        assert s.scalar(select(func.count()).select_from(RolloutTransition)
                        .where(RolloutTransition.rollout.in_(["b", "d"]))) == 0


@pytest.mark.parametrize("terminal", TERMINAL)
def test_an_ended_rollout_and_a_skipped_host_no_longer_block(api, terminal):
    create(api, "a", ["h1", "h2"])
    assert take(api, "a").status_code == 200
    assert move(api, "a", "h2", "pending", "skipped", detail={"reason": "held by alice@ops"}).status_code == 200
    create(api, "b", ["h2"])  # a skipped host is not held
    assert error(api.post("/v1/rollouts", json=rollout_body("c", ["h1"]), headers=ADM))[:2] == (
        409, "hyb.rollout.overlap")
    r = set_state(api, "a", terminal, reason="2 waves")
    assert r.status_code == 200 and (r.json()["state"], r.json()["reason"]) == (terminal, "2 waves"), r.text
    create(api, "c", ["h1"])


def test_the_list_holding_hosts_names_the_active_rollouts_that_hold_them(api):
    """``GET /v1/rollouts?holding=...``: only the active rollouts that hold any of the
    hosts asked about, each with the ones it holds (a skipped host is not held, an ended
    rollout holds none), as the overlap refusal counts them; without it, every rollout,
    without ``holds``."""
    create(api, "a", ["h1", "h2"], ["h3"])
    create(api, "b", ["h4"])
    create(api, "done-one", ["h5"])
    assert take(api, "done-one").status_code == 200 and set_state(api, "done-one", "done").status_code == 200
    assert take(api, "a", "ctl-a").status_code == 200
    assert move(api, "a", "h2", "pending", "skipped", detail={"reason": "held"}).status_code == 200

    def holders(*hosts: str) -> list[tuple[str, str, list[str]]]:
        r = api.get("/v1/rollouts", params={"holding": list(hosts)}, headers=ADM)
        assert r.status_code == 200, r.text
        return [(x["name"], x["state"], x["holds"]) for x in r.json()["items"]]
    assert holders("h3", "h1", "h2", "h5", "nope", "h1") == [("a", "running", ["h1", "h3"])]
    assert holders("h4", "h3") == [("a", "running", ["h3"]), ("b", "running", ["h4"])]
    assert holders("h2", "h5") == []
    every = api.get("/v1/rollouts", headers=ADM).json()["items"]
    assert [x["name"] for x in every] == ["a", "b", "done-one"] and not any("holds" in x for x in every)
    r = api.get("/v1/rollouts", params={"holding": [f"h{i}" for i in range(1001)]}, headers=ADM)
    assert r.status_code == 422 and "holding" in r.text, r.text


def test_an_ended_rollout_cannot_start_again_on_a_host_taken_since(api):
    """Resume and rollback apply to a done rollout (and rollback to an aborted one): it
    holds its hosts again, so not one that another rollout has taken since."""
    create(api, "a", ["h1", "h2"])
    assert take(api, "a").status_code == 200 and set_state(api, "a", "done").status_code == 200
    create(api, "c", ["h1"])
    refusal = (409, "hyb.rollout.overlap", None, "rollout a shares hosts with another active rollout "
                                                 "(a host belongs to at most one): c (running) holds h1 (`fleet-rollout "
                                                 "status c` shows it; it keeps them until it ends, or `fleet-rollout "
                                                 "abort c`)")
    for v in ("resume", "rollback"):
        assert error(verb(api, "a", v, "done")) == refusal
    assert error(set_state(api, "a", "running")) == refusal  # the controller's own change too
    assert api.get("/v1/rollouts/a", headers=ADM).json()["state"] == "done"
    assert audit(api, "a") == [("adm", "rollout.create", {"kind": "convert", "hosts": 2, "waves": 1})]
    assert take(api, "c", "ctl-c").status_code == 200 and set_state(api, "c", "aborted").status_code == 200
    assert verb(api, "a", "resume", "done").json()["state"] == "running"
    assert error(verb(api, "c", "rollback", "aborted"))[3].endswith(": a (running) holds h1 (`fleet-rollout status a` shows it; "
                                                                  "it keeps them until it ends, or `fleet-rollout abort a`)")


def test_a_halted_rollout_keeps_its_hosts_and_the_refusal_says_how_to_free_them(api):
    """Rollout y, over the hosts of x (done), halted: x's rollback is refused while y
    holds them, naming y as halted and the command that frees them; aborting y frees
    them once its controller has finished the abort."""
    create(api, "x", ["h1", "h2"])
    assert take(api, "x").status_code == 200 and set_state(api, "x", "done").status_code == 200
    create(api, "y", ["h1", "h2"])
    assert take(api, "y").status_code == 200
    assert set_state(api, "y", "halted", reason="wave 0: 1 failed hosts").status_code == 200
    r = verb(api, "x", "rollback", "done")
    assert error(r) == (409, "hyb.rollout.overlap", None,
                        "rollout x shares hosts with another active rollout (a host belongs to at most one): "
                        "y (halted) holds h1, h2 (a halted rollout keeps its hosts until it is aborted: "
                        "`fleet-rollout abort y` frees them, or `hybctl rollout abort y` for its controller "
                        "to act on)"), r.text
    assert verb(api, "y", "abort", "halted").json()["state"] == "aborting"
    assert error(verb(api, "x", "rollback", "done"))[3].endswith(
        ": y (aborting) holds h1, h2 (`fleet-rollout status y` shows it; it keeps them until it ends)")  # its run is on
    assert set_state(api, "y", "aborted", expect="aborting").status_code == 200  # y's controller ends it
    assert verb(api, "x", "rollback", "done").json()["state"] == "rolling_back"


def test_concurrent_overlapping_creates_one_wins(api):
    """The overlap check and the insert are one step (PostgreSQL: the creation lock;
    SQLite: the writer lock): of two creates that share hosts, sent at once, exactly one
    is created, whichever it is."""
    for rnd in range(4):
        shared = [f"s{rnd}-{i}" for i in range(800)]
        bodies = [rollout_body(f"r{rnd}-{k}", [f"own{rnd}-{k}-{i}" for i in range(800)], shared)
                  for k in range(2)]
        start = threading.Barrier(2)
        got: list[tuple[str, int, dict]] = []

        def send(body: dict) -> None:
            start.wait()
            r = api.post("/v1/rollouts", json=body, headers=ADM)
            got.append((body["name"], r.status_code, r.json()))
        threads = [threading.Thread(target=send, args=(b,)) for b in bodies]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert sorted(code for _, code, _ in got) == [201, 409], got
        (winner,), (loser,) = [[n for n, c, _ in got if c == want] for want in (201, 409)]
        refusal = next(body for _, c, body in got if c == 409)["error"]
        assert refusal["code"] == "hyb.rollout.overlap" and f": {winner} (running) holds s{rnd}-0, " in \
            refusal["message"], refusal
        assert error(api.get(f"/v1/rollouts/{loser}", headers=ADM))[0] == 404


T0 = "1970-01-12T13:46:40+00:00"  # the test clock's start


def test_a_host_step_is_a_compare_and_set_under_the_lease(api, clock):
    create(api, "r", ["h1", "h2"])
    assert error(move(api, "r", "h1", "pending", "baselined")) == (
        422, "hyb.request.invalid", "fence", "rollout r: fence 1 was never handed out (the latest is 0); take the "
                                            "lease (POST /v1/rollouts/r/lease) for one")
    assert take(api, "r", ttl_s=30).json() == {"holder": "ctl-1", "principal": "adm", "fence": 1, "taken": clock.t,
                                               "expires": clock.t + 30}
    assert move(api, "r", "h1", "pending", "baselined", data={"a": 1}).status_code == 200
    assert error(move(api, "r", "h1", "pending", "baselined")) == (
        409, "hyb.rollout.stale_state", "from", f"h1: expected state pending, found baselined (written by adm's "
                                                f"controller ctl-1 under fence 1 at {T0})")
    clock.t += 30  # the lease lapses (expiry is exclusive): the controller is fenced off
    assert error(move(api, "r", "h1", "baselined", "cordoned")) == (
        409, "hyb.rollout.lease_lost", "fence", f"rollout r: the lease at fence 1 (adm's controller ctl-1, taken at "
                                                f"{T0}) ended at 1970-01-12T13:47:10+00:00: it lapsed or was released")
    assert take(api, "r", "ctl-2").json()["fence"] == 2  # a lapsed lease is anyone's, with the next fence
    r = move(api, "r", "h1", "baselined", "cordoned", 2, data={"b": 2, "a": 3})
    assert r.status_code == 200 and r.json()["data"] == {"a": 3, "b": 2}, r.text
    assert error(move(api, "r", "h1", "cordoned", "carving")) == (
        409, "hyb.rollout.stale_fence", "fence", "rollout r: fence 1 is stale: adm's controller ctl-2 took the lease "
                                                 "at fence 2 at 1970-01-12T13:47:10+00:00")
    assert error(move(api, "r", "h1", "cordoned", "carving", 3))[:3] == (422, "hyb.request.invalid", "fence")
    assert error(move(api, "r", "h3", "pending", "baselined", 2))[:3] == (404, "hyb.rollout.host_not_found", "host")
    trail = api.get("/v1/rollouts/r/transitions?host=h1", headers=ADM).json()["items"]
    assert [(t["from"], t["to"], t["holder"], t["fence"], t["at"]) for t in trail] == [
        ("pending", "baselined", "ctl-1", 1, clock.t - 30), ("baselined", "cordoned", "ctl-2", 2, clock.t)]
    assert api.get("/v1/rollouts/r/hosts/h1", headers=ADM).json()["state"] == "cordoned"


def test_two_controllers_racing_for_the_lease_get_increasing_fences_and_the_losers_writes_are_refused(api, clock):
    """Two controllers ask for a free lease at once: one gets fence 1, the other is
    refused naming it. The winner dies (its lease lapses); the other takes fence 2; the
    first one's writes, every kind, are refused naming who took the lease and when."""
    create(api, "r", ["h1"], ["h2"])
    for rnd in range(3):
        start = threading.Barrier(2)
        got: dict[str, object] = {}

        def ask(holder: str) -> None:
            start.wait()
            got[holder] = take(api, "r", holder, 10)
        threads = [threading.Thread(target=ask, args=(h,)) for h in ("ctl-a", "ctl-b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        codes = {h: r.status_code for h, r in got.items()}  # type: ignore[attr-defined]
        assert sorted(codes.values()) == [200, 409], codes
        winner = next(h for h, c in codes.items() if c == 200)
        loser = next(h for h, c in codes.items() if c == 409)
        assert got[winner].json()["fence"] == 2 * rnd + 1  # type: ignore[attr-defined]
        assert error(got[loser])[:2] == (409, "hyb.rollout.lease_held")
        assert f"being run by adm's controller {winner} (fence {2 * rnd + 1}," in error(got[loser])[3]
        clock.t += 10  # the winner dies: its lease lapses
        assert take(api, "r", loser, 10).json()["fence"] == 2 * rnd + 2
        stale = (409, "hyb.rollout.stale_fence", "fence",
                 f"rollout r: fence {2 * rnd + 1} is stale: adm's controller {loser} took the lease at fence "
                 f"{2 * rnd + 2} at {datetime.fromtimestamp(clock.t, timezone.utc).isoformat()}")
        old = 2 * rnd + 1
        h = f"h{rnd % 2 + 1}"
        for r in (move(api, "r", h, state_of_host(api, h), "baselined", old),
                  api.post(f"/v1/rollouts/r/hosts/{h}/note", json={"fence": old, "detail": {}}, headers=ADM),
                  set_state(api, "r", "halted", old),
                  api.put("/v1/rollouts/r/lease", json={"fence": old, "ttl_s": 10}, headers=ADM)):
            assert error(r) == stale, r.text
        assert api.delete(f"/v1/rollouts/r/lease?fence={old}", headers=ADM).status_code == 204  # not its lease
        assert api.get("/v1/rollouts/r", headers=ADM).json()["lease"]["fence"] == 2 * rnd + 2
        clock.t += 10
    assert state_of(api, "r") == "running"
    assert [t["to"] for t in api.get("/v1/rollouts/r/transitions", headers=ADM).json()["items"]] == ["running"]


def state_of_host(api, host: str) -> str:  # type: ignore[no-untyped-def]
    return api.get(f"/v1/rollouts/r/hosts/{host}", headers=ADM).json()["state"]


def test_a_note_records_the_current_state_under_the_lease(api, clock):
    create(api, "r", ["h1"])
    note = {"fence": 1, "detail": {"gate": "undecided", "psi": 0.3}}
    assert error(api.post("/v1/rollouts/r/hosts/h1/note", json=note, headers=ADM))[:3] == (
        422, "hyb.request.invalid", "fence")
    assert take(api, "r").status_code == 200
    assert move(api, "r", "h1", "pending", "soaking").status_code == 200
    r = api.post("/v1/rollouts/r/hosts/h1/note", json=note, headers=ADM)
    assert r.status_code == 204 and r.content == b""
    assert api.get("/v1/rollouts/r/transitions?host=h1", headers=ADM).json()["items"][-1] == {
        "id": 3, "host": "h1", "from": "soaking", "to": "soaking", "at": clock.t, "holder": "ctl-1",
        "principal": "adm", "fence": 1, "detail": {"gate": "undecided", "psi": 0.3}}
    assert api.get("/v1/rollouts/r/hosts/h1", headers=ADM).json()["state"] == "soaking"
    assert error(api.post("/v1/rollouts/r/hosts/h9/note", json=note, headers=ADM))[:2] == (
        404, "hyb.rollout.host_not_found")


def test_the_controllers_state_change_is_fenced(api, clock):
    create(api, "r", ["h1"], ["h2"])
    assert error(set_state(api, "r", "running", wave=1))[:3] == (422, "hyb.request.invalid", "fence")
    assert take(api, "r").status_code == 200
    clock.t += 5
    r = set_state(api, "r", "running", wave=1, detail={"wave_done": 0, "failed": 0})
    assert r.status_code == 200 and (r.json()["wave"], r.json()["updated"]) == (1, clock.t), r.text
    r = set_state(api, "r", "halted", reason="wave 1: 1 failed hosts, over its budget of 0", detail={"failed": ["h2"]})
    assert (r.json()["state"], r.json()["wave"], r.json()["reason"]) == (
        "halted", 1, "wave 1: 1 failed hosts, over its budget of 0")
    trail = api.get("/v1/rollouts/r/transitions?host=-", headers=ADM).json()["items"]
    assert [(t["from"], t["to"], t["holder"], t["fence"], t["detail"]) for t in trail[1:]] == [
        ("running", "running", "ctl-1", 1, {"reason": "", "wave": 1, "wave_done": 0, "failed": 0}),
        ("running", "halted", "ctl-1", 1, {"reason": "wave 1: 1 failed hosts, over its budget of 0", "wave": None,
                                           "failed": ["h2"]})]
    assert error(set_state(api, "r", "running", wave=2))[:3] == (422, "hyb.request.invalid", "wave")
    assert error(set_state(api, "r", "finished"))[:3] == (422, "hyb.request.invalid", "state")
    assert error(set_state(api, "r", "done", 2))[:3] == (422, "hyb.request.invalid", "fence")
    assert api.get("/v1/rollouts/r", headers=ADM).json()["state"] == "halted"


def test_the_controllers_next_wave_does_not_overwrite_an_operators_pause(api, clock):
    """The controller decided from "running"; the operator paused meanwhile: its
    compare-and-set (``expect``) is refused, naming the pause, and the pause stands."""
    create(api, "r", ["h1"], ["h2"])
    assert take(api, "r").status_code == 200
    clock.t += 5
    assert verb(api, "r", "pause", "running").status_code == 200
    assert error(set_state(api, "r", "running", wave=1, expect="running")) == (
        409, "hyb.rollout.stale_state", "expect", "rollout r: expected state running, found paused (pause by adm at "
                                                  "1970-01-12T13:46:45+00:00)")
    got = api.get("/v1/rollouts/r", headers=ADM).json()
    assert (got["state"], got["wave"]) == ("paused", 0)
    assert set_state(api, "r", "paused", reason="gate undecided", expect="paused").status_code == 200


def test_operator_verbs_apply_to_their_states_only(api, clock):
    create(api, "r", ["h1"])
    assert take(api, "r", ttl_s=3600).status_code == 200  # a controller runs it; the operator needs no lease
    for state in STATES:
        for v, (to, allowed) in ALLOWED.items():
            assert set_state(api, "r", state).status_code == 200
            clock.t += 1
            other = next(x for x in STATES if x != state)
            r = verb(api, "r", v, other)  # what the operator saw is not what it is now: refused, whatever the verb
            assert error(r)[:3] == (409, "hyb.rollout.stale_state", "expect"), r.text
            assert error(r)[3].startswith(f"rollout r: expected state {other}, found {state} (written by adm's "
                                          "controller ctl-1 under fence 1 at "), r.text
            r = verb(api, "r", v, state)
            if state not in allowed:
                assert error(r) == (409, "hyb.rollout.bad_state", None,
                                    f"rollout r is {state}: {v} applies to {' or '.join(allowed)}"), r.text
                continue
            assert r.status_code == 200, (state, v, r.text)
            assert (r.json()["state"], r.json()["reason"], r.json()["updated"]) == (to, f"{v} by adm", clock.t)
            assert r.json()["lease"]["holder"] == "ctl-1"
            t = api.get("/v1/rollouts/r/transitions?host=-", headers=ADM).json()["items"][-1]
            assert (t["from"], t["to"], t["holder"], t["principal"], t["fence"], t["detail"]) == (
                state, to, f"{v} by adm", "adm", None, {"reason": f"{v} by adm", "wave": None})
            assert audit(api, "r")[-1] == ("adm", f"rollout.{v}", {"from": state, "to": to, "reason": ""})
    assert set_state(api, "r", "running").status_code == 200
    r = verb(api, "r", "pause", "running", reason="change freeze")
    assert (r.json()["state"], r.json()["reason"]) == ("paused", "pause by adm: change freeze")
    assert audit(api, "r")[-1][2] == {"from": "running", "to": "paused", "reason": "change freeze"}
    assert error(verb(api, "r", "resume", "paused", force=True))[:3] == (422, "hyb.request.invalid", "force")
    assert error(api.post("/v1/rollouts/r/resume", json={"reason": "x"}, headers=ADM))[:3] == (
        422, "hyb.request.invalid", "expect")
    assert error(api.post("/v1/rollouts/r/resume", headers=ADM))[:2] == (422, "hyb.request.invalid")


def test_the_lease_is_taken_renewed_released_and_replaced_by_its_fence(api, clock):
    create(api, "r", ["h1"])
    assert take(api, "r", "ctl-1", 30).json() == {"holder": "ctl-1", "principal": "adm", "fence": 1,
                                                  "taken": clock.t, "expires": clock.t + 30}
    assert api.get("/v1/rollouts/r", headers=ADM).json()["lease"] == {
        "holder": "ctl-1", "principal": "adm", "fence": 1, "taken": clock.t, "expires": clock.t + 30}
    assert error(take(api, "r", "ctl-2")) == (
        409, "hyb.rollout.lease_held", "holder",
        "rollout r is being run by adm's controller ctl-1 (fence 1, lease until 1970-01-12T13:47:10+00:00; it lapses "
        "if that run dies, or send replace_fence 1 to take it from a controller found dead)")
    assert error(take(api, "r", "ctl-2", replace_fence=0))[:2] == (409, "hyb.rollout.lease_held")
    assert error(take(api, "r", "ctl-1"))[:2] == (409, "hyb.rollout.lease_held")  # its own too: by its fence
    clock.t += 10
    assert take(api, "r", "ctl-1", 30, replace_fence=1).json()["fence"] == 2
    assert take(api, "r", "ctl-2", 30, replace_fence=2).json() == {"holder": "ctl-2", "principal": "adm", "fence": 3,
                                                                   "taken": clock.t, "expires": clock.t + 30}
    renew = {"fence": 2, "ttl_s": 30}
    assert error(api.put("/v1/rollouts/r/lease", json=renew, headers=ADM)) == (
        409, "hyb.rollout.stale_fence", "fence", "rollout r: fence 2 is stale: adm's controller ctl-2 took the lease "
                                                 "at fence 3 at 1970-01-12T13:46:50+00:00")
    clock.t += 20
    r = api.put("/v1/rollouts/r/lease", json={"fence": 3, "ttl_s": 60}, headers=ADM)
    assert r.json() == {"holder": "ctl-2", "principal": "adm", "fence": 3, "taken": clock.t - 20,
                        "expires": clock.t + 60}, r.text
    assert api.delete("/v1/rollouts/r/lease?fence=2", headers=ADM).status_code == 204  # not the live one
    assert api.get("/v1/rollouts/r", headers=ADM).json()["lease"]["holder"] == "ctl-2"
    r = api.delete("/v1/rollouts/r/lease?fence=3", headers=ADM)
    assert r.status_code == 204 and r.content == b""
    assert api.get("/v1/rollouts/r", headers=ADM).json()["lease"] is None
    assert error(api.put("/v1/rollouts/r/lease", json={"fence": 3, "ttl_s": 5}, headers=ADM))[:2] == (
        409, "hyb.rollout.lease_lost")
    # a released or lapsed lease is anyone's, and its fence is never handed out again
    assert take(api, "r", "ctl-3", 5).json()["fence"] == 4
    clock.t += 5
    assert api.get("/v1/rollouts/r", headers=ADM).json()["lease"] is None
    assert api.get("/v1/rollouts", headers=ADM).json()["items"][0]["lease"] is None
    assert error(api.put("/v1/rollouts/r/lease", json={"fence": 4, "ttl_s": 5}, headers=ADM))[3].endswith(
        "ended at 1970-01-12T13:47:15+00:00: it lapsed or was released")
    assert take(api, "r", "ctl-4").json()["fence"] == 5


def test_a_bad_request_names_the_field_and_changes_nothing(api):
    create(api, "r", ["h1"])
    assert take(api, "r").status_code == 200
    good = rollout_body("n", ["x1"])
    dup = rollout_body("n", ["x1", "x2"], ["x3", "x1"])
    move_to = {"fence": 1, "from": "pending", "to": "baselined"}
    cases = [
        ("post", "/v1/rollouts", {**good, "name": "-n"}, "name"),
        ("post", "/v1/rollouts", {**good, "name": "n" * 65}, "name"),
        ("post", "/v1/rollouts", {**good, "name": "a b"}, "name"),
        ("post", "/v1/rollouts", {**good, "kind": ""}, "kind"),
        ("post", "/v1/rollouts", {**good, "kind": "k" * 17}, "kind"),
        ("post", "/v1/rollouts", {**good, "policy_digest": "ab" * 31}, "policy_digest"),
        ("post", "/v1/rollouts", {**good, "spec": [1]}, "spec"),
        ("post", "/v1/rollouts", {**good, "waves": []}, "waves"),
        ("post", "/v1/rollouts", {**good, "waves": [[host_in("x1")], []]}, "waves[1]"),
        ("post", "/v1/rollouts", dup, "waves"),
        ("post", "/v1/rollouts", {**good, "waves": [[{**host_in("x1"), "name": "-"}]]}, "waves[0][0].name"),
        ("post", "/v1/rollouts", {**good, "waves": [[{**host_in("x1"), "cpu": 1}]]}, "waves[0][0].cpu"),
        ("post", "/v1/rollouts", {**good, "waves": [[{**host_in("x1"), "rack": "r" * 65}]]}, "waves[0][0].rack"),
        ("post", "/v1/rollouts", {**good, "skipped": [{"host": "x9"}]}, "skipped[0].reason"),
        ("post", "/v1/rollouts", {**good, "surprise": 1}, "surprise"),
        ("post", "/v1/rollouts/r/lease", {"holder": "ctl-2", "ttl_s": 0}, "ttl_s"),
        ("post", "/v1/rollouts/r/lease", {"holder": "ctl-2", "ttl_s": 3601}, "ttl_s"),
        ("post", "/v1/rollouts/r/lease", {"holder": "", "ttl_s": 5}, "holder"),
        ("post", "/v1/rollouts/r/lease", {"holder": "ctl\n2", "ttl_s": 5}, "holder"),
        ("post", "/v1/rollouts/r/lease", {"holder": "h" * 256, "ttl_s": 5}, "holder"),
        ("post", "/v1/rollouts/r/lease", {"holder": "ctl-2", "ttl_s": 5, "replace_holder": "ctl-1"},
         "replace_holder"),
        ("post", "/v1/rollouts/r/lease", {"holder": "ctl-2", "ttl_s": 5, "replace_fence": -1}, "replace_fence"),
        ("put", "/v1/rollouts/r/lease", {"fence": 1, "ttl_s": 5, "replace_fence": 1}, "replace_fence"),
        ("put", "/v1/rollouts/r/lease", {"holder": "ctl-1", "ttl_s": 5}, "fence"),
        ("post", "/v1/rollouts/r/hosts/h1/transition", {"fence": 1, "to": "baselined"}, "from"),
        ("post", "/v1/rollouts/r/hosts/h1/transition", {**move_to, "to": "Bad State"}, "to"),
        ("post", "/v1/rollouts/r/hosts/h1/transition", {**move_to, "from_": "pending"}, "from_"),
        ("post", "/v1/rollouts/r/hosts/h1/transition", {**move_to, "data": [1]}, "data"),
        ("post", "/v1/rollouts/r/hosts/h1/transition", {**move_to, "fence": 0}, "fence"),
        ("post", "/v1/rollouts/r/hosts/h1/transition", {**move_to, "fence": "1"}, "fence"),
        ("post", "/v1/rollouts/r/hosts/h1/transition", {**move_to, "holder": "ctl-1"}, "holder"),
        ("post", "/v1/rollouts/r/hosts/h1/note", {"fence": 1}, "detail"),
        ("post", "/v1/rollouts/r/state", {"fence": 1, "state": "running", "expect": "running", "wave": -1}, "wave"),
        ("post", "/v1/rollouts/r/state", {"fence": 1, "state": "running"}, "expect"),
        ("post", "/v1/rollouts/r/pause", {"expect": "running", "reason": 5}, "reason"),
        ("post", "/v1/rollouts/r/pause", {"expect": "started"}, "expect"),
    ]
    for method, path, body, field in cases:
        r = getattr(api, method)(path, json=body, headers=ADM)
        assert error(r)[:3] == (422, "hyb.request.invalid", field), (path, body, r.text)
    # NaN, which Python's JSON reader takes and no JSON answer could carry back
    raw = b'{"fence": 1, "from": "pending", "to": "baselined", "detail": {"psi": NaN}}'
    r = api.post("/v1/rollouts/r/hosts/h1/transition", content=raw, headers=ADM | {"Content-Type": "application/json"})
    assert error(r)[:3] == (422, "hyb.request.invalid", "detail"), r.text
    for path in ("/v1/rollouts/r/lease", "/v1/rollouts/r/lease?fence=", "/v1/rollouts/r/lease?fence=0",
                 "/v1/rollouts/r/lease?holder=ctl-1"):
        assert error(api.delete(path, headers=ADM))[:3] == (422, "hyb.request.invalid", "fence"), path
    assert error(api.get("/v1/rollouts/r/hosts?wave=-1", headers=ADM))[:3] == (422, "hyb.request.invalid", "wave")
    assert [r["name"] for r in api.get("/v1/rollouts", headers=ADM).json()["items"]] == ["r"]
    assert api.get("/v1/rollouts/r/hosts/h1", headers=ADM).json()["state"] == "pending"
    assert len(api.get("/v1/rollouts/r/transitions", headers=ADM).json()["items"]) == 1
    assert api.get("/v1/rollouts/r", headers=ADM).json()["lease"]["holder"] == "ctl-1"


def routes(name: str = "r", host: str = "h1") -> list[tuple[str, str, dict | None]]:
    """Every rollout route with a valid body."""
    base = f"/v1/rollouts/{name}"
    return [("post", "/v1/rollouts", rollout_body(name, [host])), ("get", "/v1/rollouts", None),
            ("get", base, None), ("get", f"{base}/hosts?brief=true", None), ("get", f"{base}/hosts/{host}", None),
            ("get", f"{base}/transitions", None),
            ("post", f"{base}/hosts/{host}/transition", {"fence": 1, "from": "pending", "to": "baselined"}),
            ("post", f"{base}/hosts/{host}/note", {"fence": 1, "detail": {}}),
            ("post", f"{base}/state", {"fence": 1, "state": "paused", "expect": "running"}),
            *[("post", f"{base}/{v}", {"expect": "running"}) for v in ALLOWED],
            ("post", f"{base}/lease", {"holder": "c", "ttl_s": 5}),
            ("put", f"{base}/lease", {"fence": 1, "ttl_s": 5}), ("delete", f"{base}/lease?fence=1", None)]


def call(api, method: str, path: str, body: dict | None, headers: dict):  # type: ignore[no-untyped-def]
    return api.request(method.upper(), path, json=body, headers=headers)


def test_unknown_rollouts_and_hosts_are_404(api):
    for method, path, body in routes("nope")[2:]:
        r = call(api, method, path, body, ADM)
        assert error(r)[:3] == (404, "hyb.rollout.not_found", "name"), (method, path, r.text)
    create(api, "r", ["h1"])
    assert take(api, "r", "c").status_code == 200
    for method, path, body in [x for x in routes("r", "h9") if "/hosts/" in x[1]]:
        r = call(api, method, path, body, ADM)
        assert error(r) == (404, "hyb.rollout.host_not_found", "host", "rollout r has no host 'h9'"), (path, r.text)


def test_every_route_is_admin_only(api):
    create(api, "r", ["h1"])
    before = api.get("/v1/rollouts", headers=ADM).json()
    for token in (TA, HOST):
        for method, path, body in routes("r"):
            r = call(api, method, path, body, token)
            assert error(r)[:2] == (403, "hyb.auth.forbidden"), (method, path, r.text)
    assert api.get("/v1/rollouts", headers=ADM).json() == before
    assert len(api.get("/v1/rollouts/r/transitions", headers=ADM).json()["items"]) == 1


def sqlite_api(tmp_path, clock: Clock, **store_kw) -> tuple[TestClient, Store]:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path}/sched.db"
    store = Store.from_url(url, **store_kw)
    upgrade(store.engine)
    return TestClient(create_app(settings(url), store=store, clock=clock), raise_server_exceptions=False), store


def test_a_database_failure_is_503_naming_the_cause(tmp_path, clock, caplog):
    """A database that cannot grow (here: SQLite's page limit, as a full disk does) fails
    the write; the answer says so, and nothing of the request is left."""
    client, store = sqlite_api(tmp_path, clock)
    with client as api:
        create(api, "small", ["h1"])

        @event.listens_for(store.engine, "connect")
        def _full(dbapi_conn, _rec):  # type: ignore[no-untyped-def]
            pages = dbapi_conn.execute("PRAGMA page_count").fetchone()[0]
            dbapi_conn.execute(f"PRAGMA max_page_count = {pages}")
        store.engine.dispose()  # new connections: the database cannot grow
        big = rollout_body("big", [f"h{i}" for i in range(2, 2000)])
        with caplog.at_level(logging.ERROR, logger="scheduler.api.errors"):
            r = api.post("/v1/rollouts", json=big, headers=ADM)
        assert r.status_code == 503 and r.json() == {"error": {
            "code": "hyb.store.unavailable", "field": None,
            "message": "the scheduler's database: database or disk is full"}}, r.text
        assert any(rec.exc_info and "database or disk is full" in str(rec.exc_info[1]) for rec in caplog.records)
        assert [x["name"] for x in api.get("/v1/rollouts", headers=ADM).json()["items"]] == ["small"]


def test_a_locked_database_is_503_on_the_heartbeat_fast_path_too(tmp_path, clock):
    """The fast path answers as the error mapper does: a writer lock not granted within the
    busy timeout (another process holds it) is the store's unavailability, not a crash."""
    client, store = sqlite_api(tmp_path, clock, busy_timeout_ms=100)
    with client as api:
        assert api.post("/v1/hosts", json=host_body("h1"), headers=HOST).status_code == 201
        other = sqlite3.connect(store.engine.url.database, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # not through the store's own writer lock: another program
            r = api.post("/v1/hosts/h1/heartbeat", headers=HOST)
        finally:
            other.close()
        assert r.status_code == 503 and r.json() == {"error": {
            "code": "hyb.store.unavailable", "field": None,
            "message": "the scheduler's database: database is locked"}}, r.text
        assert api.post("/v1/hosts/h1/heartbeat", headers=HOST).status_code == 200
