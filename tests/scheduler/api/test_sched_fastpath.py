"""The claim request's fast path (``api/fastpath.py``): it answers a claim exactly as the
route does (status, body, headers, the request counter), including the claim's own
errors, and hands every other create request, with the body it already read, to the
full application, whose route and error mapper answer it as before."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from tools.dev.host_shapes import SHAPES
from sched_helpers import ADM, HOST, TA, Clock, auth, host_body, make_client, vm_body
from scheduler.api import fastpath
from scheduler.api.routes import vms as vm_routes


def _comparable(r):  # type: ignore[no-untyped-def]
    """A create answer without what differs between two VMs (id, Location)."""
    body = r.json()
    if "id" in body:
        body = {k: v for k, v in body.items() if k != "id"}
    heads = {k: v for k, v in r.headers.items() if k not in ("location", "server-timing", "content-length")}
    return r.status_code, body, heads, "server-timing" in r.headers, r.headers.get("location", "").count("/")


def _both(api, monkeypatch, key: str, body: dict, headers: dict | None = None):  # type: ignore[no-untyped-def]
    """The same request through the fast path, then through the route (the fast path off)."""
    h = {**TA, **(headers or {})}
    fast = api.post("/v1/vms", json=body, headers={**h, "Idempotency-Key": f"{key}-f"})
    with monkeypatch.context() as m:
        m.setattr(fastpath, "claims", lambda scope: False)
        slow = api.post("/v1/vms", json=body, headers={**h, "Idempotency-Key": f"{key}-s"})
    return fast, slow


def test_fast_path_answers_claims_as_the_route_does(db_url, monkeypatch):
    with make_client(db_url, clock=Clock()) as api:
        for n in ("h1", "h2"):
            assert api.post("/v1/hosts", json=host_body(n, SHAPES[0]), headers=HOST).status_code == 201
        fast, slow = _both(api, monkeypatch, "a", vm_body(vcpus=2))
        assert fast.status_code == 202 and _comparable(fast)[1]["status"] == "pending"
        # the two VMs differ only in where they went (the second cannot have the same CPUs)
        f, s = _comparable(fast), _comparable(slow)
        assert (f[0], f[2], f[3], f[4]) == (s[0], s[2], s[3], s[4])
        assert {k for k in f[1]} == {k for k in s[1]} and f[1]["request"] == s[1]["request"]
        # a replay answers 200 and the same VM, whichever path took the first request
        again = api.post("/v1/vms", json=vm_body(vcpus=2), headers={**TA, "Idempotency-Key": "a-s"})
        assert again.status_code == 200 and again.json()["id"] == slow.json()["id"]
        # the claim's own errors: 507 with the rejections counted, 409 for a key reused
        big_f, big_s = _both(api, monkeypatch, "big", vm_body(vcpus=512))
        assert big_f.status_code == 507 and _comparable(big_f) == _comparable(big_s)
        assert big_f.json()["error"]["rejections"]
        mis = api.post("/v1/vms", json=vm_body(vcpus=4), headers={**TA, "Idempotency-Key": "a-f"})
        with monkeypatch.context() as m:
            m.setattr(fastpath, "claims", lambda scope: False)
            mis_s = api.post("/v1/vms", json=vm_body(vcpus=4), headers={**TA, "Idempotency-Key": "a-f"})
        assert mis.status_code == 409 and mis.json() == mis_s.json()
        assert mis.json()["error"]["field"] == "Idempotency-Key"
        # the request counter sees both paths alike
        metrics = api.get("/metrics", headers=ADM).text
        assert 'hyb_sched_http_requests_total{method="POST",route="/v1/vms",status="202"} 2.0' in metrics
        assert 'hyb_sched_http_requests_total{method="POST",route="/v1/vms",status="507"} 2.0' in metrics


@pytest.mark.parametrize("case", ["no-key", "bad-key", "bad-token", "no-token", "bad-field", "not-json",
                                  "other-tenant", "dry-run"])
def test_fast_path_hands_everything_else_to_the_route(db_url, monkeypatch, case):
    """Each of these reaches the route (counted through ``create_inputs``) and gets the
    error mapper's answer, but for a missing or bad token, which the gate refuses before
    anything reads the body; a valid claim never reaches the route."""
    seen = []
    real = vm_routes.create_inputs

    async def counted(request):  # type: ignore[no-untyped-def]
        seen.append(1)
        return await real(request)
    monkeypatch.setattr(vm_routes, "create_inputs", counted)
    with make_client(db_url, clock=Clock()) as api:
        assert api.post("/v1/hosts", json=host_body("h1", SHAPES[0]), headers=HOST).status_code == 201
        ok = api.post("/v1/vms", json=vm_body(), headers={**TA, "Idempotency-Key": "ok"})
        assert ok.status_code == 202 and seen == []
        key = {"Idempotency-Key": "k1"}
        path, kw = "/v1/vms", {"json": vm_body(), "headers": {**TA, **key}}
        want = {"no-key": (422, "Idempotency-Key"), "bad-key": (422, "Idempotency-Key"),
                "bad-token": (401, "Authorization"), "no-token": (401, "Authorization"),
                "bad-field": (422, "vcpus"), "not-json": (422, "body"), "other-tenant": (403, "tenant"),
                "dry-run": (200, None)}[case]
        if case == "no-key":
            kw["headers"] = TA
        elif case == "bad-key":
            kw["headers"] = {**TA, "Idempotency-Key": "white space"}
        elif case == "bad-token":
            kw["headers"] = {"Authorization": "Bearer nope", **key}
        elif case == "no-token":
            kw["headers"] = key
        elif case == "bad-field":
            kw["json"] = vm_body(vcpus=0)
        elif case == "not-json":
            kw = {"content": b"name=x", "headers": {**TA, **key, "Content-Type": "application/x-www-form-urlencoded"}}
        elif case == "other-tenant":
            kw["json"] = vm_body(tenant="b")
        else:
            path = "/v1/vms?dry_run=true"
        r = api.post(path, **kw)
        # without a valid token the gate answers before the body is read (api/gate.py)
        assert seen == ([] if case in ("bad-token", "no-token") else [1]), case
        assert r.status_code == want[0], r.text
        if want[1] is not None:
            assert r.json()["error"]["field"] == want[1]
        else:
            assert r.json()["fits"] is True
        # nothing was claimed by any of them
        vms = api.get("/v1/vms", headers=ADM).json()["items"]
        assert [v["id"] for v in vms] == [ok.json()["id"]]


def test_fast_path_reads_a_body_in_chunks_and_replays_it_to_the_route(db_url):
    """Straight ASGI calls: a body in two chunks is claimed; the same body with no key is
    handed to the route with every byte (the route answers about the key, not the body)."""
    with make_client(db_url, clock=Clock()) as api:
        assert api.post("/v1/hosts", json=host_body("h1", SHAPES[0]), headers=HOST).status_code == 201
        app = api.app
        raw = vm_routes.orjson.dumps(vm_body())

        async def call(headers: list[tuple[bytes, bytes]]) -> tuple[int, bytes]:
            chunks = [{"type": "http.request", "body": raw[:10], "more_body": True},
                      {"type": "http.request", "body": raw[10:], "more_body": False}]
            out: list[dict] = []

            async def receive():  # type: ignore[no-untyped-def]
                if chunks:
                    return chunks.pop(0)
                await asyncio.sleep(3600)  # the client stays; nothing more to read

            async def send(msg):  # type: ignore[no-untyped-def]
                out.append(msg)
            scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                     "scheme": "http", "path": "/v1/vms", "raw_path": b"/v1/vms", "query_string": b"",
                     "root_path": "", "headers": [(b"content-type", b"application/json"), *headers],
                     "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80), "state": {}}
            await app(scope, receive, send)
            return out[0]["status"], b"".join(m.get("body", b"") for m in out[1:])

        tok = [(b"authorization", TA["Authorization"].encode())]
        status, body = asyncio.run(call([*tok, (b"idempotency-key", b"chunked")]))
        assert status == 202, body
        status, body = asyncio.run(call(tok))
        assert status == 422 and b'"field":"Idempotency-Key"' in body


def test_fast_path_failure_of_ours_is_a_500_like_the_routes(db_url, monkeypatch):
    """An unexpected failure in the claim: 500 ``hyb.scheduler.internal`` naming the
    exception type only, on either path."""
    with make_client(db_url, clock=Clock()) as api:
        assert api.post("/v1/hosts", json=host_body("h1", SHAPES[0]), headers=HOST).status_code == 201

        async def broken(*a, **kw):  # type: ignore[no-untyped-def]
            raise KeyError("internal detail")
        monkeypatch.setattr(api.app.state.vms, "create_async", broken)
        fast, slow = _both(api, monkeypatch, "x", vm_body())
        assert fast.status_code == slow.status_code == 500
        assert fast.json() == slow.json() == {"error": {"code": "hyb.scheduler.internal", "field": None,
                                                        "message": "KeyError"}}


def _twice(api, monkeypatch, switch: str, path: str, **kw):  # type: ignore[no-untyped-def]
    """The same request with the fast path on, then off (``switch``: its matcher)."""
    fast = api.post(path, **kw)
    with monkeypatch.context() as m:
        m.setattr(fastpath, switch, lambda scope: False)
        slow = api.post(path, **kw)
    return fast, slow


JSON = {"Content-Type": "application/json"}
CREATES = {  # case: (body bytes, extra headers, key, status)
    "good": (orjson.dumps(vm_body()), JSON, "k", 202),
    "good-charset": (orjson.dumps(vm_body()), {"Content-Type": "application/json; charset=utf-8"}, "k", 202),
    "good-no-type": (orjson.dumps(vm_body()), {}, "k", 202),
    "bad-field": (orjson.dumps(vm_body(vcpus=0)), JSON, "k", 422),
    "extra-field": (orjson.dumps({**vm_body(), "surprise": 1}), JSON, "k", 422),
    "bad-json": (b"{not json", JSON, "k", 422),
    "blank": (b"  ", JSON, "k", 422),
    "array": (b"[1]", JSON, "k", 422),
    "text": (orjson.dumps(vm_body()), {"Content-Type": "text/plain"}, "k", 422),
    "other-tenant": (orjson.dumps(vm_body(tenant="b")), JSON, "k", 403),
    "no-key": (orjson.dumps(vm_body()), JSON, None, 422),
    "bad-key": (orjson.dumps(vm_body()), JSON, "a b", 422),
}


@pytest.mark.parametrize("case", sorted(CREATES))
def test_a_create_gets_the_same_answer_from_the_fast_path_and_the_route(db_url, monkeypatch, case):
    """Both read the request with one reader (api/wire.py): the same status and body for
    the same good and bad requests (a good one differs only in its id and CPUs)."""
    raw, heads, key, status = CREATES[case]
    with make_client(db_url, clock=Clock()) as api:
        assert api.post("/v1/hosts", json=host_body("h1", SHAPES[0]), headers=HOST).status_code == 201
        if key is None:
            fast, slow = _twice(api, monkeypatch, "claims", "/v1/vms", content=raw, headers={**TA, **heads})
        else:  # a key each: a second create with one key would be a replay
            fast = api.post("/v1/vms", content=raw, headers={**TA, **heads, "Idempotency-Key": f"{key}f"})
            with monkeypatch.context() as m:
                m.setattr(fastpath, "claims", lambda scope: False)
                slow = api.post("/v1/vms", content=raw, headers={**TA, **heads, "Idempotency-Key": f"{key}s"})
        assert fast.status_code == slow.status_code == status, (fast.text, slow.text)
        if status == 202:
            f, s = fast.json(), slow.json()
            assert {k: v for k, v in f.items() if k not in ("id", "placement")} == \
                {k: v for k, v in s.items() if k not in ("id", "placement")}
        else:
            assert fast.json() == slow.json()


STATS = {"at": 1.0, "interval_s": 10.0, "samples": 10, "io_cpu_busy": 0.2, "io_cpu_busy_max": 0.4,
         "cpu_io_service": 0.5, "cpu_vms": 1.0, "cpu_other": 0.1, "foreign_threads_max": 0, "foreign_cpu_s": 0.0,
         "irqs_per_s": 100.0}
BEATS = {  # case: (body bytes, headers, host, status)
    "good": (orjson.dumps({"stats": STATS}), {**HOST, **JSON}, "h1", 200),
    "no-stats": (orjson.dumps({"stats": None}), {**HOST, **JSON}, "h1", 200),
    "none": (b"", HOST, "h1", 200),
    "blank": (b" \n", {**HOST, **JSON}, "h1", 200),
    "null": (b"null", {**HOST, **JSON}, "h1", 200),
    "no-type": (b"{}", HOST, "h1", 200),
    "bad-json": (b"{not json", {**HOST, **JSON}, "h1", 422),
    "bad-field": (b'{"stats": {"at": -1}}', {**HOST, **JSON}, "h1", 422),
    "extra-field": (b'{"surprise": 1}', {**HOST, **JSON}, "h1", 422),
    "text": (b"{}", {**HOST, "Content-Type": "text/plain"}, "h1", 422),
    "tenant": (b"{}", {**TA, **JSON}, "h1", 403),
    "tenant-bad-body": (b"{not json", {**TA, **JSON}, "h1", 403),
    "not-yours": (b"{}", {**auth("hst2"), **JSON}, "h1", 403),
    "unknown": (b"{}", {**HOST, **JSON}, "h9", 404),
}


@pytest.mark.parametrize("case", sorted(BEATS))
def test_a_heartbeat_gets_the_same_answer_from_the_fast_path_and_the_route(db_url, monkeypatch, case):
    """The heartbeat route and the fast path read the body with one reader (api/wire.py):
    a blank body was a beat on the fast path and a 422 on the route before."""
    raw, heads, host, status = BEATS[case]
    with make_client(db_url, clock=Clock()) as api:
        assert api.post("/v1/hosts", json=host_body("h1", SHAPES[0]), headers=HOST).status_code == 201
        fast, slow = _twice(api, monkeypatch, "beat_name", f"/v1/hosts/{host}/heartbeat", content=raw, headers=heads)
        assert (fast.status_code, fast.json()) == (slow.status_code, slow.json())
        assert fast.status_code == status, fast.text


def _asgi(app, path: str, headers: list[tuple[bytes, bytes]], chunks: list[bytes]):  # type: ignore[no-untyped-def]
    """One request straight into the ASGI app (no client to tidy its path or headers):
    (status, headers, body)."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": headers, "client": ("127.0.0.1", 5), "server": ("127.0.0.1", 80)}
    msgs = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    out: list[dict] = []

    async def receive() -> dict:
        return msgs.pop(0) if msgs else {"type": "http.disconnect"}

    async def send(m: dict) -> None:
        out.append(m)

    async def go() -> None:
        await app(scope, receive, send)
    asyncio.run(go())
    return out[0]["status"], dict(out[0]["headers"]), b"".join(m.get("body", b"") for m in out[1:])


def _h(token: str | None = "hst", length: int | None = 0, *extra: tuple[bytes, bytes]) -> list[tuple[bytes, bytes]]:
    h = [(b"host", b"t")]
    if token is not None:
        h.append((b"authorization", f"Bearer {token}".encode()))
    if length is not None:
        h.append((b"content-length", str(length).encode()))
    return h + list(extra)


BIG = b"{" + b" " * (1 << 20) + b"}"  # over server.max_body_bytes (1 MiB), under an admin's limit
DISPATCH = {  # case: (path, headers, body chunks): the gate's cases, ahead of which a beat is now taken
    "good": ("/v1/hosts/h1/heartbeat", _h(), [b""]),
    "no-token": ("/v1/hosts/h1/heartbeat", _h(None), [b""]),
    "bad-token": ("/v1/hosts/h1/heartbeat", _h("nope"), [b""]),
    "not-bearer": ("/v1/hosts/h1/heartbeat", [(b"authorization", b"Basic aHN0Og=="), (b"content-length", b"0")],
                   [b""]),
    "token-twice-last-bad": ("/v1/hosts/h1/heartbeat", _h("hst", 0, (b"authorization", b"Bearer nope")), [b""]),
    "token-twice-last-good": ("/v1/hosts/h1/heartbeat",
                              [(b"authorization", b"Bearer nope")] + _h("hst", 0), [b""]),
    "length-twice": ("/v1/hosts/h1/heartbeat", _h("hst", 2, (b"content-length", str(len(BIG)).encode())), [b"{}"]),
    "too-large": ("/v1/hosts/h1/heartbeat", _h("hst", len(BIG)), [BIG]),
    "too-large-admin": ("/v1/hosts/h1/heartbeat", _h("adm", len(BIG)), [BIG]),
    "bad-length": ("/v1/hosts/h1/heartbeat", _h("hst", None, (b"content-length", b"x")), [b""]),
    "chunked": ("/v1/hosts/h1/heartbeat", _h("hst", None, (b"content-type", b"application/json")),
                [b'{"sta', b'ts": null}']),
    "chunked-too-large": ("/v1/hosts/h1/heartbeat", _h("hst", None), [BIG[:600_000], BIG[600_000:]]),
    "dot": ("/v1/hosts/../heartbeat", _h(), [b""]),
    "dot-one": ("/v1/hosts/./heartbeat", _h(), [b""]),
    "unknown": ("/v1/hosts/h9/heartbeat", _h(), [b""]),
    "tenant": ("/v1/hosts/h1/heartbeat", _h("ta"), [b""]),
}


@pytest.mark.parametrize("case", sorted(DISPATCH))
def test_a_beat_taken_first_is_answered_as_the_gate_and_route_answer_it(db_url, monkeypatch, case):
    """A heartbeat is taken ahead of the console's and the gate's checks
    (``fastpath.beat_first``), only when the gate would admit it as it is: for every
    case the gate decides (no token, a bad one, a header twice, a body too large, a
    chunked one, dot segments) the answer is the one the application gave before, with
    beats taken after the gate (``beat_name`` off: the gate, then the route)."""
    path, heads, chunks = DISPATCH[case]
    with make_client(db_url, clock=Clock()) as api:
        assert api.post("/v1/hosts", json=host_body("h1", SHAPES[0]), headers=HOST).status_code == 201
        first = _asgi(api.app, path, heads, chunks)
        with monkeypatch.context() as m:
            m.setattr(fastpath, "beat_name", lambda scope: "")
            before = _asgi(api.app, path, heads, chunks)
        strip = ("content-length", b"content-length")
        assert first[0] == before[0], (first, before)
        assert {k: v for k, v in first[1].items() if k not in strip} == \
            {k: v for k, v in before[1].items() if k not in strip}
        assert orjson.loads(first[2]) == orjson.loads(before[2]) or first[2] == before[2]


def test_an_open_beat_path_is_left_to_the_gate(db_url, monkeypatch):
    """``server.open_endpoints`` covering the beat's path: the gate lets it through
    unauthenticated, so ``beat_first`` must not refuse it (it hands it over)."""
    with make_client(db_url, clock=Clock(), server={"open_endpoints": ["/healthz", "/v1/hosts"]}) as api:
        assert api.post("/v1/hosts", json=host_body("h1", SHAPES[0]), headers=HOST).status_code == 201
        seen: list[str] = []
        real = fastpath.heartbeat

        async def spy(app, scope, receive, send, name=""):  # type: ignore[no-untyped-def]
            seen.append("first" if name else "after-gate")
            return await real(app, scope, receive, send, name)
        monkeypatch.setattr(fastpath, "heartbeat", spy)
        got = _asgi(api.app, "/v1/hosts/h1/heartbeat", _h(), [b""])
        assert got[0] == 200 and seen == ["after-gate"], (got, seen)
        got = _asgi(api.app, "/v1/hosts/h1/heartbeat", _h(None), [b""])  # no token: the route's 401
        assert got[0] == 401 and seen == ["after-gate"] * 2, (got, seen)


def test_a_good_beat_does_not_pass_the_gates_general_checks(db_url, monkeypatch):
    """The steady beat (kept in memory, as a replica keeps beats) is admitted by
    ``beat_first`` (the gate's own rules) and answered without ``gate.admit``'s pass (the
    console's check, the settings' lookups, the headers' dict) or the router; anything
    it hands over still goes through the gate."""
    from scheduler.api import gate
    with make_client(db_url, clock=Clock(), stats={"heartbeat_flush_s": 30}) as api:
        assert api.post("/v1/hosts", json=host_body("h1", SHAPES[0]), headers=HOST).status_code == 201
        hosts = api.app.state.hosts
        hosts.cache.refresh(hosts.store, now=Clock()())  # as its refresher does
        calls: list[str] = []
        real = gate.admit

        async def counted(scope, *a, **kw):  # type: ignore[no-untyped-def]
            calls.append(scope["path"])
            return await real(scope, *a, **kw)
        monkeypatch.setattr(gate, "admit", counted)
        assert _asgi(api.app, "/v1/hosts/h1/heartbeat", _h(), [b""])[0] == 200
        assert calls == []
        assert _asgi(api.app, "/v1/hosts/h1/heartbeat", _h("nope"), [b""])[0] == 401
        assert calls == ["/v1/hosts/h1/heartbeat"]


def _reg(name: str = "h2", **over) -> bytes:  # type: ignore[no-untyped-def]
    return orjson.dumps({**host_body(name, SHAPES[0]), **over})


_BAD_LAYOUT = host_body("h2", SHAPES[0])
_BAD_LAYOUT["layout"]["nodes"][0]["vm_cpus"][0] = "x"
REGISTERS = {  # case: (body bytes, headers, status): h1 is registered by hst first
    "good": (_reg(), {**HOST, **JSON}, 201),
    "no-type": (_reg(), HOST, 422),  # FastAPI reads no body without a JSON Content-Type
    "vendor-json": (_reg(), {**HOST, "Content-Type": "application/vnd.hyb+json; charset=utf-8"}, 201),
    "text-json": (_reg(), {**HOST, "Content-Type": "text/json"}, 422),
    "again": (_reg("h1"), {**HOST, **JSON}, 200),
    "admin": (_reg(), {**ADM, **JSON}, 201),
    "bad-name": (_reg("no spaces"), {**HOST, **JSON}, 422),
    "extra-field": (orjson.dumps({**host_body("h2", SHAPES[0]), "surprise": 1}), {**HOST, **JSON}, 422),
    "bad-json": (b"{not json", {**HOST, **JSON}, 422),
    "array": (b"[1]", {**HOST, **JSON}, 422),
    "text": (_reg(), {**HOST, "Content-Type": "text/plain"}, 422),
    "bad-layout": (orjson.dumps(_BAD_LAYOUT), {**HOST, **JSON}, 422),
    "tenant": (_reg(), {**TA, **JSON}, 403),
    "not-yours": (_reg("h1"), {**auth("hst2"), **JSON}, 403),
    "bound-elsewhere": (_reg("h2"), {**auth("oss1"), **JSON}, 403),
}


@pytest.mark.parametrize("case", sorted(REGISTERS))
def test_a_registration_gets_the_same_answer_from_the_fast_path_and_the_route(db_url, monkeypatch, case):
    """The fast path takes only what the route's body would validate to, and renders the
    registration's answers as the route does: the same status and body each way (each
    way on a database of its own, so a first registration is a first one both times),
    and the same host and audit written."""
    raw, heads, status = REGISTERS[case]
    got = []
    for on in (True, False):
        with make_client(db_url if on else db_url.replace("sched.db", "sched-slow.db") if "sqlite" in db_url
                         else _fresh_pg(db_url), clock=Clock()) as api:
            assert api.post("/v1/hosts", json=host_body("h1", SHAPES[0]), headers=HOST).status_code == 201
            answered: list[bool] = []
            real = fastpath.register

            async def spy(*a):  # type: ignore[no-untyped-def]
                replay = await real(*a)
                answered.append(replay is None)
                return replay
            with monkeypatch.context() as m:
                m.setattr(fastpath, "register", spy)
                if not on:
                    m.setattr(fastpath, "registers", lambda scope: False)
                r = api.post("/v1/hosts", content=raw, headers=heads)
            # on: the fast path answered what the registration answers, and handed over
            # what the route refuses before the service; off: it never ran
            assert answered == ([r.status_code in (200, 201) or r.json()["error"]["code"].startswith("hyb.host.")]
                                if on else []), (answered, r.text)
            hosts = api.get("/v1/hosts", headers=ADM).json()["items"]
            audit = [(a["action"], a["target"], a["principal"]) for a in
                     api.get("/v1/audit", params={"action": "host."}, headers=ADM).json()["items"]]
            metric = [ln for ln in api.get("/metrics", headers=ADM).text.splitlines()
                      if ln.startswith("hyb_sched_http_requests_total") and 'route="/v1/hosts"' in ln
                      and 'method="POST"' in ln]
            got.append((r.status_code, r.json(), hosts, audit, metric))
    fast, slow = got
    assert fast[0] == status, fast[1]
    assert fast == slow


def _fresh_pg(url: str) -> str:
    from sched_helpers import new_pg_database  # noqa: PLC0415 - not conftest: under xdist another one answers to the name
    return new_pg_database(url.rsplit("/", 1)[0])
