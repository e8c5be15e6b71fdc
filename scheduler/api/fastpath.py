"""``POST /v1/vms`` and heartbeats straight off the ASGI server, ahead of Starlette's
middleware and router.

Under load the claim path is cheap enough that the web framework's layers are much of
what is left: py-spy at 1,000 creates/s (2 replicas) put 60 % of the event loop's samples
inside the middleware stack, the router and the endpoint wrapper, and only 27 % in the
create route itself. The event loop also shares its process's GIL with the claim thread,
which holds SQLite's writer lock while it waits for that GIL; a shorter event loop turn
is a shorter lock hold.

This module answers the one request that matters for throughput, a claim (``POST
/v1/vms`` with no query string, an ``Idempotency-Key`` and a valid body), and hands
everything else to the full application unchanged, the body it has already read
included: a dry run, a bad token, a bad field, a missing key. It reads the request with
the route's own reader (``api/wire.py``), so it cannot take a request the route would
refuse or refuse one the route would take; every refusal is rendered by the one error
mapper (``api/errors.py``). What this path renders itself are the claim's answers: 202
(or 200 for a replay) with the VM, and the claim's own errors (507 no valid host, 409
lost race or key mismatch), with the same bodies, the same headers and the same request
counter as the route (``routes/vms.create_vm``, which stays the contract in the OpenAPI
document and serves the requests handed over).

Registrations (``POST /v1/hosts``) take it too: 100,000 hosts registering at once spent
half of each replica's CPU in the framework's layers (py-spy), with their writes batched.

Heartbeats (``POST /v1/hosts/{name}/heartbeat``) take the same way for the same reason:
100,000 hosts at 10 s are 10,000 a second. The answer comes from memory
(``beat_answer``): the beat, 503 while the replica sheds load, 429 too soon. A heartbeat
without the host scope, with a body that does not validate or is not JSON, or one memory
cannot answer (a host the index does not know, a caller that may not beat for it, beats
written through) is handed over: the route answers it from the database, and 401/403/422
and the audits come from the application. A replica served by ``scheduler serve`` answers
most beats one level down, in uvicorn's HTTP protocol (``api/beat_protocol.py``), with the
same two functions; what it hands over arrives here.

A heartbeat is also the first thing the application looks for (``beat_first``), before
the console's checks and the gate's general ones: one that the gate would admit as it
is (a valid bearer token, a ``Content-Length`` within the limit, a path neither open nor
with dot segments, each header once) is admitted here with the gate's own functions and
answered; any other goes the whole way, its body unread, and the gate answers it (401,
413, ...) as before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson
from fastapi.exceptions import RequestValidationError
from starlette.concurrency import run_in_threadpool

from api.states import VmStatus
from scheduler.api import gate, wire
from scheduler.api.deps import principal_for
from scheduler.api.errors import domain_body, failure, retry_after_header
from scheduler.errors import SchedulerError
from scheduler.policies import Principal

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

ROUTE = "/v1/vms"
BEAT_PREFIX, BEAT_SUFFIX, BEAT_ROUTE = "/v1/hosts/", "/heartbeat", "/v1/hosts/{name}/heartbeat"
_WANT = (b"authorization", b"idempotency-key", b"content-type")
_BEAT_WANT = frozenset((b"authorization", b"content-length", b"content-type"))


def claims(scope: Scope) -> bool:
    """Is this request one the fast path tries (a create that is not a dry run)?"""
    return (scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == ROUTE
            and not scope.get("query_string"))


REGISTER_ROUTE = "/v1/hosts"


def registers(scope: Scope) -> bool:
    """Is this request a host's registration (``POST /v1/hosts``)?"""
    return scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == REGISTER_ROUTE


async def register(app: Any, scope: Scope, receive: Receive, send: Send) -> Receive | None:
    """Answer the registration and return None, or return a ``receive`` that replays the
    body for the full application: a caller without the host scope, a body that is not
    JSON or does not validate (401/403/422 come from the route and the error mapper, which
    read it through FastAPI; this path takes only what ``wire.read_register`` takes, a
    subset of what the route takes). The registration's own answers (201/200 with the
    host, 403 ``hyb.host.not_yours``, 422 ``hyb.host.bad_layout``, 409 layout shrink) are
    rendered here as the route renders them."""
    body, cut = await _body(receive)
    replay = _replay(body, cut, receive)
    if cut:
        return replay
    head = _headers(scope)
    try:
        p = _principal(app, scope, head)
        reg = wire.read_register(p, ctype=_text(head, b"content-type") or "", body=body)
    except (SchedulerError, RequestValidationError):
        return replay
    try:
        out, created = await app.state.hosts.register_async(reg, actor=p.name, admin=p.admin, bound_host=p.host)
    except SchedulerError as e:
        await refuse(app, send, e, route=REGISTER_ROUTE)
        return None
    except Exception as e:  # noqa: BLE001 - as the error mapper's catch-all
        await _answer(app, send, *failure(e), (), route=REGISTER_ROUTE)
        return None
    await _answer(app, send, 201 if created else 200, out.model_dump(mode="json", by_alias=True), (),
                  route=REGISTER_ROUTE)
    return None


async def refuse(app: Any, send: Send, e: SchedulerError, *, route: str) -> None:
    """Answer ``e`` (with its Retry-After) before anything reads the body."""
    await _answer(app, send, e.status, domain_body(e), retry_after_header(e), route=route)


def beat_host(path: str) -> str:
    """The host a heartbeat path names (one path segment), or ""."""
    if not (path.startswith(BEAT_PREFIX) and path.endswith(BEAT_SUFFIX)):
        return ""
    name = path[len(BEAT_PREFIX):-len(BEAT_SUFFIX)]
    return name if "/" not in name else ""


def beat_name(scope: Scope) -> str:
    """The host a heartbeat request names, or "" when the request is not a heartbeat."""
    if scope["type"] != "http" or scope["method"] != "POST" or scope.get("query_string"):
        return ""
    return beat_host(scope["path"])


def admit_beat(state: dict, path: str, headers: Any) -> Principal | None:
    """The principal of a heartbeat the gate would admit unchanged, decided by the gate's
    own rules, or None: not an open path nor one with dot segments, each of
    Authorization, Content-Length and Content-Type at most once (the gate reads the last
    of a repeated header, the routes the first), a bearer token the book knows, a
    Content-Length within ``server.max_body_bytes`` (an admin's: ``max_admin_body_bytes``).
    ``state``: the application's state as a dict; ``headers``: (lower-case name, value)
    pairs, as ASGI's scope and uvicorn's parser keep them."""
    srv = state["settings"].server
    if gate.has_dot_segment(path) or gate.is_open(path, srv.open_endpoints):
        return None
    head: dict[bytes, bytes] = {}
    for k, v in headers:
        if k in _BEAT_WANT:
            if k in head:
                return None
            head[k] = v
    auth, length = head.get(b"authorization"), head.get(b"content-length")
    if auth is None or length is None:
        return None
    try:
        p = principal_for(auth.decode("latin-1"), state["tokens"])
        n = int(length)
    except (SchedulerError, ValueError):
        return None
    return p if n <= (srv.max_admin_body_bytes if p.admin else srv.max_body_bytes) else None


def beat_answer(state: dict, name: str, p: Principal, ctype: str,
                body: bytes) -> tuple[int, Any, tuple[tuple[str, str], ...]] | None:
    """The answer to host ``name``'s heartbeat from ``p``, from memory: (status, JSON
    content, extra headers). None when the application must answer it: a body that does
    not validate (422 from the route and the error mapper, 403 for a caller who may not
    act as a host), or a beat memory cannot answer (``HostService.beat_now``: the route
    asks the database). A replica shedding load (``service/shed``) answers 503 with
    Retry-After, the beat still counted from memory when it may be; BeatTooSoon and the
    service's other refusals are answered as the error mapper renders them."""
    hosts = state["hosts"]
    shed = state["shed"].check("beat")
    if shed is not None:  # its body unread
        try:
            if p.admin or "host" in p.scopes or p.host:  # who may beat (``require("host")``)
                hosts.heartbeat_shed(name, actor=p.name, admin=p.admin, bound_host=p.host)
        except SchedulerError as e:  # too soon
            shed = e
        return shed.status, domain_body(shed), retry_after_header(shed)
    try:
        beat = wire.read_heartbeat(p, ctype=ctype, body=body)
    except (SchedulerError, RequestValidationError):  # 403/413/422, from the route and the error mapper
        return None
    try:
        got = wire.beat_from_memory(hosts, name, p, beat)
    except SchedulerError as e:  # too soon
        return e.status, domain_body(e), retry_after_header(e)
    except Exception as e:  # noqa: BLE001 - as the error mapper's catch-all
        status, content = failure(e)
        return status, content, ()
    return None if got is None else (200, got, ())


async def beat_first(app: Any, scope: Scope, receive: Receive, send: Send,
                     name: str) -> tuple[Receive, bool] | None:
    """A heartbeat for host ``name`` (``beat_name``) ahead of everything else: None when
    answered here, else (the ``receive`` to go on with, whether ``heartbeat`` is still to
    be tried after the gate). Taken only when ``admit_beat`` admits it; anything else is
    handed over unread, (receive, True): the gate answers it (401 and its log line, 413,
    400) or admits it, and ``heartbeat`` is tried after it as before. A replica served
    by ``scheduler serve`` answers most beats before they become ASGI requests at all
    (``api/beat_protocol.py``); this path serves the rest, and in-process servers."""
    state = app.state._state  # the app's state as a dict: ``State.__getattr__`` is a call a name
    p = admit_beat(state, scope["path"], scope["headers"])
    if p is None:
        return receive, True
    scope.setdefault("state", {})[gate.PRINCIPAL] = p
    got = await heartbeat(app, scope, receive, send, name=name)
    return None if got is None else (got, False)


async def heartbeat(app: Any, scope: Scope, receive: Receive, send: Send, name: str = "") -> Receive | None:
    """Answer the heartbeat (``beat_answer``) and return None, or return a ``receive``
    that replays the body for the full application. ``name``: the request's host, when
    the caller has it."""
    body, cut = await _body(receive)
    replay = _replay(body, cut, receive)
    if cut:
        return replay
    head = _headers(scope)
    try:
        p = _principal(app, scope, head)
    except SchedulerError:  # 401, from the route and the error mapper
        return replay
    got = beat_answer(app.state._state, name or beat_host(scope["path"]), p, _text(head, b"content-type") or "",
                      body)
    if got is None:
        return replay
    await _answer(app, send, *got, route=BEAT_ROUTE)
    return None


def _headers(scope: Scope) -> dict[bytes, bytes]:
    head: dict[bytes, bytes] = {}
    for k, v in scope["headers"]:  # the first of repeated headers, as Starlette reads them
        if k in _WANT and k not in head:
            head[k] = v
    return head


def _text(head: dict[bytes, bytes], name: bytes) -> str | None:
    """A header's value as Starlette decodes it, or None when it was not sent."""
    v = head.get(name)
    return None if v is None else v.decode("latin-1")


def _principal(app: Any, scope: Scope, head: dict[bytes, bytes]) -> Principal:
    """The principal the gate found (api/gate.py), or from the header, as the routes'."""
    return scope.get("state", {}).get("principal") or \
        principal_for(_text(head, b"authorization") or "", app.state.tokens)


async def create(app: Any, scope: Scope, receive: Receive, send: Send) -> Receive | None:
    """Answer the claim and return None, or return a ``receive`` that replays the body
    for the full application (the request is not one this path answers)."""
    body, cut = await _body(receive)
    replay = _replay(body, cut, receive)
    if cut:  # the client went away mid-body: the full stack deals with it, as before
        return replay
    head = _headers(scope)
    try:
        p = _principal(app, scope, head)
        req = wire.read_create(p, dry_run=None, key=_text(head, b"idempotency-key"),
                               ctype=_text(head, b"content-type") or "", body=body)
    except (SchedulerError, RequestValidationError):  # 401/403/422, from the route and the error mapper
        return replay
    shed = app.state.shed.check("claim")
    if shed is not None:  # nothing recorded: the client retries after Retry-After
        await _answer(app, send, shed.status, domain_body(shed), retry_after_header(shed))
        return None
    svc = app.state.vms
    t = time.perf_counter()
    try:
        vm, replayed = await svc.create_async(req.body, tenant=req.tenant, key=req.key, actor=req.actor)
    except SchedulerError as e:
        await _answer(app, send, e.status, domain_body(e), ())
        return None
    except Exception as e:  # noqa: BLE001 - as the error mapper's catch-all
        await _answer(app, send, *failure(e), ())
        return None
    hdrs = wire.created_headers(vm, time.perf_counter() - t)
    await _answer(app, send, 200 if replayed else 202, wire.vm_json(vm), hdrs.items())
    if vm.status == VmStatus.PENDING and app.state.dispatch_enabled:  # as the route's background task
        try:
            await run_in_threadpool(svc.dispatch, vm.id)
        except Exception:  # noqa: BLE001 - the answer is sent; reconcile repairs what is left
            log.exception("dispatch after create failed vm=%s", vm.id)
    return None


async def _body(receive: Receive) -> tuple[bytes, bool]:
    """(body, True if the client disconnected before its end)."""
    msg = await receive()
    if msg["type"] == "http.disconnect":
        return b"", True
    if not msg.get("more_body", False):  # the whole body in one message: a beat's
        return msg.get("body", b""), False
    chunks = [msg.get("body", b"")]
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return b"".join(chunks), True
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body", False):
            return b"".join(chunks), False


def _replay(body: bytes, cut: bool, receive: Receive) -> Receive:
    """The body as read (then, if the client went away before its end, what the server
    says next: the disconnect), then the server's own messages."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": cut}
    return again


async def _answer(app: Any, send: Send, status: int, content: Any, headers: Any, route: str = ROUTE) -> None:
    data = orjson.dumps(content)
    head = [(b"content-length", str(len(data)).encode()), (b"content-type", b"application/json")]
    if headers:
        head += ((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers)
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": data})
    counted(app, route, status).inc()


def counted(app: Any, route: str, status: int) -> Any:
    """The request counter's child for ``POST route status``, looked up once per app
    (``labels()`` takes the metric's lock and builds its key on every call)."""
    kids = app.__dict__.get("_fast_post_counters")
    if kids is None:
        kids = app.__dict__["_fast_post_counters"] = {}
    kid = kids.get((route, status))
    if kid is None:
        kid = kids[(route, status)] = app.state.metrics.http.labels("POST", route, str(status))
    return kid
