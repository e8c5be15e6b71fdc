"""Heartbeats answered from memory (issue 28's first part): in steady state a beat opens
no database connection; who may beat comes from the placement index, which follows the
change feed (so another replica's registration, owner and admin state reach it); the
liveness column is written at most once per ``placement.heartbeat_write_s`` a host,
whatever the beat rate; refusals still go through the database and are audited.
TestClient over a real store (SQLite; PostgreSQL under the integration marker); two
app instances on one database are two replicas."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import pytest
from sqlalchemy import event

from sched_helpers import ADM, HOST, Clock, auth, host_body, make_client

from api.bounds import RETRY_AFTER_JITTER
from scheduler.liveness_rule import lag_window

T0 = 1_764_000_000.0
BUFFERED = {"stats": {"heartbeat_flush_s": 30}, "placement": {"heartbeat_write_s": 5}}


@contextlib.contextmanager
def connections(api) -> Iterator[list[int]]:  # type: ignore[no-untyped-def]
    """Counts the database connections the app checks out of its pool meanwhile."""
    got: list[int] = []
    engine = api.app.state.store.engine

    def checkout(*_a) -> None:  # type: ignore[no-untyped-def]
        got.append(1)
    event.listen(engine, "checkout", checkout)
    try:
        yield got
    finally:
        event.remove(engine, "checkout", checkout)


def warm(api, clock: Clock) -> None:  # type: ignore[no-untyped-def]
    """What the flusher's loop does every flush: the index read up to now."""
    svc = api.app.state.hosts
    svc.cache.refresh(api.app.state.store, now=clock.t, fresh=True)


def test_a_steady_heartbeat_touches_no_database(db_url) -> None:
    clock = Clock(T0)
    with make_client(db_url, clock=clock, **BUFFERED) as api:
        assert api.post("/v1/hosts", json=host_body("oss-1"), headers=HOST).status_code == 201
        warm(api, clock)
        with connections(api) as used:
            for i in range(20):
                clock.t = T0 + i
                r = api.post("/v1/hosts/oss-1/heartbeat", headers=HOST)
                assert r.status_code == 200, r.text
                assert r.json() == {"name": "oss-1", "state": "active", "generation": 1, "last_heartbeat": T0 + i}
        assert used == []
        # refusals and unknown hosts still ask the database (and audit)
        r = api.post("/v1/hosts/oss-1/heartbeat", headers=auth("hst2"))
        assert r.status_code == 403 and r.json()["error"]["code"] == "hyb.host.not_yours"
        # a token bound to oss-1, but another principal registered oss-1
        assert api.post("/v1/hosts/oss-1/heartbeat", headers=auth("oss1")).status_code == 403
        assert api.post("/v1/hosts/nope/heartbeat", headers=HOST).status_code == 404
        denied = [a for a in api.get("/v1/audit", headers=ADM).json()["items"] if a["action"] == "host.heartbeat.denied"]
        assert len(denied) == 2


def test_a_replica_builds_its_index_before_it_takes_a_beat(db_url) -> None:
    """A replica started on a fleet already registered answers its very first beat from
    memory: the index's first pass runs in the app's start, before the server opens its
    port (it used to run at the first claim or flush, and a replica started under the
    fleet's beats answered them from the database meanwhile and fell behind on liveness).
    A database without the schema yet leaves the index cold and the app still starts."""
    clock = Clock(T0)
    with make_client(db_url, clock=clock, **BUFFERED) as a:
        for n in ("oss-1", "oss-2"):
            assert a.post("/v1/hosts", json=host_body(n), headers=HOST).status_code == 201
        with make_client(db_url, clock=clock, **BUFFERED) as b:
            assert not b.app.state.hosts.cache.cold and len(b.app.state.hosts.cache.index) == 2
            with connections(b) as used:
                r = b.post("/v1/hosts/oss-2/heartbeat", headers=HOST)
                assert r.status_code == 200 and r.json()["state"] == "active"
            assert used == []


def test_a_replica_on_a_database_without_its_schema_starts_cold_and_says_why(tmp_path) -> None:
    from fastapi.testclient import TestClient

    from scheduler.api.app import create_app
    from sched_helpers import settings
    url = f"sqlite:///{tmp_path}/empty.db"
    with TestClient(create_app(settings(url)), raise_server_exceptions=False) as api:
        assert api.app.state.hosts.cache.cold
        r = api.get("/readyz")
        assert r.status_code == 503 and "scheduler db upgrade" in r.json()["error"]["message"]


def _row_heartbeat(api, name: str) -> float:  # type: ignore[no-untyped-def]
    from scheduler.db.models import Host
    with api.app.state.store.read() as s:
        return s.get(Host, name).last_heartbeat


def test_liveness_is_written_at_most_once_per_write_interval(db_url) -> None:
    """The row's ``last_heartbeat`` is a floor written every ``heartbeat_write_s``; the
    API shows the last beat (the replicas' shared liveness, here this replica's own)."""
    clock = Clock(T0)
    with make_client(db_url, clock=clock, **BUFFERED) as api:
        assert api.post("/v1/hosts", json=host_body("oss-1"), headers=HOST).status_code == 201
        warm(api, clock)
        svc = api.app.state.hosts
        written = []
        for i in range(1, 21):  # a beat and a flush a second for 20 s
            clock.t = T0 + i
            assert api.post("/v1/hosts/oss-1/heartbeat", headers=HOST).status_code == 200
            svc.flush()
            assert api.get("/v1/hosts/oss-1", headers=ADM).json()["last_heartbeat"] == T0 + i
            last = _row_heartbeat(api, "oss-1")
            if not written or written[-1] != last:
                written.append(last)
        assert written == [T0, T0 + 6, T0 + 11, T0 + 16]  # registered, then every 5 s from the first beat
        assert T0 + 20 - written[-1] <= 5  # the recorded liveness lags the last beat by at most 5 s


def test_another_replicas_registration_and_cordon_reach_the_answer(db_url) -> None:
    clock = Clock(T0)
    with make_client(db_url, clock=clock, **BUFFERED) as a, make_client(db_url, clock=clock, **BUFFERED) as b:
        assert a.post("/v1/hosts", json=host_body("oss-1"), headers=HOST).status_code == 201
        warm(b, clock)
        assert b.post("/v1/hosts", json=host_body("oss-2"), headers=auth("hst2")).status_code == 201  # on b
        # a does not know oss-2 yet: the database answers (and it is hst2's, not hst's)
        assert a.post("/v1/hosts/oss-2/heartbeat", headers=auth("hst2")).status_code == 200
        assert a.post("/v1/hosts/oss-2/heartbeat", headers=HOST).status_code == 403
        assert b.post("/v1/hosts/oss-1/cordon", json={"reason": "ops"}, headers=ADM).status_code == 200
        clock.t = T0 + 10  # the next beats
        warm(a, clock)
        with connections(a) as used:
            r = a.post("/v1/hosts/oss-1/heartbeat", headers=HOST)
            assert r.status_code == 200 and r.json()["state"] == "cordoned"
            r = a.post("/v1/hosts/oss-2/heartbeat", headers=auth("hst2"))
            assert r.status_code == 200
        assert used == []
        assert a.post("/v1/hosts/oss-2/heartbeat", headers=HOST).status_code == 403  # from memory, then audited


def test_a_silent_host_is_down_after_the_timeout(db_url) -> None:
    clock = Clock(T0)
    with make_client(db_url, clock=clock, placement={"heartbeat_timeout_s": 30, "heartbeat_write_s": 5},
                     stats={"heartbeat_flush_s": 30}) as api:
        assert api.post("/v1/hosts", json=host_body("oss-1"), headers=HOST).status_code == 201
        warm(api, clock)
        svc = api.app.state.hosts
        for i in range(0, 40, 10):  # beats every 10 s
            clock.t = T0 + i
            assert api.post("/v1/hosts/oss-1/heartbeat", headers=HOST).status_code == 200
            svc.flush()
            assert api.get("/v1/hosts/oss-1", headers=ADM).json()["state"] == "active"
        clock.t = T0 + 30 + 29  # 29 s after the last beat: still up
        assert api.get("/v1/hosts/oss-1", headers=ADM).json()["state"] == "active"
        clock.t = T0 + 30 + 31
        assert api.get("/v1/hosts/oss-1", headers=ADM).json()["state"] == "down"


def _rig(api, clock: Clock, n: int, rack: str = "r1") -> None:  # type: ignore[no-untyped-def]
    for i in range(n):
        assert api.post("/v1/hosts", json=host_body(f"{rack}-{i}", rack=rack), headers=HOST).status_code == 201


def test_a_silent_host_is_marked_down_once_its_vms_flagged_and_cleared_when_it_beats(db_url) -> None:
    from sched_helpers import TA, vm_body
    clock = Clock(T0)
    cfg = {"placement": {"heartbeat_timeout_s": 25},
           "liveness": {"check_s": 0, "grace_s": 30, "lag_bound_s": 1000}}  # the lag gate: its own test
    with make_client(db_url, clock=clock, **cfg) as a, make_client(db_url, clock=clock, **cfg) as b:
        _rig(a, clock, 10)
        vm = a.post("/v1/vms", json=vm_body("web-1", vcpus=1, memory_mib=128), headers=TA | {"Idempotency-Key": "w"})
        host = vm.json()["host"]
        with a.app.state.store.write() as s:  # what dispatch would have made of it
            from scheduler.db.models import Vm
            s.get(Vm, vm.json()["id"]).status = "running"
        assert a.app.state.liveness.check() is None  # the grace period after start
        for t in range(10, 31, 10):  # every host but one beats every 10 s
            clock.t = T0 + t
            for i in range(10):
                if f"r1-{i}" != host:
                    assert a.post(f"/v1/hosts/r1-{i}/heartbeat", headers=HOST).status_code == 200
        clock.t = T0 + 31  # past the grace, and 31 s after the silent host's last word
        got = a.app.state.liveness.check()
        assert got is not None and got.mark == [host] and got.events == []
        clock.t = T0 + 41
        assert b.app.state.liveness.check().mark == []  # marked once, by a; b sees it marked
        shown = a.get(f"/v1/hosts/{host}", headers=ADM).json()
        assert shown["state"] == "down" and shown["down_since"] == T0 + 31
        v = a.get(f"/v1/vms/{vm.json()['id']}", headers=TA).json()
        assert v["status"] == "running" and v["reason"] == f"host {host} silent since 2025-11-24T16:00:00Z: marked down"
        downs = [x for x in a.get("/v1/audit", headers=ADM).json()["items"] if x["action"] == "host.down"]
        assert [(x["target"], x["detail"]["vms_flagged"]) for x in downs] == [(host, 1)]
        # it beats again: the mark and the flag go
        assert a.post(f"/v1/hosts/{host}/heartbeat", headers=HOST).status_code == 200
        shown = a.get(f"/v1/hosts/{host}", headers=ADM).json()
        assert shown["state"] == "active" and shown["down_since"] is None
        assert a.get(f"/v1/vms/{vm.json()['id']}", headers=TA).json()["reason"] == ""


def test_a_rack_going_silent_at_once_is_one_event_not_ten_downs(db_url) -> None:
    clock = Clock(T0)
    cfg = {"placement": {"heartbeat_timeout_s": 25},
           "liveness": {"check_s": 0, "grace_s": 1, "lag_bound_s": 1000}}  # the lag gate: its own test
    with make_client(db_url, clock=clock, **cfg) as api:
        _rig(api, clock, 10, "r1")
        _rig(api, clock, 10, "r2")
        _rig(api, clock, 30, "r3")
        clock.t = T0 + 20
        for rack in ("r2", "r3"):  # r1's switch dies: nothing from it
            for i in range(10 if rack == "r2" else 30):
                assert api.post(f"/v1/hosts/{rack}-{i}/heartbeat", headers=HOST).status_code == 200
        clock.t = T0 + 30
        got = api.app.state.liveness.check()
        assert got.mark == [] and len(got.held) == 10
        assert got.events == ["rack r1: 10 of 10 hosts went silent at once (over 50%); not marked down one by one"]
        api.app.state.liveness.check()  # the same event: audited once
        events = [x for x in api.get("/v1/audit", headers=ADM).json()["items"] if x["action"] == "fleet.silence"]
        assert len(events) == 1 and events[0]["detail"]["hosts"] == [f"r1-{i}" for i in range(10)]
        assert all(api.get(f"/v1/hosts/r1-{i}", headers=ADM).json()["down_since"] is None for i in range(10))


def test_a_flood_from_one_host_and_a_huge_beat_are_refused_and_record_nothing(db_url) -> None:
    clock = Clock(T0)
    with make_client(db_url, clock=clock, placement={"heartbeat_min_interval_s": 1},
                     stats={"heartbeat_flush_s": 30}) as api:
        assert api.post("/v1/hosts", json=host_body("oss-1"), headers=HOST).status_code == 201
        assert api.post("/v1/hosts", json=host_body("oss-2"), headers=HOST).status_code == 201
        warm(api, clock)
        svc = api.app.state.hosts
        clock.t = T0 + 10
        assert api.post("/v1/hosts/oss-1/heartbeat", headers=HOST).status_code == 200
        clock.t = T0 + 10.4
        for _ in range(50):
            r = api.post("/v1/hosts/oss-1/heartbeat", headers=HOST)
            assert r.status_code == 429, r.text
        err = r.json()["error"]
        assert err["code"] == "hyb.heartbeat.too_soon" and err["field"] == "name"
        assert "oss-1 beat 0.400 s ago" in err["message"]
        assert api.post("/v1/hosts/oss-2/heartbeat", headers=HOST).status_code == 200  # others are not held up
        clock.t = T0 + 11
        assert api.post("/v1/hosts/oss-1/heartbeat", headers=HOST).status_code == 200
        big = b'{"stats": null, "pad": "' + b"x" * (1 << 20) + b'"}'
        r = api.post("/v1/hosts/oss-2/heartbeat", content=big, headers=HOST | {"Content-Type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["field"] == "body", r.text
        assert svc.flush() == 2  # oss-1 once (its last), oss-2 once: the refused beats kept nothing
        assert api.get("/v1/hosts/oss-1", headers=ADM).json()["last_heartbeat"] == T0 + 11


SHARED = {"stats": {"heartbeat_flush_s": 30},  # flushed by the test, on its clock
          "placement": {"heartbeat_timeout_s": 25, "heartbeat_period_s": 5},
          "liveness": {"check_s": 0, "grace_s": 1, "lag_bound_s": 1000}}  # the lag gate: its own test


def _host_rows(api) -> dict[str, float]:  # type: ignore[no-untyped-def]
    from scheduler.db.models import Host
    with api.app.state.store.read() as s:
        return {h.name: h.last_heartbeat for h in s.query(Host)}


def test_two_replicas_share_liveness_without_a_write_per_beat(db_url) -> None:
    """Ten hosts beat every 10 s, r1-9 only ever to replica b, the others to a until t=30,
    to b at t=30, and to a again from t=40: b is killed at t=32 (it never writes the period
    holding their beats). a, checking every second, marks none of them, but does mark r1-8,
    silent since t=10; the API on a shows each host's last beat to within one period; no
    host's row is written (``heartbeat_write_s`` 300): one row per replica and period."""
    clock = Clock(T0)
    with make_client(db_url, clock=clock, **SHARED) as a, make_client(db_url, clock=clock, **SHARED) as b:
        _rig(a, clock, 10)
        warm(a, clock)
        warm(b, clock)
        marked: dict[str, float] = {}
        beats: dict[str, float] = {}
        rows_at_20: dict[str, float] = {}
        b_alive = True
        for t in range(1, 71):
            clock.t = T0 + t
            if t % 10 == 0:
                for i in range(10):
                    name = f"r1-{i}"
                    if name == "r1-8" and t > 10:
                        continue  # dead after its first beat
                    to = b if name == "r1-9" or t == 30 else a
                    if to is b and not b_alive:
                        to = a  # the load balancer's next try
                    assert to.post(f"/v1/hosts/{name}/heartbeat", headers=HOST).status_code == 200
                    beats[name] = clock.t
            if t == 32:  # killed mid-period: its beats of t=30 are never written
                b.app.state.hosts._stop.set()
                b_alive = False
            a.app.state.hosts.flush()
            if b_alive:
                b.app.state.hosts.flush()
            if t == 20:
                rows_at_20 = _host_rows(a)
            got = a.app.state.liveness.check()
            for name in got.mark if got else []:
                marked[name] = clock.t
            for i in (0, 9):
                shown = a.get(f"/v1/hosts/r1-{i}", headers=ADM).json()
                assert shown["state"] == "active", (t, shown)
                assert 0 <= clock.t - shown["last_heartbeat"] <= 10 + 5 + 1, (t, i, shown["last_heartbeat"])
                if t % 10 == 1 and t > 10 and (i == 0 or t < 30):  # beat to a, or to b and a period since
                    assert 0 <= shown["last_heartbeat"] - beats[f"r1-{i}"] <= 5, (t, i)
        assert list(marked) == ["r1-8"] and T0 + 10 + 25 < marked["r1-8"] <= T0 + 10 + 25 + 2, marked
        # no host's row was written since t=20 (nor before: 300 s between a host's writes)
        after = _host_rows(a)
        assert {n: after[n] for n in after if n != "r1-8"} == {n: rows_at_20[n] for n in rows_at_20 if n != "r1-8"}
        assert after["r1-8"] == T0  # as registered: the row is a floor
        written = a.app.state.hosts.cache.pulse.rows_written + b.app.state.hosts.cache.pulse.rows_written
        assert written <= 70 // 5 + 32 // 5 + 2, written  # a period row each 5 s a replica heard a beat
        # r1-8 comes back: its beat is written (the mark goes), whatever heartbeat_write_s says
        clock.t = T0 + 75
        warm(a, clock)
        assert a.post("/v1/hosts/r1-8/heartbeat", headers=HOST).status_code == 200
        a.app.state.hosts.flush()
        shown = a.get("/v1/hosts/r1-8", headers=ADM).json()
        assert shown["state"] == "active" and shown["down_since"] is None and _host_rows(a)["r1-8"] == T0 + 75


@pytest.mark.parametrize("outage", [False, True])
def test_a_replica_restarted_beside_a_peer_judges_from_the_shared_rows_at_once(db_url, outage: bool) -> None:
    """Ten hosts beat every 10 s to replica a, spread over the interval (r1-i at t = i mod
    10), and a writes a row every 5 s period; r1-8 and r1-9 are dead after their first
    beat. At t=40 a new replica c starts (the other replica, restarted): a's rows join up
    to now, so the fleet was heard all along and c's start hid nothing. c marks the two
    at its first check, where it used to wait a grace of a timeout (25 s). After an outage
    of every replica (a stops at t=20, c starts at t=65: longer than a row may be late
    here, 2 periods and the 30 s flush) the rows do not reach now, the live hosts' beats
    went nowhere meanwhile, and c waits the grace."""
    clock = Clock(T0)
    cfg = {**SHARED, "liveness": {"check_s": 0, "grace_s": 0, "lag_bound_s": 1000}}  # grace: the timeout, 25 s
    with make_client(db_url, clock=clock, **cfg) as a:
        _rig(a, clock, 10)
        warm(a, clock)
        a_until = 20 if outage else 40
        for t in range(1, a_until + 1):
            clock.t = T0 + t
            for i in range(10):
                if (t - i) % 10 == 0 and (i < 8 or t < 10):
                    assert a.post(f"/v1/hosts/r1-{i}/heartbeat", headers=HOST).status_code == 200
            a.app.state.hosts.flush()
        clock.t = T0 + (65 if outage else 40) + 0.5
        with make_client(db_url, clock=clock, **cfg) as c:
            warm(c, clock)  # its start: the index's first pass reads the shared rows
            clock.t += 0.5
            for i in range(1 if outage else 8):  # beats reach c (the live hosts', to c too)
                assert c.post(f"/v1/hosts/r1-{i}/heartbeat", headers=HOST).status_code == 200
            got = c.app.state.liveness.check()
            if outage:
                assert got is None  # the grace
                assert all(c.get(f"/v1/hosts/r1-{i}", headers=ADM).json()["down_since"] is None
                           for i in range(10))
            else:
                assert got is not None and got.mark == ["r1-8", "r1-9"] and got.events == [], got
                assert all(c.get(f"/v1/hosts/r1-{i}", headers=ADM).json()["state"] == "active" for i in range(8))


def test_a_starting_replica_claims_hearing_only_from_its_first_beat(db_url) -> None:
    """Every replica stops at t=20 (a), and a new one (c) is created at t=21, but hears its
    first beat only at t=24 (its index's first pass, its port opening). Its first row must
    not say it heard the fleet from its creation: the beats sent meanwhile went nowhere.
    So the rows have a gap from 20 to 24 and the fleet counts as heard from 24 (the grace
    counts from there); with the row starting at c's creation, they joined up across the
    outage, and c judged the fleet mid-return (bench/fleet_pulse.py at 100,000 hosts:
    7,362 live hosts marked down)."""
    clock = Clock(T0)
    with make_client(db_url, clock=clock, **SHARED) as a:
        _rig(a, clock, 10)
        warm(a, clock)
        for t in range(1, 21):
            clock.t = T0 + t
            for i in range(10):
                if (t - i) % 10 == 0:
                    assert a.post(f"/v1/hosts/r1-{i}/heartbeat", headers=HOST).status_code == 200
            a.app.state.hosts.flush()
    clock.t = T0 + 21
    with make_client(db_url, clock=clock, **SHARED) as c:
        warm(c, clock)
        clock.t = T0 + 24
        assert c.post("/v1/hosts/r1-4/heartbeat", headers=HOST).status_code == 200
        clock.t = T0 + 26
        c.app.state.hosts.flush()  # its first row: [24, 26], not [21, 26]
        assert c.app.state.hosts.cache.pulse.heard_since(T0 + 26.5, late_s=5) == T0 + 24


def test_a_replica_holds_its_checks_while_a_peer_says_it_lags(db_url) -> None:
    """Hosts beat to a and b alike, r1-0 is dead. a lags (its event loop 3.5 s late): the
    beats that wait unread at a are missing from its rows, so b must not judge from them
    either. a's row says why it lags; b, on time itself, marks nothing while a's newest
    row says so and logs which replica lags; once a's row says it is on time, b marks."""
    clock = Clock(T0)
    cfg = {**SHARED, "liveness": {"check_s": 0, "grace_s": 1, "lag_bound_s": 2}}
    with make_client(db_url, clock=clock, **cfg) as a, make_client(db_url, clock=clock, **cfg) as b:
        _rig(a, clock, 10)
        warm(a, clock)
        warm(b, clock)
        for t in range(1, 36):
            clock.t = T0 + t
            if t % 10 == 1:
                for i in range(1, 10):
                    assert (a if i % 2 else b).post(f"/v1/hosts/r1-{i}/heartbeat", headers=HOST).status_code == 200
            if t == 29:
                a.app.state.liveness.lag.loop_late(3.5)
            a.app.state.hosts.flush()
            b.app.state.hosts.flush()
        watch = b.app.state.liveness
        assert watch.lag.reason(2) is None  # b itself is on time
        assert watch.check() is None and watch.held_for_lag == 1
        # a's worst over its window: the 3.5 s noted, or more if its real loop was later still
        why = watch.pulse.peer_lag(clock.t, within_s=watch.lag.window_s)
        m = re.match(rf"replica {re.escape(a.app.state.hosts.cache.pulse.replica)} lags \(event loop ([0-9.]+) s late",
                     why or "")
        assert m and float(m.group(1)) >= 3.5, why
        assert b.get("/v1/hosts/r1-0", headers=ADM).json()["down_since"] is None
        a.app.state.liveness.lag.window_s = 0  # a is on time again: its next row says so
        for t in range(36, 42):
            clock.t = T0 + t
            if t == 37:
                for i in range(1, 10):
                    assert (a if i % 2 else b).post(f"/v1/hosts/r1-{i}/heartbeat", headers=HOST).status_code == 200
            a.app.state.hosts.flush()
            b.app.state.hosts.flush()
        got = watch.check()
        assert got is not None and got.mark == ["r1-0"], got


def _all_but_r1_0_beat(a, clock: Clock) -> None:  # type: ignore[no-untyped-def]
    """Ten hosts in rack r1, all but r1-0 beating every 10 s until t=31, flushed each time."""
    _rig(a, clock, 10)
    warm(a, clock)
    for t in (1, 11, 21, 31):  # all but r1-0 beat every 10 s
        clock.t = T0 + t
        for i in range(1, 10):
            assert a.post(f"/v1/hosts/r1-{i}/heartbeat", headers=HOST).status_code == 200
        a.app.state.hosts.flush()


def test_a_replica_that_lags_marks_nothing_and_is_not_ready(db_url) -> None:
    """Its event loop or its flush late past ``liveness.lag_bound_s``: a silent host is not
    marked (the silence may be this replica's own doing), the check says why, /readyz is
    503 naming it and the metric says so; once the lag is out of the window, it marks."""
    clock = Clock(T0)
    cfg = {**SHARED, "liveness": {"check_s": 0, "grace_s": 1, "lag_bound_s": 2}}
    with make_client(db_url, clock=clock, **cfg) as a:
        _all_but_r1_0_beat(a, clock)
        watch = a.app.state.liveness
        # the window: until every live host has beaten again (a beat interval and the
        # allowance for a peer's row, and a shed registration's retry), not a fixed 30 s
        assert watch.lag.window_s == lag_window(missed_beat_s=watch.missed_beat_s, retry_s=1.0, jitter=RETRY_AFTER_JITTER)
        watch.lag.loop_late(3.5)  # a timer on the event loop fired 3.5 s late
        assert watch.check() is None and watch.held_for_lag == 1
        r = a.get("/readyz")
        # the worst lag in the window: the loop's own lateness under load may be above the one told
        late = re.search(r"event loop (\d+\.\d+) s late \(bound 2 s\)", r.json()["error"]["message"])
        assert r.status_code == 503 and late and float(late[1]) >= 3.5, r.text
        assert "hyb_sched_lagging 1.0" in a.get("/metrics", headers=ADM).text
        assert a.get("/v1/hosts/r1-0", headers=ADM).json()["down_since"] is None
        watch.lag.window_s = 0  # the lag is out of the window
        got = watch.check()
        assert got is not None and got.mark == ["r1-0"]
        assert a.get("/readyz").status_code == 200


def test_a_replica_that_sheds_beats_still_marks_and_one_that_sheds_a_registration_does_not(db_url) -> None:
    """A shed beat is counted for its host and its Retry-After lands the next beat before
    the timeout: it cannot make a live host look silent, so a replica that sheds beats
    (one carrying a restarting peer's share of the fleet) goes on judging; /readyz is 503
    all the same, so a load balancer sends work elsewhere. A shed registration can (the
    host does not beat until it is registered): no host is marked for the window after."""
    clock = Clock(T0)
    cfg = {**SHARED, "liveness": {"check_s": 0, "grace_s": 1, "lag_bound_s": 2}}
    with make_client(db_url, clock=clock, **cfg) as a:
        _all_but_r1_0_beat(a, clock)
        watch = a.app.state.liveness
        for _ in range(50):
            watch.lag.shed(silences=False)  # beats answered 503, counted
        r = a.get("/readyz")
        assert r.status_code == 503 and "shed 50 requests lately" in r.json()["error"]["message"], r.text
        watch.lag.shed(silences=True)  # a registration turned away
        assert watch.check() is None and watch.held_for_lag == 1
        assert "shed 1 registrations lately" in a.get("/readyz").json()["error"]["message"]
        assert a.get("/v1/hosts/r1-0", headers=ADM).json()["down_since"] is None
        watch.lag._shed_silencing.clear()  # the registration's window passed; the beats' has not
        got = watch.check()
        assert got is not None and got.mark == ["r1-0"] and watch.held_for_lag == 1
        assert a.get("/readyz").status_code == 503


def test_a_replicas_half_of_the_fleet_silenced_at_once_is_held_before_any_is_marked(db_url) -> None:
    """Forty hosts in two racks beat every 10 s, their beats spread over the interval,
    every other host to replica b. b dies and nothing takes its hosts' beats elsewhere
    (or a partition cuts them off): half the fleet goes silent at one instant, but its
    hosts cross the 22 s timeout one after another over a beat interval and a period.
    a checks every 2 s. Judged on the hosts past the timeout alone, its first check saw a
    few of them (under a fifth of the fleet, and half of each rack is not over half) and
    marked those; the fleet's event came later (2026-11-29: 3,546 false downs at 100,000
    hosts). Counting the hosts that missed a beat, the check that would mark the first
    sees most of them: one event, none marked."""
    clock = Clock(T0)
    cfg = {"stats": {"heartbeat_flush_s": 1},  # the shipped timings; flushed by the test, on its clock
           "placement": {"heartbeat_timeout_s": 22, "heartbeat_period_s": 2},
           "liveness": {"check_s": 0, "grace_s": 1, "lag_bound_s": 1000, "beat_interval_s": 10}}
    with make_client(db_url, clock=clock, **cfg) as a, make_client(db_url, clock=clock, **cfg) as b:
        for api in (a, b):
            api.app.state.hosts._stop.set()  # no flusher thread: the test flushes on its clock
        names = [f"r{1 + i // 20}-{i % 20}" for i in range(40)]
        for n in names:
            assert a.post("/v1/hosts", json=host_body(n, rack=n.split("-")[0]), headers=HOST).status_code == 201
        warm(a, clock)
        warm(b, clock)
        watch = a.app.state.liveness
        assert watch.missed_beat_s == 10 + 2 * 2 + 1  # the beat interval and silent_allowance
        killed = 40.0  # b dies
        marked: list[str] = []
        events: list[str] = []
        for step in range(1, 4 * 100 + 1):  # every 0.25 s for 100 s
            t = step / 4
            clock.t = T0 + t
            for i, n in enumerate(names):
                if (t - i / 4) % 10 == 0:  # host i beats at i/4 s into each interval
                    to = b if i % 2 else a
                    if to is b and t >= killed:
                        continue
                    assert to.post(f"/v1/hosts/{n}/heartbeat", headers=HOST).status_code == 200
            if t % 1 == 0:
                a.app.state.hosts.flush()
                if t < killed:
                    b.app.state.hosts.flush()
            if t % 2 == 0:
                got = watch.check()
                if got is not None:
                    marked += got.mark
                    events += got.events
        assert marked == [], marked
        assert events and all(e.startswith("fleet: ") for e in events), events
        rows = [x for x in a.get("/v1/audit", headers=ADM).json()["items"] if x["action"] == "fleet.silence"]
        assert rows and set(rows[-1]["detail"]["hosts"]) <= {n for i, n in enumerate(names) if i % 2}
        assert all(a.get(f"/v1/hosts/{n}", headers=ADM).json()["down_since"] is None
                   for i, n in enumerate(names) if i % 2)
