"""Heartbeats carry the IO-health signal; the scheduler keeps each host's history
downsampled (one row per host and stats.bucket_s window) with retention, and serves it.
TestClient over a real store (SQLite; PostgreSQL under the integration marker)."""

from __future__ import annotations

import pytest

from tools.dev.host_shapes import Shape
from sched_helpers import ADM, HOST, TA, Clock, host_body, make_client

SMALL = Shape("small", nodes=1, cores_per_node=4, smt=2, io_cores_per_node=1, host_cores=1,
              pages_2m_per_node=512, vfs_per_node=0, disks_per_node=0)
T0 = 1_764_000_000.0  # a bucket boundary for 300 s windows


def stats(at: float, **kw) -> dict:  # type: ignore[no-untyped-def]
    base = {"at": at, "interval_s": 10.0, "samples": 10, "io_cpu_busy": 0.2, "io_cpu_busy_max": 0.4,
            "cpu_io_service": 0.5, "cpu_vms": 1.0, "cpu_other": 0.1, "foreign_threads_max": 0,
            "foreign_cpu_s": 0.0, "irqs_per_s": 100.0, "psi_some_avg10_max": 1.0, "psi_stall": 0.01,
            "throttled_periods": 0, "probe_ok": 10, "probe_failed": 0, "probe_p99_ms_max": 2.0}
    return base | kw


@pytest.fixture
def api(db_url):  # type: ignore[no-untyped-def]
    with make_client(db_url, clock=Clock(T0), stats={"bucket_s": 300, "retention_days": 1}) as c:
        assert c.post("/v1/hosts", json=host_body("oss-1", SMALL), headers=HOST).status_code == 201
        yield c


def beat(api, body) -> int:  # type: ignore[no-untyped-def]
    return api.post("/v1/hosts/oss-1/heartbeat", json=body, headers=HOST).status_code


def test_heartbeats_fold_into_buckets(api) -> None:
    assert beat(api, None) == 200  # a heartbeat without stats still is one
    assert beat(api, {"stats": stats(T0 + 10)}) == 200
    assert beat(api, {"stats": stats(T0 + 20, io_cpu_busy=0.4, io_cpu_busy_max=0.9, foreign_threads_max=3,
                                     foreign_cpu_s=1.5, probe_failed=2, probe_p99_ms_max=40.0,
                                     psi_stall=None)}) == 200
    assert beat(api, {"stats": stats(T0 + 310)}) == 200
    got = api.get("/v1/hosts/oss-1/stats", headers=ADM).json()
    assert got["bucket_s"] == 300 and [i["start"] for i in got["items"]] == [T0, T0 + 300]
    first = got["items"][0]
    assert first["heartbeats"] == 2 and first["samples"] == 20
    assert first["io_cpu_busy"] == pytest.approx(0.3) and first["io_cpu_busy_max"] == 0.9
    assert first["foreign_threads_max"] == 3 and first["foreign_cpu_s"] == 1.5
    assert (first["probe_ok"], first["probe_failed"], first["probe_p99_ms_max"]) == (20, 2, 40.0)
    assert first["psi_stall"] == pytest.approx(0.01)  # the heartbeat without PSI does not dilute it
    assert len(api.get(f"/v1/hosts/oss-1/stats?since={T0 + 1}", headers=ADM).json()["items"]) == 1


def test_old_buckets_go_and_bad_stats_change_nothing(api) -> None:
    assert beat(api, {"stats": stats(T0)}) == 200
    api.app.state.hosts.clock = lambda: T0 + 2 * 86400
    assert beat(api, {"stats": stats(T0 + 2 * 86400)}) == 200  # retention 1 day: the first goes
    assert [i["start"] for i in api.get("/v1/hosts/oss-1/stats", headers=ADM).json()["items"]] == [T0 + 2 * 86400]
    for field, value in (("samples", "10"), ("io_cpu_busy", 1.5), ("foreign_threads_max", True),
                         ("cpu_vms", -1)):
        r = api.post("/v1/hosts/oss-1/heartbeat", json={"stats": stats(T0 + 2 * 86400 + 5, **{field: value})},
                     headers=HOST)
        assert r.status_code == 422 and r.json()["error"]["field"] == f"stats.{field}", r.text
    assert api.get("/v1/hosts/oss-1/stats", headers=ADM).json()["items"][0]["heartbeats"] == 1
    assert api.get("/v1/hosts/oss-1/stats", headers=TA).status_code == 403
    assert api.get("/v1/hosts/nope/stats", headers=ADM).status_code == 404


def test_a_row_per_host_and_window_is_small(tmp_path) -> None:
    """What the history costs on SQLite: bytes per host per day at 300 s windows."""
    db = tmp_path / "s.db"
    with make_client(f"sqlite:///{db}", clock=Clock(T0), stats={"bucket_s": 300, "retention_days": 30}) as c:
        assert c.post("/v1/hosts", json=host_body("oss-1", SMALL), headers=HOST).status_code == 201
        before = _size(db)
        for i in range(288):  # one day
            assert c.post("/v1/hosts/oss-1/heartbeat", json={"stats": stats(T0 + 300 * i)},
                          headers=HOST).status_code == 200
        per_day = _size(db) - before
    print(f"host_stats on SQLite: {per_day} bytes per host per day at 300 s windows")
    assert per_day < 100_000


def _size(db) -> int:  # type: ignore[no-untyped-def]
    """The database's pages in use, WAL checkpointed first (a connection of its own)."""
    import sqlite3
    with sqlite3.connect(db) as c:
        c.execute("PRAGMA wal_checkpoint(PASSIVE)")
        pages, free, size = (c.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_count", "freelist_count",
                                                                              "page_size"))
    return (pages - free) * size


def row_heartbeat(api, name: str) -> float:  # type: ignore[no-untyped-def]
    from scheduler.db.models import Host
    with api.app.state.store.read() as s:
        return s.get(Host, name).last_heartbeat


def test_batched_heartbeats_are_checked_at_once_and_written_together(db_url) -> None:
    """With stats.heartbeat_flush_s > 0 a heartbeat is checked on a read (404, 403 at once)
    and written with the others in one transaction per flush."""
    with make_client(db_url, clock=Clock(T0), stats={"heartbeat_flush_s": 30}) as api:
        for name in ("oss-1", "oss-2"):
            assert api.post("/v1/hosts", json=host_body(name, SMALL), headers=HOST).status_code == 201
        svc = api.app.state.hosts
        before = api.get("/v1/hosts/oss-1", headers=ADM).json()["last_heartbeat"]
        api.app.state.hosts.clock = lambda: T0 + 42
        for name in ("oss-1", "oss-2", "oss-1"):
            r = api.post(f"/v1/hosts/{name}/heartbeat", json={"stats": stats(T0 + 42)}, headers=HOST)
            assert r.status_code == 200 and r.json()["last_heartbeat"] == T0 + 42
        assert api.post("/v1/hosts/nope/heartbeat", headers=HOST).status_code == 404
        # the API shows the beat at once (this replica's share of the fleet's liveness) ...
        assert api.get("/v1/hosts/oss-1", headers=ADM).json()["last_heartbeat"] == T0 + 42
        assert row_heartbeat(api, "oss-1") == before  # ... its row is not written yet
        assert svc.flush() == 2  # two hosts, one transaction
        assert row_heartbeat(api, "oss-1") == before  # a floor: written every heartbeat_write_s
        assert api.get("/v1/hosts/oss-1/stats", headers=ADM).json()["items"][0]["heartbeats"] == 2
        assert svc.flush() == 0


def test_the_heartbeat_fast_path_answers_as_the_route_would(api) -> None:  # type: ignore[no-untyped-def]
    """Heartbeats are answered ahead of the router (scheduler/api/fastpath.py); what it
    hands over (no host scope, a body that does not validate or is not JSON) gets the
    application's answers, and every refusal is audited once."""
    from scheduler.api import fastpath

    path = {"type": "http", "method": "POST", "query_string": b""}
    assert fastpath.beat_name(path | {"path": "/v1/hosts/oss-1/heartbeat"}) == "oss-1"
    for other in ("/v1/hosts/heartbeat", "/v1/hosts//heartbeat", "/v1/hosts/a/b/heartbeat", "/v1/hosts/oss-1"):
        assert fastpath.beat_name(path | {"path": other}) == "", other
    assert fastpath.beat_name({"type": "lifespan"}) == ""

    r = api.post("/v1/hosts/oss-1/heartbeat", json={"stats": stats(T0 + 5)}, headers=HOST)
    assert r.status_code == 200 and r.json() == {"name": "oss-1", "state": "active", "generation": 1,
                                                 "last_heartbeat": T0}
    r = api.post("/v1/hosts/oss-9/heartbeat", headers=HOST)
    assert r.status_code == 404 and r.json()["error"]["code"] == "hyb.host.not_found"
    r = api.post("/v1/hosts/oss-1/heartbeat", json={"stats": stats(T0, io_cpu_busy=2)}, headers=HOST)
    assert r.status_code == 422 and r.json()["error"]["field"] == "stats.io_cpu_busy"
    r = api.post("/v1/hosts/oss-1/heartbeat", content=b"{}", headers=HOST | {"Content-Type": "text/plain"})
    assert r.status_code == 422
    before = len(api.get("/v1/audit?action=auth.denied", headers=ADM).json()["items"])
    r = api.post("/v1/hosts/oss-1/heartbeat", headers=TA)  # a tenant token: no host scope
    assert r.status_code == 403 and r.json()["error"]["code"] == "hyb.auth.forbidden"
    assert len(api.get("/v1/audit?action=auth.denied", headers=ADM).json()["items"]) == before + 1
