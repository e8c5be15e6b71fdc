"""Heartbeats answered by the HTTP protocol (``api/beat_protocol.py``), on the wire: a real
uvicorn serving the scheduler's application over a socket, in this process so that a
test can tell which path answered. Every answer is the one the application gives with
the protocol's path off (status, body, headers), keep-alive, pipelining and HTTP/1.0
behave as uvicorn's own, and what the protocol does not take reaches the application
with its body intact."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import httptools
import orjson
import pytest
import uvicorn

from sched_helpers import HOST, host_body, make_client
from scheduler.api import fastpath
from scheduler.api.beat_protocol import BeatProtocol
from scheduler.cli import _http_protocol
from tools.dev.procs import free_port


KEEP_ALIVE_S = 1  # uvicorn's idle keep-alive (5 s by default)


@pytest.fixture
def served(db_url: str) -> Iterator[int]:
    """The scheduler's application under uvicorn with ``BeatProtocol``, beats kept in memory
    (flushed every 30 s, as a replica keeps them); its port. Hosts h1 and h2 registered,
    and known to the placement index (what beats are answered from)."""
    client = make_client(db_url, clock=time.time, stats={"heartbeat_flush_s": 30})
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(client.app, host="127.0.0.1", port=port, http=BeatProtocol,
                                           log_level="warning", access_log=False, lifespan="on",
                                           timeout_keep_alive=KEEP_ALIVE_S))
    t = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert t.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        for name in ("h1", "h2"):
            status, _, _ = exchange(port, request("POST", "/v1/hosts", orjson.dumps(host_body(name)),
                                                  [("Authorization", HOST["Authorization"]),
                                                   ("Content-Type", "application/json")]))[0]
            assert status == 201
        hosts = client.app.state.hosts  # the index reads them from the change feed, as its refresher does
        hosts.cache.refresh(hosts.store, now=time.time())
        assert all(hosts.cache.who(n) for n in ("h1", "h2"))
        yield port
    finally:
        server.should_exit = True
        t.join(30)
        client.store.dispose()


def request(method: str, path: str, body: bytes = b"", headers: list[tuple[str, str]] | None = None, *,
            version: str = "1.1", length: bool = True) -> bytes:
    head = [f"{method} {path} HTTP/{version}", "Host: t"]
    head += [f"{k}: {v}" for k, v in (headers or [])]
    if length:
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def beat(host: str = "h1", body: bytes = b"", token: str = "hst", *extra: tuple[str, str], **kw) -> bytes:  # type: ignore[no-untyped-def]
    return request("POST", f"/v1/hosts/{host}/heartbeat", body,
                   [("Authorization", f"Bearer {token}"), *extra], **kw)


class _Responses:
    """httptools' response parser, collecting (status, headers, body) per response."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.done: list[tuple[int, dict[str, str], bytes]] = []
        self._head: list[tuple[str, str]] = []
        self._body = b""

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head.append((name.decode().lower(), value.decode()))

    def on_body(self, body: bytes) -> None:
        self._body += body

    def on_message_complete(self) -> None:
        if self.parser.get_status_code() < 200:  # an interim answer (100 Continue)
            self._head, self._body = [], b""
            return
        self.done.append((self.parser.get_status_code(), dict(self._head), self._body))
        self._head, self._body = [], b""


def exchange(port: int, data: bytes | list[bytes], n: int = 1, *, closed: bool = False,
             pause: float = 0.0) -> list[tuple[int, dict[str, str], bytes]]:
    """Send ``data`` (a list: one send each, ``pause`` s apart) on one connection and read
    ``n`` responses; ``closed``: then read until the server closes it (else fail)."""
    got = _Responses()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        for i, chunk in enumerate(data if isinstance(data, list) else [data]):
            if i and pause:
                time.sleep(pause)
            s.sendall(chunk)
        while len(got.done) < n or closed:
            chunk = s.recv(65536)
            if not chunk:
                break
            got.parser.feed_data(chunk)
        if closed:
            assert not chunk, "the server kept the connection open"
    assert len(got.done) == n, got.done
    return got.done


@pytest.fixture
def taken(monkeypatch) -> list[str]:  # type: ignore[no-untyped-def]
    """The hosts of beats that reached the ASGI application (``fastpath.beat_first``)."""
    seen: list[str] = []
    real = fastpath.beat_first

    async def spy(app, scope, receive, send, name):  # type: ignore[no-untyped-def]
        seen.append(name)
        return await real(app, scope, receive, send, name)
    monkeypatch.setattr(fastpath, "beat_first", spy)
    return seen


def _same(a: tuple[int, dict[str, str], bytes], b: tuple[int, dict[str, str], bytes]) -> None:
    """Two answers equal but for the time in them (Date, last_heartbeat)."""
    assert a[0] == b[0], (a, b)
    ka = {k: v for k, v in a[1].items() if k not in ("date", "content-length")}
    kb = {k: v for k, v in b[1].items() if k not in ("date", "content-length")}
    assert ka == kb and "date" in a[1] and "date" in b[1], (a, b)
    ja, jb = orjson.loads(a[2]), orjson.loads(b[2])
    if a[0] == 200:
        assert ja.pop("last_heartbeat") > 0 and jb.pop("last_heartbeat") > 0
    assert ja == jb, (a, b)


JSON = ("Content-Type", "application/json")
ONE = ["h1"]  # the beat reached the application (beat_first) once
CASES = {  # case: (request, status, the hosts whose beat reached the application: [] when the protocol answered)
    "blank": (beat(), 200, []),
    "stats-null": (beat("h1", b'{"stats": null}', "hst", JSON), 200, []),
    "empty-object": (beat("h1", b"{}", "hst", JSON), 200, []),
    "admin": (beat("h1", b"", "adm"), 200, []),
    # handed over with their bodies: the route and the error mapper answer
    "not-json": (beat("h1", b"{nope", "hst", JSON), 422, ONE),
    "text": (beat("h1", b"{}", "hst", ("Content-Type", "text/plain")), 422, ONE),
    "bad-field": (beat("h1", b'{"stats": 7}', "hst", JSON), 422, ONE),
    "unknown-host": (beat("h9"), 404, ["h9"]),
    "tenant": (beat("h1", b"", "ta"), 403, ONE),
    "not-its-host": (beat("h1", b"", "oss1"), 403, ONE),
    # not taken: the gate's (401, 413) or uvicorn's own way
    "no-token": (request("POST", "/v1/hosts/h1/heartbeat"), 401, ONE),
    "bad-token": (beat("h1", b"", "nope"), 401, ONE),
    "token-twice": (beat("h1", b"", "hst", ("Authorization", "Bearer nope")), 401, ONE),
    "too-large": (beat("h1", b" " * (1 << 20) + b"{}", "hst", JSON), 413, ONE),
    "percent": (request("POST", "/v1/hosts/h%31/heartbeat", b"", [("Authorization", "Bearer hst")]), 200, ONE),
    "expect-continue": (beat("h1", b"", "hst", ("Expect", "100-continue")), 200, ONE),
    "chunked": (request("POST", "/v1/hosts/h1/heartbeat", b"2\r\n{}\r\n0\r\n\r\n",
                        [("Authorization", "Bearer hst"), JSON, ("Transfer-Encoding", "chunked")],
                        length=False), 200, ONE),
    "query": (request("POST", "/v1/hosts/h1/heartbeat?x=1", b"", [("Authorization", "Bearer hst")]), 200, []),
    "get": (request("GET", "/v1/hosts/h1/heartbeat", b"", [("Authorization", "Bearer hst")]), 405, []),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_beat_is_answered_as_the_application_answers_it(served, taken, monkeypatch, case):
    """Each request answered with the protocol's path on and off (``_take`` declining
    everything: uvicorn as usual, then ``fastpath``); the answers are the same. A steady
    beat never reached the application; what the protocol handed over reached it once,
    body and all (a query string or another method is no beat to either)."""
    data, status, reached = CASES[case]
    on = exchange(served, data)[0]
    assert taken == reached, (case, taken)
    with monkeypatch.context() as m:
        m.setattr(BeatProtocol, "_take", lambda self: None)
        off = exchange(served, data)[0]
    assert on[0] == status, on
    _same(on, off)


def test_keep_alive_and_pipelining_answer_every_request_in_order(served, taken):
    """Beats one after another on one connection, then pipelined in one packet with a
    request the application answers between them: every answer, in order, and the
    connection kept."""
    got = exchange(served, [beat(), beat("h2")], 2, pause=0.05)
    assert [(s, orjson.loads(b)["name"]) for s, _, b in got] == [(200, "h1"), (200, "h2")]
    healthz = request("GET", "/healthz")
    got = exchange(served, beat() + healthz + beat("h2") + beat("h9") + beat(), 5)
    assert [s for s, _, _ in got] == [200, 200, 200, 404, 200]
    assert [orjson.loads(b).get("name") for s, _, b in got if s == 200 and b.startswith(b'{"name"')] == \
        ["h1", "h2", "h1"]
    assert all("connection" not in h for _, h, _ in got)
    # the first beat answered by the protocol; those behind /healthz, still being answered
    # when they arrived, queued as uvicorn queues a pipeline, and the application answered them
    assert taken == ["h2", "h9", "h1"]
    # a beat whose body arrives in pieces
    data = beat("h1", b'{"stats": null}', "hst", JSON)
    cut = data.index(b"\r\n\r\n") + 6
    got = exchange(served, [data[:cut], data[cut:]], pause=0.05)
    assert got[0][0] == 200 and taken == ["h2", "h9", "h1"]


def test_a_beat_does_not_start_the_idle_timer_under_the_requests_after_it(served, monkeypatch):
    """A beat answered in the middle of a read, the request after it in the same read
    answered by the application more slowly than the keep-alive timeout: the connection
    stays open until that answer is sent (uvicorn's idle timer, armed by the beat's
    answer, would close it under the request still being answered), and the idle timer
    still closes the connection once it is idle."""
    import asyncio
    real = fastpath.beat_first

    async def slow(app, scope, receive, send, name):  # type: ignore[no-untyped-def]
        await asyncio.sleep(KEEP_ALIVE_S + 0.5)
        return await real(app, scope, receive, send, name)
    monkeypatch.setattr(fastpath, "beat_first", slow)
    got = exchange(served, beat() + beat("h9"), 2)
    assert [s for s, _, _ in got] == [200, 404]
    with socket.create_connection(("127.0.0.1", served), timeout=10) as s:
        s.sendall(beat())
        t0 = time.monotonic()
        data = b""
        while chunk := s.recv(65536):  # the answer, then the server's close once idle
            data += chunk
        assert data.startswith(b"HTTP/1.1 200") and KEEP_ALIVE_S * 0.9 < time.monotonic() - t0 < KEEP_ALIVE_S + 5


def test_http_1_0_and_connection_close_end_the_connection(served):
    for data in (beat(version="1.0"), beat("h1", b"", "hst", ("Connection", "close"))):
        [(status, head, _)] = exchange(served, data, closed=True)
        assert status == 200 and head["connection"] == "close"


def test_the_request_counter_counts_the_protocols_answers(served):
    def count() -> float:
        [(_, _, text)] = exchange(served, request("GET", "/metrics", b"", [("Authorization", "Bearer adm")]))
        line = 'hyb_sched_http_requests_total{method="POST",route="/v1/hosts/{name}/heartbeat",status="200"}'
        return next((float(x.split()[-1]) for x in text.decode().splitlines() if x.startswith(line)), 0.0)
    before = count()
    exchange(served, beat() + beat("h2"), 2)
    assert count() == before + 2


def test_a_replica_serves_with_the_beat_protocol():
    assert _http_protocol() is BeatProtocol
