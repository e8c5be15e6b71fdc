"""Heartbeats answered from memory (issue 28's first part): in steady state a beat opens
no database connection; who may beat comes from the placement index, which follows the
change feed (so another replica's registration, owner and admin state reach it); the
liveness column is written at most once per ``placement.heartbeat_write_s`` a host,
whatever the beat rate; refusals still go through the database and are audited.
TestClient over a real store (SQLite; PostgreSQL under the integration marker); two
app instances on one database are two replicas."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from sqlalchemy import event

from sched_helpers import ADM, HOST, Clock, auth, host_body, make_client

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


def test_liveness_is_written_at_most_once_per_write_interval(db_url) -> None:
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
            last = api.get("/v1/hosts/oss-1", headers=ADM).json()["last_heartbeat"]
            if not written or written[-1] != last:
                written.append(last)
        assert written == [T0 + 1, T0 + 6, T0 + 11, T0 + 16]  # every 5 s, not 20 times
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
        assert b.post("/v1/hosts/oss-1/cordon", json={"owner": "ops"}, headers=ADM).status_code == 200
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
