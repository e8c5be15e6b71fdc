"""Heartbeats answered by the HTTP protocol itself, before they become ASGI requests.

A replica at 100,000 hosts answers 10,000 beats a second. After everything in the beat's
own path was cut (``api/fastpath.py``, the one-entry-a-host index, the frozen heap), a
served beat still cost ~1.8x a bare ASGI app answering the same request, and a served
run with the whole liveness path taken out still cost 1.6x: what was left is the
machinery around the request, not its work. uvicorn builds a request's ASGI scope and a
request-response cycle, starts a task for it, and the application then reads the body
and sends its answer through awaitables. A beat needs none of it: its request line,
three headers and a body of a few hundred bytes are parsed by the time the message is
complete, and its answer comes from memory without waiting on anything.

``BeatProtocol`` is uvicorn's httptools protocol with one change: a request that is a
heartbeat the gate would admit unchanged (``fastpath.admit_beat``: the same rules, the
same token book) is not turned into an ASGI request. Its body is kept as it arrives, and
once the message is complete the answer (``fastpath.beat_answer``: the same function
the ASGI path answers with) is written to the transport in the same turn of the event
loop, with the headers uvicorn sends (``Date``, ``Server``), counted by the same request
counter. Everything else goes the usual way, decided before any of it is read:

- a request that is not a heartbeat, or one the gate would not admit as it is (no or an
  unknown token, a repeated header, a body over the limit): uvicorn as usual, the gate
  answers;
- ``Expect: 100-continue``, a request pipelined behind one still being answered, a
  ``root_path``, a percent-encoded path, uvicorn's concurrency limit: uvicorn as usual
  (its access log, when on, gets the beats' lines from here as from uvicorn);
- a heartbeat whose answer memory does not have (a body that does not validate, a host
  the index does not know, a caller that may not beat for it, beats written through):
  handed to the application with its body, as if it had been an ASGI request from the
  start (the route answers it from the database).

TLS is below this protocol (asyncio's SSL transport), so HTTPS beats take this path too.
This subclass reads uvicorn's per-connection state (``url``, ``headers``, ``cycle``,
``parser``, ``on_response_complete``): uvicorn is bounded below 1 in setup.cfg, and
tests/scheduler/api/test_sched_beat_protocol.py serves beats through it, so a uvicorn
that changes them fails there first.
"""

from __future__ import annotations

from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.protocols.utils import get_client_addr

from scheduler.api import fastpath
from scheduler.api.errors import failure


_PREFIX = fastpath.BEAT_PREFIX.encode()


class BeatProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, heartbeats answered in it (module docstring).
    ``config.app`` must be the scheduler's application (its state holds the token book,
    the host service and the shedding's check)."""

    def __init__(self, config: Any, server_state: Any, app_state: dict, _loop: Any = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._app = config.app
        self._beat: tuple[str, Any, bool] | None = None  # (host, principal, keep-alive) while its body arrives
        self._beat_body = b""
        self._idle = False

    def on_headers_complete(self) -> None:
        taken = self._take()
        if taken is None:
            super().on_headers_complete()
            return
        self._beat, self._beat_body = taken, b""

    def on_body(self, body: bytes) -> None:
        if self._beat is None:
            super().on_body(body)
        else:  # at most the gate's body limit (admit_beat read Content-Length)
            self._beat_body += body

    def on_message_complete(self) -> None:
        if self._beat is None:
            super().on_message_complete()
            return
        (name, p, keep_alive), body = self._beat, self._beat_body
        self._beat, self._beat_body = None, b""
        try:
            got = fastpath.beat_answer(self._app.state._state, name, p, _content_type(self.headers), body)
        except Exception as e:  # noqa: BLE001 - as the error mapper's catch-all (httptools would answer 400)
            got = (*failure(e), ())  # logged there
        if got is None:
            self._hand_over(body)
            return
        self._write(*got, keep_alive=keep_alive)
        if self.access_log:  # uvicorn's line for it
            self.access_logger.info('%s - "POST %s HTTP/%s" %d', get_client_addr(self.scope), self.url.decode("ascii"),
                                    self.parser.get_http_version(), got[0])
        fastpath.counted(self._app, fastpath.BEAT_ROUTE, got[0]).inc()
        self.server_state.total_requests += 1
        self._idle = True  # the keep-alive timer, once this read's requests are done (data_received)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        # uvicorn arms its keep-alive timer when a response completes and disarms it when
        # data arrives; a beat answered in the middle of a read must not arm it while the
        # requests after it in the same read are still being answered (the timer would
        # close their connection). So it is armed here, and only on an idle connection.
        if self._idle:
            self._idle = False
            if (self._beat is None and (self.cycle is None or self.cycle.response_complete)
                    and not self.transport.is_closing()):
                self._unset_keepalive_if_required()
                self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive,
                                                                    self.timeout_keep_alive_handler)

    def connection_lost(self, exc: Exception | None) -> None:
        self._beat, self._beat_body = None, b""
        super().connection_lost(exc)

    def _take(self) -> tuple[str, Any, bool] | None:
        """(host, principal, keep-alive) of a request this protocol answers, else None."""
        parser = self.parser
        if (parser.get_method() != b"POST" or self.expect_100_continue or self.root_path
                or self.limit_concurrency is not None or parser.should_upgrade()
                or (self.cycle is not None and not self.cycle.response_complete)):
            return None
        url = self.url
        if not url.startswith(_PREFIX) or b"?" in url or b"%" in url or b"#" in url:
            return None
        try:
            path = url.decode("ascii")
        except UnicodeDecodeError:
            return None
        name = fastpath.beat_host(path)
        if not name:
            return None
        p = fastpath.admit_beat(self._app.state._state, path, self.headers)
        if p is None:
            return None
        return name, p, parser.get_http_version() != "1.0" and parser.should_keep_alive()

    def _hand_over(self, body: bytes) -> None:
        """The beat to the application, as uvicorn would have passed it: its cycle made
        now from the parser's state for this message, its body already complete."""
        super().on_headers_complete()
        self.cycle.body += body
        super().on_message_complete()

    def _write(self, status: int, content: Any, headers: Any, *, keep_alive: bool) -> None:
        data = orjson.dumps(content)
        out = [STATUS_LINE[status]]
        for k, v in self.server_state.default_headers:
            out += (k, b": ", v, b"\r\n")
        out += (b"content-length: ", str(len(data)).encode(), b"\r\ncontent-type: application/json\r\n")
        for k, v in headers:
            out += (k.lower().encode("latin-1"), b": ", v.encode("latin-1"), b"\r\n")
        if not keep_alive:
            out.append(b"connection: close\r\n")
        out += (b"\r\n", data)
        self.transport.write(b"".join(out))
        if not keep_alive:
            self.transport.close()


def _content_type(headers: list[tuple[bytes, bytes]]) -> str:
    """The first Content-Type, as Starlette reads it ("" when none was sent)."""
    for k, v in headers:
        if k == b"content-type":
            return v.decode("latin-1")
    return ""

