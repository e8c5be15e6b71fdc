"""GET /v1/prometheus/targets (Prometheus http_sd) and the metrics address hostd registers
with POST /v1/hosts: labels, auth, bad input refused by field, one SELECT for the fleet."""

from __future__ import annotations

import hashlib

import pytest
from sqlalchemy import event

from sched_helpers import ADM, HOST, TA, auth, host_body, make_client, token_config

PROM = auth("prom")
DIGEST = "ab" * 32


@pytest.fixture
def api(db_url, clock):  # type: ignore[no-untyped-def]
    tokens = token_config() + [{"name": "prom", "sha256": hashlib.sha256(b"prom").hexdigest(),
                                "scopes": ["prometheus"]}]
    with make_client(db_url, clock=clock, auth={"tokens": tokens}) as c:
        yield c


def scraped(name: str, *, url: str = "", version: str | None = "1.2.0+abc", carved: str | None = DIGEST,
            rack: str = "r01") -> dict:
    body = host_body(name, rack=rack)
    body["metrics_url"] = url or f"http://10.0.0.{len(name)}:9743/metrics"
    if version is not None:
        body["hostd_version"] = version
    if carved is not None:
        body["carved_policy"] = carved
    return body


def test_targets_list_each_registered_metrics_address_with_labels(api, clock):
    assert api.post("/v1/hosts", json=scraped("oss-1", url="http://10.0.0.1:9743/metrics"), headers=HOST).status_code == 201
    assert api.post("/v1/hosts", json=scraped("oss-2", url="https://[fd00::2]:9100/hostd/metrics", version=None,
                                              carved="", rack="r02"), headers=HOST).status_code == 201
    old = host_body("oss-3")  # an older hostd: no metrics address, not a target
    assert api.post("/v1/hosts", json=old, headers=HOST).status_code == 201
    api.post("/v1/hosts/oss-2/cordon", headers=ADM)
    r = api.get("/v1/prometheus/targets", headers=PROM)
    assert r.status_code == 200, r.text
    assert r.json() == [
        {"targets": ["10.0.0.1:9743"], "labels": {
            "__scheme__": "http", "__metrics_path__": "/metrics", "host": "oss-1", "rack": "r01",
            "state": "active", "carved_policy": DIGEST, "hostd_version": "1.2.0+abc"}},
        {"targets": ["[fd00::2]:9100"], "labels": {
            "__scheme__": "https", "__metrics_path__": "/hostd/metrics", "host": "oss-2", "rack": "r02",
            "state": "cordoned", "carved_policy": ""}}]
    assert api.get("/v1/hosts/oss-1", headers=ADM).json()["metrics_url"] == "http://10.0.0.1:9743/metrics"
    assert api.get("/v1/hosts/oss-3", headers=ADM).json()["metrics_url"] is None
    clock.t += 3600  # silent past the heartbeat timeout: down, and still a target (Prometheus says why)
    assert {g["labels"]["state"] for g in api.get("/v1/prometheus/targets", headers=PROM).json()} == {"down"}
    assert api.get("/v1/prometheus/targets", headers=ADM).status_code == 200  # admin may too


def test_reregistration_replaces_the_address_without_a_generation_bump(api):
    assert api.post("/v1/hosts", json=scraped("oss-1"), headers=HOST).status_code == 201
    gen = api.get("/v1/hosts/oss-1", headers=ADM).json()["generation"]
    r = api.post("/v1/hosts", json=scraped("oss-1", url="http://10.9.9.9:9744", version="1.3.0"), headers=HOST)
    assert r.status_code == 200 and r.json()["generation"] == gen  # placement sees no change
    (g,) = api.get("/v1/prometheus/targets", headers=PROM).json()
    assert g["targets"] == ["10.9.9.9:9744"] and g["labels"]["__metrics_path__"] == "/metrics"
    assert g["labels"]["hostd_version"] == "1.3.0"
    # downgraded to a hostd that sends no metrics address: no longer a target
    assert api.post("/v1/hosts", json=host_body("oss-1", rack="r01"), headers=HOST).status_code == 200
    assert api.get("/v1/prometheus/targets", headers=PROM).json() == []


@pytest.mark.parametrize("field, value, says", [
    ("metrics_url", "ftp://10.0.0.1:9743/metrics", "scheme"),
    ("metrics_url", "10.0.0.1:9743", "scheme"),
    ("metrics_url", "http://10.0.0.1/metrics", "host:port"),
    ("metrics_url", "http://10.0.0.1:0/metrics", "host:port"),
    ("metrics_url", "http://10.0.0.1:70000/metrics", "host:port"),
    ("metrics_url", "http://user@10.0.0.1:9743/metrics", "host:port"),
    ("metrics_url", "http://bad host:9743/metrics", "host:port"),
    ("metrics_url", "http://10.0.0.1:9743/metrics?x=1", "query"),
    ("metrics_url", "http://10.0.0.1:9743/" + "m" * 400, "300"),
    ("hostd_version", "1.0 beta", "pattern"),
    ("carved_policy", "not-a-digest", "pattern"),
])
def test_bad_scrape_fields_are_refused_by_name_and_nothing_stored(api, field, value, says):
    body = scraped("oss-1") | {field: value}
    r = api.post("/v1/hosts", json=body, headers=HOST)
    err = r.json()["error"]
    assert r.status_code == 422 and err["field"] == field and says in err["message"], r.text
    assert api.get("/v1/hosts/oss-1", headers=ADM).status_code == 404
    assert api.get("/v1/prometheus/targets", headers=PROM).json() == []
    # a registered host keeps what it had
    assert api.post("/v1/hosts", json=scraped("oss-1", url="http://10.0.0.1:9743/metrics"), headers=HOST).status_code == 201
    assert api.post("/v1/hosts", json=body, headers=HOST).status_code == 422
    (g,) = api.get("/v1/prometheus/targets", headers=PROM).json()
    assert g["targets"] == ["10.0.0.1:9743"] and g["labels"]["hostd_version"] == "1.2.0+abc"


def test_targets_need_the_prometheus_scope_or_admin(api):
    assert api.post("/v1/hosts", json=scraped("oss-1"), headers=HOST).status_code == 201
    assert api.get("/v1/prometheus/targets").status_code == 401
    for who in (HOST, TA, auth("oss1")):  # a host or tenant token does not see the fleet's addresses
        r = api.get("/v1/prometheus/targets", headers=who)
        assert r.status_code == 403 and r.json()["error"]["code"] == "hyb.auth.forbidden", r.text
    assert api.get("/v1/hosts", headers=PROM).status_code == 403  # and the prometheus scope reads nothing else


def test_targets_of_a_fleet_are_one_select(api):
    n = 300
    for i in range(n):
        assert api.post("/v1/hosts", json=scraped(f"h{i:04d}", url=f"http://10.1.{i // 250}.{i % 250}:9743/metrics"),
                        headers=HOST).status_code == 201
    api.get("/v1/prometheus/targets", headers=PROM)  # tokens and caches warm
    stmts: list[str] = []

    def seen(_conn, _cursor, statement, *_a):  # type: ignore[no-untyped-def]
        stmts.append(statement)
    engine = api.app.state.store.engine
    event.listen(engine, "before_cursor_execute", seen)
    try:
        r = api.get("/v1/prometheus/targets", headers=PROM)
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    assert r.status_code == 200 and len(r.json()) == n
    queries = [s for s in stmts if s.lstrip().split(" ", 1)[0].upper() in ("SELECT", "INSERT", "UPDATE", "DELETE")
               and "api_tokens" not in s]  # not BEGIN, nor the token book's own refresh
    assert len(queries) == 1 and queries[0].lstrip().upper().startswith("SELECT") and "hosts" in queries[0], stmts


def _gc_pauses(text: str) -> dict[str, float]:
    """hyb_sched_gc_pause_seconds_count by generation, from /metrics."""
    out = {}
    for ln in text.splitlines():
        if ln.startswith("hyb_sched_gc_pause_seconds_count{"):
            out[ln.split('generation="')[1].split('"')[0]] = float(ln.split()[-1])
    return out


def test_gc_pauses_are_counted_by_generation_while_the_app_serves(db_url, clock):
    """A full collection while the app serves is one more full pause in /metrics; once the
    app has stopped, its callback is gone from the process (another app may follow)."""
    import gc

    with make_client(db_url, clock=clock) as c:
        app = c.app
        before = _gc_pauses(c.get("/metrics", headers=ADM).text)
        gc.collect()
        gc.collect(0)
        after = _gc_pauses(c.get("/metrics", headers=ADM).text)
        assert after["2"] >= before["2"] + 1 and after["0"] >= before["0"] + 1, (before, after)
        assert app.state.metrics.gc_pauses._callback in gc.callbacks
    assert app.state.metrics.gc_pauses._callback not in gc.callbacks


def test_the_heap_built_at_start_is_frozen_while_the_app_serves(db_url, clock):
    """With ``gc_freeze_s`` the objects alive once the index is warm are out of the
    collector's walks (the permanent generation) while the app serves, and back when it
    stops; with 0 nothing is frozen."""
    import gc

    with make_client(db_url, clock=clock, server={"gc_freeze_s": 600}) as c:
        assert c.post("/v1/hosts", json=host_body("fz-1"), headers=ADM).status_code in (200, 201)
        assert gc.get_freeze_count() > 0
        cache = c.app.state.hosts.cache  # there at the freeze: no generation walks it
        assert not any(o is cache for g in range(3) for o in gc.get_objects(generation=g))
    assert gc.get_freeze_count() == 0
    with make_client(db_url, clock=clock):
        assert gc.get_freeze_count() == 0


def test_a_full_collection_freezes_its_survivors_and_a_refreeze_collects_a_cycle_that_died_frozen() -> None:
    """Survivors of a full collection are frozen (the next one does not walk them); the
    cost of that, bounded: a reference cycle frozen while alive and dropped afterwards
    survives collections until ``refreeze`` (unfreeze, collect, freeze)."""
    import gc
    import weakref

    from scheduler.heap import HeapFreeze

    class Node:
        pass
    heap = HeapFreeze(600)
    try:
        heap.install()
        a, b = Node(), Node()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        assert any(o is a for o in gc.get_objects(generation=0))  # young, walked
        gc.collect()
        assert not any(o is a for g in range(3) for o in gc.get_objects(generation=g))  # frozen
        del a, b
        gc.collect()
        assert gone() is not None  # frozen: no collection walks it
        heap.refreeze()
        assert gone() is None
        assert gc.get_freeze_count() > 0  # the survivors frozen again
    finally:
        heap.thaw()
    assert gc.get_freeze_count() == 0 and heap._after not in gc.callbacks


@pytest.mark.parametrize("value", [-1, 86401, 1e300])
def test_a_gc_freeze_period_out_of_range_is_refused_naming_the_key(value) -> None:
    """A period under 0 or over a day (a sleep the event loop cannot schedule) is a
    configuration error naming ``server.gc_freeze_s``, before anything starts."""
    from pydantic import ValidationError

    from scheduler.config import Settings
    with pytest.raises(ValidationError) as e:
        Settings(server={"gc_freeze_s": value}, db={"url": "sqlite:///:memory:"})
    assert [err["loc"] for err in e.value.errors()] == [("server", "gc_freeze_s")], e.value.errors()
