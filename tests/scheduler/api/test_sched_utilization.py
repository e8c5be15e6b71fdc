"""The fleet's utilisation view (issue 28): hosts send their folded days
(``POST /v1/hosts/{name}/days``), ``GET /v1/fleet/utilization`` bins the share of each
host's CPUs in use across the fleet, per group, with a second day to compare, and lists
a bin's hosts. TestClient over a real store (SQLite; PostgreSQL under the integration
marker); the expected numbers are worked out here from the days sent."""

from __future__ import annotations

import datetime as dt
import statistics

import pytest

from sched_helpers import ADM, HOST, TA, Clock, auth, host_body, make_client
from scheduler.utilization import Day, distribution

T0 = 1_764_100_000.0  # 2025-11-25T19:46:40Z
DAY, BEFORE = "2025-11-25", "2025-10-25"


def day_body(day: str, *, io: float, vms: float, other: float, cpus: int = 16, hour: int | None = 50) -> dict:
    return {"day": day, "utc_offset_min": 480, "cpus": cpus, "samples": 86400,
            "peak": {"start": "21:00", "end": "22:00", "samples": 3600, "io": io, "vms": vms, "other": other},
            "hours": [hour] * 20 + [80, 90, 70, None], "hist": [0] * 10 + [86400] + [0] * 9,
            "probe_p99_ms_max": 2.5, "psi_some_avg10_max": 1.0, "foreign_cpu_s": 0.0, "probe_failed": 0}


# (host, rack, peak CPUs: io, vms, other) of 16 CPUs; h5 registered, sends nothing
PEAKS = {"h0": ("r1", 2.0, 4.0, 0.8), "h1": ("r1", 2.0, 8.0, 0.8), "h2": ("r1", 1.6, 12.0, 0.4),
         "h3": ("r2", 2.0, 2.0, 0.0), "h4": ("r2", 4.0, 11.2, 0.8)}


@pytest.fixture
def api(db_url):  # type: ignore[no-untyped-def]
    with make_client(db_url, clock=Clock(T0)) as c:
        for name in [*PEAKS, "h5"]:
            rack = PEAKS.get(name, ("r2",))[0]
            assert c.post("/v1/hosts", json=host_body(name, rack=rack), headers=HOST).status_code == 201
        for name, (_, io, vms, other) in PEAKS.items():
            body = {"days": [day_body(DAY, io=io, vms=vms, other=other),
                             day_body(BEFORE, io=io * 2, vms=vms / 2, other=other)]}
            r = c.post(f"/v1/hosts/{name}/days", json=body, headers=HOST)
            assert r.status_code == 202 and r.json() == {"days": 2}, r.text
        yield c


def test_the_peak_distribution_by_class_and_rack(api) -> None:  # type: ignore[no-untyped-def]
    r = api.get("/v1/fleet/utilization", params={"day": DAY, "group": "class", "bins": 10}, headers=ADM)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["window"] == "peak" and got["compare"] is None
    d = got["day"]
    assert (d["hosts_included"], d["hosts_missing"]) == (5, 1)
    vms = sorted(v[2] / 16 for v in PEAKS.values())  # 0.125 0.25 0.5 0.7 0.75
    assert d["groups"]["vms"] == {"hosts": 5, "mean": round(statistics.fmean(vms), 4),
                                  "median": 0.5, "p90": round(statistics.quantiles(vms, n=10, method="inclusive")[-1], 4)}
    assert [b["counts"].get("vms", 0) for b in d["bins"]] == [0, 1, 1, 0, 0, 1, 0, 2, 0, 0]
    assert [b["counts"].get("io", 0) for b in d["bins"]] == [0, 4, 1, 0, 0, 0, 0, 0, 0, 0]  # 0.1 is bin 1
    by_rack = api.get("/v1/fleet/utilization", params={"day": DAY, "group": "rack", "bins": 4}, headers=ADM).json()
    totals = {n: (io + vms + other) / 16 for n, (_, io, vms, other) in PEAKS.items()}  # h4 = 1.0: the last bin
    # 0.425 0.675 0.875 | 0.25 1.0
    assert [b["counts"] for b in by_rack["day"]["bins"]] == [{}, {"r1": 1, "r2": 1}, {"r1": 1}, {"r1": 1, "r2": 1}]
    assert by_rack["day"]["groups"]["r1"]["hosts"] == 3 and totals["h4"] == 1.0
    # a bin lists its hosts, by the request the bin names
    link = by_rack["day"]["bins"][3]["hosts"]
    listed = api.get(link, headers=ADM).json()
    assert [(h["host"], h["value"]) for h in listed["hosts"]] == [("h2", 0.875), ("h4", 1.0)]


def test_before_and_after_and_an_hours_window(api) -> None:  # type: ignore[no-untyped-def]
    got = api.get("/v1/fleet/utilization", params={"day": DAY, "compare": BEFORE, "group": "class"},
                  headers=ADM).json()
    assert got["compare"]["day"] == BEFORE
    assert got["compare"]["groups"]["io"]["mean"] == round(2 * got["day"]["groups"]["io"]["mean"], 4)
    hours = api.get("/v1/fleet/utilization", params={"day": DAY, "window": "20-23", "group": "state"},
                    headers=ADM).json()
    assert hours["day"]["groups"] == {"active": {"hosts": 5, "mean": 0.8, "median": 0.8, "p90": 0.8}}


def test_bad_questions_name_the_field(api) -> None:  # type: ignore[no-untyped-def]
    future = (dt.datetime.fromtimestamp(T0, dt.timezone.utc).date() + dt.timedelta(days=3)).isoformat()
    for params, field in (({"day": DAY, "window": "23-20"}, "window"), ({"day": DAY, "window": "evening"}, "window"),
                          ({"day": future}, "day"), ({"day": DAY, "compare": future}, "compare"),
                          ({"day": DAY, "bins": 10000}, "bins"), ({"day": DAY, "window": "20-23", "group": "class"},
                                                                  "group"),
                          ({"day": "yesterday"}, "day")):
        r = api.get("/v1/fleet/utilization", params=params, headers=ADM)
        assert r.status_code == 422 and r.json()["error"]["field"] == field, (params, r.text)
    assert api.get("/v1/fleet/utilization", params={"day": DAY}, headers=HOST).status_code == 403


def test_days_from_the_wrong_host_or_badly_made_change_nothing(api) -> None:  # type: ignore[no-untyped-def]
    future = (dt.datetime.fromtimestamp(T0, dt.timezone.utc).date() + dt.timedelta(days=3)).isoformat()
    before = api.get("/v1/fleet/utilization", params={"day": DAY, "group": "rack"}, headers=ADM).json()
    r = api.post("/v1/hosts/h0/days", json={"days": [day_body(DAY, io=0, vms=0, other=0)]}, headers=auth("hst2"))
    assert r.status_code == 403 and r.json()["error"]["code"] == "hyb.host.not_yours"
    bad = day_body(DAY, io=0, vms=0, other=0)
    for body, field in (({"days": [day_body(future, io=0, vms=0, other=0)]}, "days[0].day"),
                        ({"days": [bad | {"hours": [1] * 23}]}, "days[0].hours"),
                        ({"days": [bad | {"hist": [-1] * 20}]}, "days[0].hist"),
                        ({"days": [bad] * 4}, "days")):
        r = api.post("/v1/hosts/h0/days", json=body, headers=HOST)
        assert r.status_code == 422 and r.json()["error"]["field"] == field, (field, r.text)
    assert api.get("/v1/fleet/utilization", params={"day": DAY, "group": "rack"}, headers=ADM).json() == before


def test_a_host_day_is_stored_in_under_256_bytes(api) -> None:  # type: ignore[no-untyped-def]
    """What the database grows by per host and day of a busy day (every hour two digits,
    samples in every bin), its index on the day included: 2,000 rows written as the
    flusher writes them, measured with the database's own numbers (SQLite: its pages;
    PostgreSQL: the table's main fork and its index after VACUUM)."""
    from scheduler.repo import days as days_repo
    from scheduler.schemas.fleet import HostDayIn
    store = api.app.state.store
    busy = day_body(DAY, io=2.25, vms=11.125, other=0.875) | {"hours": [10 + 3 * h for h in range(24)],
                                                              "hist": [4320] * 20, "probe_p99_ms_max": 12.375,
                                                              "foreign_cpu_s": 1234.5, "probe_failed": 17}

    def size() -> int:
        with store.engine.execution_options(isolation_level="AUTOCOMMIT").connect() as c:
            if store.engine.dialect.name == "sqlite":  # a new table: its pages are these rows
                return c.exec_driver_sql("PRAGMA page_count").scalar() * c.exec_driver_sql("PRAGMA page_size").scalar()
            c.exec_driver_sql("VACUUM host_days")
            return c.exec_driver_sql("SELECT pg_relation_size('host_days') + pg_indexes_size('host_days')").scalar()
    before = size()
    rows = [days_repo.row_of(f"oss-{i:05d}", HostDayIn.model_validate(busy | {"day": f"2024-01-{1 + i % 28:02d}"}))
            for i in range(2000)]
    with store.write() as s:
        days_repo.upsert_many(session=s, rows=rows)
    per_row = (size() - before) / 2000
    print(f"history: {per_row:.0f} bytes per host and day ({store.engine.dialect.name})")
    assert per_row < 256, per_row


def test_distribution_pure() -> None:
    days = [Day(f"h{i}", "r", "active", "", 10, {"io": 1000, "vms": 1000 * i, "other": 0}, 60, [None] * 24)
            for i in range(10)]
    got = distribution(days, window=None, group="class", bins=10, expected=12)
    assert got["hosts_included"] == 10 and got["hosts_missing"] == 2
    assert [b["counts"].get("vms", 0) for b in got["bins"]] == [1] * 10
    assert distribution(days, window=(0, 24), group="rack", bins=5, expected=10)["hosts_included"] == 0


def test_days_are_written_by_the_flusher_without_any_heartbeat(db_url) -> None:  # type: ignore[no-untyped-def]
    """With the batching flusher on (as served), a day sent before the replica's first
    heartbeat is still written: the flusher starts with the first day or beat it keeps
    (it used to start only with a beat, and such days waited for one)."""
    import time as _time
    with make_client(db_url, clock=Clock(T0), stats={"heartbeat_flush_s": 0.1}) as c:
        assert c.post("/v1/hosts", json=host_body("h0", rack="r1"), headers=HOST).status_code == 201
        r = c.post("/v1/hosts/h0/days", json={"days": [day_body(DAY, io=1, vms=2, other=0)]}, headers=HOST)
        assert r.status_code == 202
        deadline = _time.monotonic() + 10
        while _time.monotonic() < deadline:
            got = c.get("/v1/fleet/utilization", params={"day": DAY}, headers=ADM).json()
            if got["day"]["hosts_included"] == 1:
                break
            _time.sleep(0.05)
        assert got["day"]["hosts_included"] == 1, got


def test_io_health_lists_the_hosts_over_a_limit(api) -> None:  # type: ignore[no-untyped-def]
    bad = day_body(DAY, io=1, vms=1, other=0) | {"probe_p99_ms_max": 80.0, "psi_some_avg10_max": 12.5,
                                                 "foreign_cpu_s": 30.0, "probe_failed": 0}
    assert api.post("/v1/hosts/h3/days", json={"days": [bad]}, headers=HOST).status_code == 202
    r = api.get("/v1/fleet/io-health", params={"day": DAY}, headers=ADM)
    assert r.status_code == 200, r.text
    got = r.json()
    assert (got["hosts_checked"], got["hosts_missing"]) == (5, 1)
    assert [(h["host"], h["over"]) for h in got["hosts_over"]] == [("h3", ["probe_p99_ms", "psi_some_avg10"])]
    assert got["limits"] == {"probe_p99_ms": 50.0, "psi_some_avg10": 10.0, "foreign_cpu_s": 60.0, "probe_failed": 0}
    # the others' probe p99 is 2.5 ms: a limit of 2 puts every host over it
    strict = api.get("/v1/fleet/io-health", params={"day": DAY, "probe_p99_ms": 2, "foreign_cpu_s": 10},
                     headers=ADM).json()
    assert [h["host"] for h in strict["hosts_over"]] == ["h0", "h1", "h2", "h3", "h4"]
    assert strict["hosts_over"][3]["over"] == ["probe_p99_ms", "psi_some_avg10", "foreign_cpu_s"]
    r = api.get("/v1/fleet/io-health", params={"day": DAY, "psi_some_avg10": 101}, headers=ADM)
    assert r.status_code == 422 and r.json()["error"]["field"] == "psi_some_avg10"
    assert api.get("/v1/fleet/io-health", params={"day": DAY}, headers=TA).status_code == 403


def test_the_heatmap_counts_each_day_as_the_utilization_does(db_url) -> None:  # type: ignore[no-untyped-def]
    """`GET /v1/fleet/utilization/heatmap` answers a run of days in one query (the peak
    window binned in the database); per day it must count what `GET /v1/fleet/utilization`
    counts per bin, groups summed, on both stores: shares on the exact bin edges, over the
    host's CPUs (capped at 1: the last bin), of hosts with no peak samples (left out), hours
    without samples, a day without data (zeros) and a host that sent nothing."""
    import random
    rng = random.Random(30)
    days = [f"2025-11-{d}" for d in range(21, 26)]
    with make_client(db_url, clock=Clock(T0)) as c:
        for i in range(25):
            assert c.post("/v1/hosts", json=host_body(f"m{i:02d}", rack=f"r{i % 3}"), headers=HOST).status_code == 201
        for i in range(24):  # m24 sends nothing
            cpus = (16, 12, 7, 48)[i % 4]
            sent = []
            for day in days:
                if rng.random() < 0.15:
                    continue  # a day this host did not report
                k = rng.randrange(0, 21)
                io, vms, other = rng.choice([(0.0, cpus * k / 20, 0.0),                   # an exact edge
                                             (cpus * 0.3, cpus * 0.5, cpus * 0.4),        # over its CPUs
                                             (rng.uniform(0, 2), rng.uniform(0, cpus), rng.uniform(0, 1))])
                body = day_body(day, io=io, vms=vms, other=other, cpus=cpus)
                body["peak"]["samples"] = 0 if rng.random() < 0.1 else 3600
                body["hours"] = [None if rng.random() < 0.2 else rng.randrange(0, 101) for _ in range(24)]
                sent.append(body)
            for j in range(0, len(sent), 3):
                r = c.post(f"/v1/hosts/m{i:02d}/days", json={"days": sent[j:j + 3]}, headers=HOST)
                assert r.status_code == 202, r.text
        for window in ("peak", "20-23", "0-24"):
            r = c.get("/v1/fleet/utilization/heatmap", params={"day": "2025-11-25", "days": 6, "window": window},
                      headers=ADM)
            assert r.status_code == 200, r.text
            hm = r.json()
            assert (hm["window"], hm["bins"]) == (window, 20)
            assert [d["day"] for d in hm["days"]] == ["2025-11-20", *days]   # oldest first
            assert hm["days"][0] == {"day": "2025-11-20", "counts": [0] * 20, "hosts": 0}
            for d in hm["days"][1:]:
                u = c.get("/v1/fleet/utilization", params={"day": d["day"], "window": window, "group": "state",
                                                           "bins": 20}, headers=ADM).json()["day"]
                assert d["counts"] == [sum(b["counts"].values()) for b in u["bins"]], (window, d["day"])
                assert d["hosts"] == u["hosts_included"] > 0
        for params, field in (({"day": "2025-11-25", "days": 0}, "days"), ({"day": "2025-11-25", "days": 401}, "days"),
                              ({"day": "2025-11-25", "bins": 0}, "bins"), ({"day": "2025-11-25", "window": "x"}, "window"),
                              ({"day": "2025-12-25"}, "day"), ({"day": "0001-01-05", "days": 6}, "days")):
            r = c.get("/v1/fleet/utilization/heatmap", params=params, headers=ADM)
            assert r.status_code == 422 and r.json()["error"]["field"] == field, (params, r.text)
        assert c.get("/v1/fleet/utilization/heatmap", params={"day": "2025-11-25"}, headers=HOST).status_code == 403
