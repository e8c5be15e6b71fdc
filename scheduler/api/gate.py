"""What every request passes before anything reads its body: the token, then the size.

A request to a path that is not open (``server.open_endpoints``: by default only
``/healthz`` and ``/readyz``) nor the console's (``/ui``, which checks its own session
cookie) without a valid bearer token is answered 401 right here,
so an unauthenticated client cannot make the server read, buffer or parse anything it
sends. A body larger than ``server.max_body_bytes`` (``max_admin_body_bytes`` for an
admin's token: a rollout over a fleet) is answered 413 from its ``Content-Length``
alone; a chunked body is read up to that limit and no further.

The principal found here is kept in the ASGI scope (``scope["state"]["principal"]``),
so the routes and the claim fast path do not hash the token a second time.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from functools import lru_cache
from typing import Any

import orjson

from scheduler.api.deps import principal_for
from scheduler.api.errors import domain_body
from scheduler.errors import SchedulerError
from scheduler.service.tokens import TokenBook

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

PRINCIPAL = "principal"  # scope["state"] key


class BodyTooLarge(SchedulerError):
    code = "hyb.request.too_large"
    status = 413


class BadPath(SchedulerError):
    code = "hyb.request.bad_path"
    status = 400


CONSOLE = "/ui"  # the web console: its own sessions (scheduler/console), not bearer tokens


def is_console(path: str) -> bool:
    return path == CONSOLE or path.startswith(CONSOLE + "/")


def has_dot_segment(path: str) -> bool:
    """``/ui/../v1/hosts``: no route is under a dot segment, and a prefix rule (the
    console's, an open endpoint's) must not be walked out of."""
    if "/." not in path and not path.startswith("."):  # a dot segment starts the path or follows a /
        return False
    return any(seg in (".", "..") for seg in path.split("/"))


def is_open(path: str, open_endpoints: Sequence[str]) -> bool:
    """``/docs`` opens ``/docs`` and what is under it (``/docs/oauth2-redirect``)."""
    exact, under = _open_rules(tuple(open_endpoints))
    return path in exact or path.startswith(under)


@lru_cache(maxsize=16)
def _open_rules(open_endpoints: tuple[str, ...]) -> tuple[frozenset[str], tuple[str, ...]]:
    """(the paths themselves, the prefixes of what is under them), once per setting."""
    return frozenset(open_endpoints), tuple(p.rstrip("/") + "/" for p in open_endpoints)


async def admit(scope: Scope, receive: Receive, send: Send, *, tokens: TokenBook,
                open_endpoints: Sequence[str], max_body: int, max_admin_body: int,
                page: Callable[[SchedulerError], bytes] | None = None) -> Receive | None:
    """None: the request was answered here (400/401/413). Else the ``receive`` to go on
    with. ``page``: the refusal as an HTML page (the console's URLs), else JSON."""
    headers = dict(scope.get("headers") or ())
    setting = "server.max_body_bytes"
    if has_dot_segment(scope["path"]):
        await _answer(send, page, BadPath("a path with . or .. segments", field="path"))
        return None
    if not is_open(scope["path"], open_endpoints) and not is_console(scope["path"]):
        try:
            p = principal_for(headers.get(b"authorization", b"").decode("latin-1"), tokens)
        except SchedulerError as e:
            log.info("unauthenticated %s %s from %s: %s", scope["method"], scope["path"],
                     (scope.get("client") or ("?",))[0], e.message)
            await _answer(send, page, e)
            return None
        scope.setdefault("state", {})[PRINCIPAL] = p
        if p.admin:
            max_body, setting = max_admin_body, "server.max_admin_body_bytes"
    length = headers.get(b"content-length")
    if length is not None:
        try:
            n = int(length)
        except ValueError:
            n = max_body + 1
        if n > max_body:
            await _answer(send, page, BodyTooLarge(f"the body is {length.decode('latin-1')} bytes; this server "
                                             f"takes at most {max_body} ({setting})", field="body"))
            return None
        return receive
    if scope["method"] in ("GET", "HEAD", "DELETE", "OPTIONS"):
        return receive
    return await _bounded(receive, send, max_body, setting, page)


async def _bounded(receive: Receive, send: Send, max_body: int, setting: str,
                   page: Callable[[SchedulerError], bytes] | None = None) -> Receive | None:
    """A body without a length (chunked): read it here, up to the limit, then replay it."""
    msgs: list[dict[str, Any]] = []
    size = 0
    while True:
        msg = await receive()
        msgs.append(msg)
        if msg["type"] != "http.request":
            break
        size += len(msg.get("body", b""))
        if size > max_body:
            await _answer(send, page, BodyTooLarge(f"the body is over {max_body} bytes ({setting})", field="body"))
            return None
        if not msg.get("more_body", False):
            break
    it = iter(msgs)

    async def replay() -> dict[str, Any]:
        m = next(it, None)
        return m if m is not None else await receive()
    return replay


async def _answer(send: Send, page: Callable[[SchedulerError], bytes] | None, e: SchedulerError) -> None:
    data, kind = (page(e), b"text/html; charset=utf-8") if page else (orjson.dumps(domain_body(e)), b"application/json")
    headers = [(b"content-type", kind), (b"content-length", str(len(data)).encode())]
    if e.status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="hybrid-kvm"'))
    if e.status == 413:
        headers.append((b"connection", b"close"))  # the rest of the body is never read
    await send({"type": "http.response.start", "status": e.status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
