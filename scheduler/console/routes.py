"""The web console's pages under /ui: server-rendered (Jinja2), progressively enhanced
with htmx, charts drawn by ECharts in the browser from numbers the server put in the
page.

The console is a client beside the API, composed with it by the app factory
(``scheduler/api/app.py``): it calls the same services the API's routes call, after the
same rules (``scheduler/policies.py``) with the session's principal, so it can show
nothing the API would not answer to the same token and refuses what the API refuses
(a tenant sees its VMs and its audit, nothing of hosts). It imports nothing of
``scheduler.api``. Every page is a plain ``def``: FastAPI runs it in its thread pool,
never on the event loop that answers heartbeats and claims; a POST's body is read on the
loop by a dependency first. A state-changing request must carry the session's CSRF
token (a form's hidden ``csrf`` field, or htmx's ``X-CSRF-Token`` header) and, when the
browser sends one, an ``Origin`` of exactly this server: scheme, host and port (``null``
and an ``http://`` origin at an https console are refused, login included). Lists come a page at a time, with a
link to the next: nothing is cut off silently."""

from __future__ import annotations

import csv
import datetime as dt
import inspect
import io
import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Annotated, Any
from urllib.parse import parse_qs, quote, urlencode, urlsplit

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from starlette.background import BackgroundTask
from pydantic import ValidationError

from api.states import AdminState, HostState, VmStatus
from scheduler import policies
from scheduler.console import look
from scheduler.console.look import policy_label
from scheduler.errors import Forbidden, InvalidRequest, SchedulerError
from scheduler.policies import Principal
from scheduler.schemas.fleet import FleetHostsPublic
from scheduler.schemas.hosts import AdminChange
from scheduler.schemas.vms import MigrateRequest, VmCreate
from scheduler.service.fleet import ALERT_LIMITS
from scheduler.service.sessions import Session

log = logging.getLogger(__name__)
HERE = Path(__file__).parent
STATIC = HERE / "static"
VENDOR = STATIC / "vendor"  # fetched by `make console-assets` (tools/dev/fetch-console-assets.sh), never committed
COOKIE = "hyb_session"
router = APIRouter(prefix="/ui", include_in_schema=False)
templates = Jinja2Templates(directory=str(HERE / "templates"))  # autoescape on: names are shown as text
GROUPS = ("class", "rack", "state", "policy")
BINS = 20  # the charts' bins: 5 % each
PAGE = 500  # rows of a list page (hosts, VMs)
AUDIT_PAGE = 200
HOST_HISTORY = 50  # a host page's newest audit records; the audit page has the rest


class LoginNeeded(Exception):
    pass


look.install(templates.env)


def session(request: Request) -> Session:
    s = request.app.state.console.find(request.cookies.get(COOKIE))
    if s is None:
        raise LoginNeeded()
    return s


def may(p: Principal) -> dict[str, bool]:
    """What the rules let ``p`` do, for the links and forms a page offers (the pages
    themselves ask the rules again)."""
    def tenants(q: Principal) -> None:
        if policies.vm_tenant(q) is not None:
            raise Forbidden("one tenant")
    return {"fleet": policies.allowed(policies.read_fleet, p), "hosts": policies.allowed(policies.read_hosts, p),
            "hold": policies.allowed(policies.hold_host, p), "rollouts": policies.allowed(policies.rollouts, p),
            "audit": policies.allowed(policies.audit_tenant, p), "vms": policies.allowed(policies.vm_tenant, p),
            "move": policies.allowed(policies.move_vm, p),
            "all_tenants": policies.allowed(tenants, p)}


def policy_names(request: Request, p: Principal) -> dict[str, str]:
    """digest -> a name, from the rollouts that carried each policy (their spec's policy
    file, else the rollout's name; the first rollout's); none for a principal the
    rollouts are not shown to."""
    if not policies.allowed(policies.rollouts, p):
        return {}
    names: dict[str, str] = {}
    for r in sorted(request.app.state.rollouts.list().items, key=lambda r: r.created):
        if r.policy_digest:
            f = r.spec.get("policy") if isinstance(r.spec, dict) else None
            names.setdefault(r.policy_digest.lower(), PurePosixPath(f).stem if isinstance(f, str) and f else r.name)
    return names


def page(request: Request, name: str, s: Session | None, http_status: int = 200, **ctx: Any) -> HTMLResponse:
    return templates.TemplateResponse(request, name, {"me": s.principal if s else None, "csrf": s.csrf if s else "",
                                                      "may": may(s.principal) if s else {},
                                                      "vendor": VENDOR.joinpath("echarts.min.js").exists(),
                                                      **ctx}, status_code=http_status)


async def body_of(request: Request) -> bytes:
    """A POST's body, read on the event loop before the page runs in the thread pool."""
    return await request.body()


RawBody = Annotated[bytes, Depends(body_of)]


def form_of(request: Request, raw: bytes, s: Session | None) -> dict[str, str]:
    """The urlencoded form of a POST, after its origin and (with a session) its CSRF
    token were checked; Forbidden names what is wrong."""
    origin = request.headers.get("origin")
    if origin is not None and not same_origin(origin, request):
        raise Forbidden(f"a request from another origin ({origin}); this console is {own_origin(request)}",
                        field="Origin")
    form = {k: v[-1] for k, v in parse_qs(raw.decode("utf-8", "replace"), keep_blank_values=True).items()}
    if s is not None and not s.csrf_ok(request.headers.get("x-csrf-token") or form.get("csrf")):
        raise Forbidden("missing or wrong CSRF token: reload the page and try again", field="csrf")
    return form


DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin_tuple(scheme: str, netloc: str) -> tuple[str, str, int | None] | None:
    try:
        u = urlsplit(f"{scheme}://{netloc}")
        port = u.port
    except ValueError:
        return None
    if not u.hostname:
        return None
    return scheme.lower(), u.hostname.lower(), port if port is not None else DEFAULT_PORTS.get(scheme.lower())


def own_origin(request: Request) -> str:
    """This server's origin as the browser sees it: the scheme it was reached by (the
    scheduler serves its TLS itself) and the ``Host`` it was asked for."""
    return f"{request.url.scheme}://{request.headers.get('host', '')}"


def same_origin(origin: str, request: Request) -> bool:
    """An ``Origin`` header names this server: same scheme, host and port (a default port
    written or not). ``null`` (a sandboxed frame, a file, a redirect across sites) is
    nobody's, and an ``http://`` origin is not an ``https://`` console's: both refused."""
    if origin == "null" or "://" not in origin:
        return False
    scheme, _, rest = origin.partition("://")
    if "/" in rest or "?" in rest or "#" in rest or "@" in rest:
        return False  # an origin is scheme://host[:port], nothing more
    theirs = _origin_tuple(scheme, rest)
    ours = _origin_tuple(request.url.scheme, request.headers.get("host", ""))
    return theirs is not None and theirs == ours


def install(app) -> None:  # type: ignore[no-untyped-def]
    """The console's routes, static files and error pages on ``app``."""
    from fastapi.staticfiles import StaticFiles
    app.include_router(router)
    app.mount("/ui/static", StaticFiles(directory=str(STATIC), check_dir=True), name="ui-static")

    @app.exception_handler(LoginNeeded)
    async def _login(request: Request, _: LoginNeeded) -> Response:
        if request.headers.get("hx-request"):
            return Response(status_code=401, headers={"HX-Redirect": "/ui/login"})
        return RedirectResponse(f"/ui/login?next={quote(request.url.path)}", status_code=303)

    for kind, api_handler in list(app.exception_handlers.items()):
        if kind is not LoginNeeded:
            app.exception_handlers[kind] = error_pages(api_handler)


def is_console(request: Request) -> bool:
    return request.url.path == router.prefix or request.url.path.startswith(router.prefix + "/")


class Failure:
    """What an error page names: the API's status, code, field and message."""

    def __init__(self, status: int, err: dict[str, Any]):
        self.status = status
        self.code = str(err.get("code") or "hyb.http.error")
        self.field = err.get("field")
        self.message = str(err.get("message") or "")


def error_pages(api_handler: Callable[..., Any]) -> Callable[..., Any]:
    """An exception handler of the API's, answering a console URL with a page in the
    console's layout (an htmx request: the fragment its target shows) naming what the API
    would have answered: the same status, code, field and message, from the API's own
    handler (one mapping of errors to HTTP), so a page never shows raw JSON."""
    async def handler(request: Request, exc: Exception) -> Response:
        r = await api_handler(request, exc) if inspect.iscoroutinefunction(api_handler) \
            else api_handler(request, exc)
        if not is_console(request) or r.media_type != "application/json":
            return r
        try:
            err = json.loads(bytes(r.body))["error"]
        except (ValueError, KeyError, TypeError):
            return r
        s = await run_in_threadpool(quiet_session, request)
        name = "error_fragment.html" if request.headers.get("hx-request") else "error.html"
        out = page(request, name, s, http_status=r.status_code, error=Failure(r.status_code, err))
        if "allow" in r.headers:
            out.headers["allow"] = r.headers["allow"]
        return out
    return handler


def refusal_page(e: SchedulerError) -> bytes:
    """A request refused before any route (a dot segment, a body over the limit) as an
    error page, without the session's header (no store is asked on the event loop)."""
    t = templates.get_template("error.html")
    return t.render(me=None, csrf="", may={}, vendor=VENDOR.joinpath("echarts.min.js").exists(),
                    error=Failure(e.status, {"code": e.code, "field": e.field, "message": e.message})).encode()


def quiet_session(request: Request) -> Session | None:
    """The session for an error page's header, if one can be found (the failure may be
    the store's)."""
    try:
        return request.app.state.console.find(request.cookies.get(COOKIE))
    except Exception:  # noqa: BLE001 - the error page is answered without its header
        return None


def guarded(request: Request, s: Session, name: str, build: Callable[[], dict]) -> Response:
    """``build()`` -> the page's context; a refusal as an error page with the API's
    status, code and message (a tenant asking for a host: 403)."""
    try:
        ctx = build()
    except SchedulerError as e:
        return page(request, "error.html", s, http_status=e.status, error=e)
    return page(request, name, s, **ctx)


def invalid(e: ValidationError) -> InvalidRequest:
    """A model's first error as the API words it: the message, and the field as a path
    (``vfs[0].min_tx_rate_mbps``)."""
    err = e.errors()[0]
    field = ""
    for x in err["loc"]:
        field += f"[{x}]" if isinstance(x, int) else (f".{x}" if field else str(x))
    return InvalidRequest(err["msg"], field=field or "body")


def next_link(path: str, **query: Any) -> str:
    """``path`` with the non-empty ``query`` values: a filtered list's next page."""
    return f"{path}?{urlencode({k: v for k, v in query.items() if v not in (None, '')})}"


# ---------------------------------------------------------------------- login


@router.get("", response_class=HTMLResponse)
@router.get("/", response_class=HTMLResponse)
def home(request: Request) -> Response:
    s = session(request)
    return RedirectResponse("/ui/fleet" if may(s.principal)["fleet"] else "/ui/vms", status_code=303)


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, next: str = "/ui") -> Response:
    return page(request, "login.html", None, next=safe_next(next))


def safe_next(n: str) -> str:
    """Only a console path: never another site, never out of /ui."""
    return n if n.startswith("/ui") and "//" not in n and "\\" not in n else "/ui"


@router.post("/login", response_class=HTMLResponse)
def login(request: Request, raw: RawBody) -> Response:
    try:
        form = form_of(request, raw, None)
    except SchedulerError as e:
        return page(request, "login.html", None, http_status=e.status, error=e, next="/ui")
    nxt = safe_next(form.get("next", "/ui"))
    book = request.app.state.console
    try:
        cookie, s = book.open(form.get("token", "").strip())
    except SchedulerError as e:
        log.info("console login refused from %s: %s", request.client.host if request.client else "?", e.message)
        return page(request, "login.html", None, http_status=401, error=e, next=nxt)
    r = RedirectResponse(nxt, status_code=303)
    r.set_cookie(COOKIE, cookie, max_age=int(s.expires - book.clock()), path="/ui", secure=True, httponly=True,
                 samesite="strict")
    return r


@router.post("/logout", response_class=HTMLResponse)
def logout(request: Request, raw: RawBody) -> Response:
    s = session(request)
    try:
        form_of(request, raw, s)
    except SchedulerError as e:
        return page(request, "error.html", s, http_status=e.status, error=e)
    request.app.state.console.close(request.cookies.get(COOKIE))
    r = RedirectResponse("/ui/login", status_code=303)
    r.delete_cookie(COOKIE, path="/ui", secure=True, httponly=True, samesite="strict")
    return r


# ---------------------------------------------------------------------- fleet


def fleet_args(day: str | None, compare: str | None, group: str, window: str) -> dict:
    try:
        d = dt.date.fromisoformat(day) if day else dt.date.today()
    except ValueError:
        raise InvalidRequest(f"{day!r} is not a day (YYYY-MM-DD)", field="day") from None
    try:
        c = dt.date.fromisoformat(compare) if compare else None
    except ValueError:
        raise InvalidRequest(f"{compare!r} is not a day (YYYY-MM-DD)", field="compare") from None
    if group not in GROUPS:
        raise InvalidRequest(f"one of {', '.join(GROUPS)}", field="group")
    return {"day": d, "compare": c, "group": group, "window": window or "peak"}


def free_capacity(f: FleetHostsPublic) -> list[tuple[str, int, int | str, str]]:
    """(resource class, free, of total, unit): free on the hosts that take VMs (active,
    up); a budget has no total ("-")."""
    rows: list[tuple[str, int, int | str, str]] = [("CPUs (dedicated)", f.cpus_free, f.cpus_total, "")]
    for p in f.pages:
        label = {1048576: "1 GiB pages", 2048: "2 MiB pages"}.get(p.size_kb, f"{p.size_kb} KiB pages")
        rows.append((label, p.free, p.total, ""))
    rows += [("SR-IOV VFs", f.vfs_free, f.vfs_total, ""), ("VF tx budget", f.tx_free_mbps, "-", " Mb/s"),
             ("raw disks", f.disks_free, f.disks_total, ""), ("disk IO budget", f.disk_iops_free, "-", " IOPS")]
    return rows


def shown_groups(day: dict[str, Any], compare: dict[str, Any]) -> list[str]:
    """The groups the charts draw: the day's, then those only the compare day has (a rack
    whose hosts sent nothing on the day), each with one colour on both days."""
    return list(dict.fromkeys([*day, *compare]))


@router.get("/fleet", response_class=HTMLResponse)
def fleet(request: Request, day: str | None = None, compare: str | None = None, group: str = "class",
          window: str = "peak") -> Response:
    s = session(request)
    state = request.app.state

    def build() -> dict:
        policies.read_fleet(s.principal)
        policies.read_hosts(s.principal)
        a = fleet_args(day, compare, group, window)
        u = state.fleet.utilization(day=a["day"], compare=a["compare"], window=a["window"], group=a["group"],
                                    bins=BINS)
        hosts = state.hosts.summary()
        hm = state.fleet.heatmap(day=a["day"], days=state.settings.console.heatmap_days, window=a["window"],
                                 bins=BINS)
        heat = [{"day": d.day.isoformat(), "counts": d.counts, "hosts": d.hosts} for d in hm.days]
        ioh = state.fleet.io_health(day=a["day"], limits=ALERT_LIMITS)
        shown = shown_groups(u.day.groups, u.compare.groups if u.compare else {})
        names = policy_names(request, s.principal) if a["group"] == "policy" else {}
        labels = {g: policy_label(g, names) if a["group"] == "policy" else g for g in shown}
        return {"u": u.model_dump(mode="json"), "args": a, "groups": GROUPS, "shown": shown, "labels": labels, "pnames": names, "heat": heat, "ioh": ioh,
                "classes": hosts.classes, "capacity": free_capacity(hosts), "hosts_total": hosts.hosts}
    return guarded(request, s, "fleet.html", build)


LIVE_TTL_S = 2.0  # a fleet-wide read a live part polls is shared by the viewers asking within this long


class Recent:
    """The answers of the fleet-wide reads the live parts poll (``hosts.summary``, a page
    of ``hosts.list``: ~0.2 s each at 3,000 hosts), each kept ``LIVE_TTL_S``: any number
    of open tabs cost one read per key per ``LIVE_TTL_S``, not one each. Only the
    service's answer is shared; every request is checked against the rules first."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.got: dict[tuple, tuple[float, Any]] = {}

    def get(self, key: tuple, read: Callable[[], Any]) -> Any:
        now = time.monotonic()
        with self.lock:
            hit = self.got.get(key)
            if hit is not None and now - hit[0] < LIVE_TTL_S:
                return hit[1]
        val = read()
        with self.lock:
            self.got = {k: v for k, v in self.got.items() if now - v[0] < LIVE_TTL_S}
            self.got[key] = (now, val)
        return val


def recent(request: Request) -> Recent:
    r = getattr(request.app.state, "console_recent", None)
    if r is None:
        r = request.app.state.console_recent = Recent()
    return r


@router.get("/live/fleet", response_class=HTMLResponse)
def fleet_live(request: Request) -> Response:
    """The fleet page's hosts by state and free capacity, polled by the open page: one
    read (``hosts.summary``), only the fragment."""
    s = session(request)
    try:
        policies.read_hosts(s.principal)
        hosts = recent(request).get(("summary",), request.app.state.hosts.summary)
    except SchedulerError as e:
        return page(request, "error_fragment.html", s, http_status=e.status, error=e)
    return page(request, "_fleet_live.html", s, classes=hosts.classes, capacity=free_capacity(hosts),
                hosts_total=hosts.hosts)


@router.get("/fleet/bin", response_class=HTMLResponse)
def fleet_bin(request: Request, day: str, bin: int, window: str = "peak", cls: str = "all") -> Response:
    s = session(request)
    try:
        policies.read_fleet(s.principal)
        a = fleet_args(day, None, "class", window)
        got = request.app.state.fleet.bin_hosts(day=a["day"], window=a["window"], bins=BINS, index=bin, cls=cls)
    except SchedulerError as e:
        return page(request, "error_fragment.html", s, http_status=e.status, error=e)
    return page(request, "bin_hosts.html", s, b=got.model_dump(mode="json"), cls=cls)


@router.get("/fleet.csv")
def fleet_csv(request: Request, day: str | None = None, compare: str | None = None, group: str = "class",
              window: str = "peak") -> Response:
    s = session(request)
    policies.read_fleet(s.principal)
    a = fleet_args(day, compare, group, window)
    u = request.app.state.fleet.utilization(day=a["day"], compare=a["compare"], window=a["window"],
                                            group=a["group"], bins=BINS)
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["day", "lo", "hi", "group", "hosts"])
    for d in [u.day] + ([u.compare] if u.compare else []):
        for b in d.bins:
            for g, n in sorted(b.counts.items()):
                w.writerow([d.day.isoformat(), b.lo, b.hi, g, n])
    return Response(buf.getvalue(), media_type="text/csv",
                    headers={"Content-Disposition": f'attachment; filename="fleet-{a["day"]}-{group}.csv"'})


# ---------------------------------------------------------------------- hosts


HOLDS = {"cordon": AdminState.CORDONED, "uncordon": AdminState.ACTIVE, "drain": AdminState.DRAINING}


@router.get("/hosts", response_class=HTMLResponse)
def hosts(request: Request, rack: str | None = None, state: str | None = None, after: str = "") -> Response:
    s = session(request)

    def build() -> dict:
        policies.read_hosts(s.principal)
        st = state if state in set(HostState) else None
        got = request.app.state.hosts.list(rack=rack or None, state=st, limit=PAGE, after=after)
        return {"hosts": got.items, "rack": rack or "", "state": st or "", "states": list(HostState), "after": after,
                "pnames": policy_names(request, s.principal),
                "next": got.next and next_link("/ui/hosts", rack=rack, state=st, after=got.next)}
    return guarded(request, s, "hosts.html", build)


@router.get("/live/hosts", response_class=HTMLResponse)
def hosts_live(request: Request, rack: str | None = None, state: str | None = None, after: str = "") -> Response:
    """The rows of a hosts page, polled by the open page: the same page of the list
    (one read of the hosts), only the table's body."""
    s = session(request)
    try:
        policies.read_hosts(s.principal)
        st = state if state in set(HostState) else None
        got = recent(request).get(("hosts", rack or None, st, after), lambda: request.app.state.hosts.list(
            rack=rack or None, state=st, limit=PAGE, after=after))
    except SchedulerError as e:
        return page(request, "error_fragment.html", s, http_status=e.status, error=e)
    return page(request, "_hosts_rows.html", s, hosts=got.items, rack=rack or "", state=st or "", after=after,
                pnames=policy_names(request, s.principal))


def carve_picture(h: dict[str, Any], vms: list[Any]) -> list[dict[str, Any]]:
    """Per NUMA node of ``h`` (a host as the API answers it), each CPU and its owner:
    ``io`` (the IO service's), ``host`` (the host OS's), ``vm:<id>`` (the VM of ``vms``
    pinned there, with its name and vCPU), ``used`` (held by a VM not in ``vms``: past
    the page) or ``free``; with the node's hugepages and the VFs of its PFs in use."""
    vm_of: dict[int, tuple[Any, int]] = {}
    for v in vms:
        if v.placement is not None:
            for i, c in enumerate(v.placement.cpus):
                vm_of[c] = (v, i)
    colour = {v.id: f"hsl({(k * 137.5) % 360:.0f} 65% 55%)" for k, v in enumerate(vms)}
    out = []
    for n in h["nodes"]:
        used = set(n["used_cpus"])
        owner: dict[int, dict[str, Any]] = {}
        for c in n.get("io_cpus", []):
            owner[c] = {"cpu": c, "owner": "io", "kind": "io", "title": f"CPU {c}: the IO service"}
        for c in n.get("host_cpus", []):
            owner[c] = {"cpu": c, "owner": "host", "kind": "host", "title": f"CPU {c}: host OS"}
        for c in n["vm_cpus"]:
            if c in vm_of:
                v, i = vm_of[c]
                owner[c] = {"cpu": c, "owner": f"vm:{v.id}", "kind": "vm", "title": f"CPU {c}: {v.name} vCPU {i}",
                            "vm": v, "colour": colour[v.id]}
            elif c in used:
                owner[c] = {"cpu": c, "owner": "used", "kind": "used", "title": f"CPU {c}: a VM not listed here"}
            else:
                owner[c] = {"cpu": c, "owner": "free", "kind": "free", "title": f"CPU {c}: free for a VM"}
        pfs = [p for p in h["pfs"] if p["node"] == n["node"]]
        out.append({"node": n["node"], "cpus": [owner[c] for c in sorted(owner)], "hugepages": n["hugepages"],
                    "pfs": pfs})
    loose = [p for p in h["pfs"] if p["node"] is None]
    if loose and out:
        out.append({"node": None, "cpus": [], "hugepages": [], "pfs": loose})
    return out


def host_live_ctx(request: Request, s: Session, name: str) -> dict[str, Any]:
    """What the live part of a host page shows: its state, hold, VMs and free CPUs (one
    read of the host), the VMs moving live from or to it with their progress, and while
    it drains the drain's plan."""
    h = request.app.state.hosts.get(name)
    drain = request.app.state.drains.status(name) if h.admin_state == AdminState.DRAINING else None
    p = s.principal  # the moves as the VMs' reader sees them; a reader of hosts alone: none
    moves = request.app.state.vms.moving(name, scope=policies.vm_tenant(p)) \
        if policies.allowed(policies.vm_tenant, p) else []
    return {"h": h.model_dump(mode="json", by_alias=True), "drain": drain,
            "moves": [v.model_dump(mode="json") for v in moves]}


@router.get("/live/hosts/{name}", response_class=HTMLResponse)
def host_live(request: Request, name: str) -> Response:
    """A host page's live part, polled by the open page: only the fragment."""
    s = session(request)
    try:
        policies.read_hosts(s.principal)
        ctx = host_live_ctx(request, s, name)
    except SchedulerError as e:
        return page(request, "error_fragment.html", s, http_status=e.status, error=e)
    return page(request, "_host_live.html", s, **ctx)


@router.get("/hosts/{name}", response_class=HTMLResponse)
def host(request: Request, name: str) -> Response:
    s = session(request)
    state = request.app.state

    def build() -> dict:
        p = s.principal
        policies.read_hosts(p)
        live = host_live_ctx(request, s, name)
        vms = state.vms.list(scope=policies.vm_tenant(p), host=name, limit=PAGE)
        stats = state.hosts.stats(name, since=time.time() - 86400, until=None)
        hist = state.audit.list(tenant=policies.audit_tenant(p), target=name, limit=HOST_HISTORY)
        return {**live, "vms": vms.items, "stats": stats.model_dump(mode="json"),
                "picture": carve_picture(live["h"], vms.items),
                "history": hist.items, "pnames": policy_names(request, p),
                "vms_next": vms.next and next_link("/ui/vms", host=name, after=vms.next),
                "history_next": hist.next and next_link("/ui/audit", target=name, before=hist.next)}
    return guarded(request, s, "host.html", build)


@router.post("/hosts/{name}/{verb}", response_class=HTMLResponse)
def host_admin(request: Request, name: str, verb: str, raw: RawBody) -> Response:
    s = session(request)
    try:
        form = form_of(request, raw, s)
        if verb not in HOLDS:
            raise InvalidRequest(f"{verb!r}: cordon, uncordon or drain", field="verb")
        body = AdminChange(reason=form.get("reason", ""), force=form.get("force") == "on",
                           expect_owner=form.get("expect_owner"))  # the owner: the API's, the session's principal
        policies.hold_host(s.principal)
        request.app.state.hosts.set_state(name, HOLDS[verb], actor=s.principal.name, change=body)
    except ValidationError as e:
        return page(request, "error.html", s, http_status=422, error=invalid(e))
    except SchedulerError as e:
        return page(request, "error.html", s, http_status=e.status, error=e)
    return RedirectResponse(f"/ui/hosts/{quote(name)}", status_code=303)


# ---------------------------------------------------------------------- VMs


@router.get("/vms", response_class=HTMLResponse)
def vms(request: Request, tenant: str | None = None, host: str | None = None, status: str | None = None,
        after: str = "") -> Response:
    s = session(request)

    def build() -> dict:
        st = status if status in set(VmStatus) else None
        got = request.app.state.vms.list(scope=policies.vm_tenant(s.principal), tenant=tenant or None,
                                         host=host or None, status=st, limit=PAGE, after=after)
        return {"vms": got.items, "tenant": tenant or "", "host": host or "", "status": st or "", "statuses": list(VmStatus),
                "after": after,
                "next": got.next and next_link("/ui/vms", tenant=tenant, host=host, status=st, after=got.next)}
    return guarded(request, s, "vms.html", build)


@router.get("/vms/{vm_id}", response_class=HTMLResponse)
def vm(request: Request, vm_id: str) -> Response:
    s = session(request)

    def build() -> dict:
        got = request.app.state.vms.get(vm_id, scope=policies.vm_tenant(s.principal))
        v = got.model_dump(mode="json", by_alias=True)
        targets = None  # the Migrate form: for who may move VMs, on a running VM
        if policies.allowed(policies.move_vm, s.principal) and v["status"] == VmStatus.RUNNING:
            targets = [h.name for h in request.app.state.hosts.list().items
                       if h.state == HostState.ACTIVE and h.name != v["host"]]
        # the Start form: on a stopped VM, for who sees it (tenants start their own)
        return {"v": v, "targets": targets, "startable": v["status"] == VmStatus.STOPPED}
    return guarded(request, s, "vm.html", build)


@router.get("/live/vms/{vm_id}", response_class=HTMLResponse)
def vm_live(request: Request, vm_id: str) -> Response:
    """A VM page's live part (its status, a move under way with its progress, the last
    move's end), polled by the open page: only the fragment."""
    s = session(request)
    try:
        got = request.app.state.vms.get(vm_id, scope=policies.vm_tenant(s.principal))
    except SchedulerError as e:
        return page(request, "error_fragment.html", s, http_status=e.status, error=e)
    return page(request, "_vm_live.html", s, v=got.model_dump(mode="json", by_alias=True))


@router.post("/vms/{vm_id}/migrate", response_class=HTMLResponse)
def vm_migrate(request: Request, vm_id: str, raw: RawBody) -> Response:
    """The VM page's Migrate button: the API's move (``MigrationService.ask``), with the
    console's origin and CSRF checks first; the target as the form names it ("": placement
    picks)."""
    s = session(request)
    try:
        form = form_of(request, raw, s)
        body = MigrateRequest(target_host=form.get("target_host") or None)
        policies.move_vm(s.principal)
        request.app.state.vms.get(vm_id, scope=policies.vm_tenant(s.principal))  # 404 as the API's
        request.app.state.migrations.ask(vm_id, target=body.target_host, actor=s.principal.name)
    except ValidationError as e:
        return page(request, "error.html", s, http_status=422, error=invalid(e))
    except SchedulerError as e:
        return page(request, "error.html", s, http_status=e.status, error=e)
    return RedirectResponse(f"/ui/vms/{quote(vm_id)}", status_code=303)


@router.post("/vms/{vm_id}/start", response_class=HTMLResponse)
def vm_start(request: Request, vm_id: str, raw: RawBody) -> Response:
    """The VM page's Start button, on a stopped VM: the API's start (``VmService.start``,
    then its dispatch, as ``POST /v1/vms/{id}/start``), with the console's origin and CSRF
    checks first."""
    s = session(request)
    svc = request.app.state.vms
    try:
        form_of(request, raw, s)
        _vm, started = svc.start(vm_id, tenant=policies.vm_tenant(s.principal), actor=s.principal.name)
    except SchedulerError as e:
        return page(request, "error.html", s, http_status=e.status, error=e)
    dispatch = started and request.app.state.dispatch_enabled
    return RedirectResponse(f"/ui/vms/{quote(vm_id)}", status_code=303,
                            background=BackgroundTask(svc.dispatch, vm_id) if dispatch else None)


# ---------------------------------------------------------------------- why not


WHY_EXAMPLE = json.dumps({"name": "web-1", "vcpus": 4, "memory_mib": 4096, "image": "online"}, indent=2)


@router.get("/why", response_class=HTMLResponse)
def why_form(request: Request) -> Response:
    s = session(request)
    return page(request, "why.html", s, body=WHY_EXAMPLE, preview=None)


@router.post("/why", response_class=HTMLResponse)
def why(request: Request, raw: RawBody) -> Response:
    """The dry run of ``POST /v1/vms``: the request as the API reads it, who may create it
    as the API decides, then where it would go."""
    s = session(request)
    try:
        form = form_of(request, raw, s)
    except SchedulerError as e:
        return page(request, "error.html", s, http_status=e.status, error=e)
    text = form.get("body", "")
    try:
        try:
            body = VmCreate.model_validate_json(text)
        except ValidationError as e:
            raise invalid(e) from None
        policies.create_tenant(s.principal, body.tenant)
        preview = request.app.state.vms.preview(body).model_dump(mode="json")
    except SchedulerError as e:
        return page(request, "why.html", s, http_status=e.status, body=text, preview=None, error=e)
    return page(request, "why.html", s, body=text, preview=preview)


# ---------------------------------------------------------------------- rollouts, audit


@router.get("/rollouts", response_class=HTMLResponse)
def rollouts(request: Request) -> Response:
    s = session(request)

    def build() -> dict:
        policies.rollouts(s.principal)
        return {"rollouts": request.app.state.rollouts.list().items, "pnames": policy_names(request, s.principal)}
    return guarded(request, s, "rollouts.html", build)


@router.get("/rollouts/{name}", response_class=HTMLResponse)
def rollout(request: Request, name: str) -> Response:
    s = session(request)
    svc = request.app.state.rollouts

    def build() -> dict:
        policies.rollouts(s.principal)
        r = svc.get(name)
        hosts = svc.hosts(name, wave=None, brief=True).items
        trans = svc.transitions(name, host=None).items
        return {"r": r.model_dump(mode="json", by_alias=True), "hosts": hosts, "pnames": policy_names(request, s.principal),
                "transitions": [t.model_dump(mode="json", by_alias=True) for t in trans]}
    return guarded(request, s, "rollout.html", build)


@router.get("/audit", response_class=HTMLResponse)
def audit(request: Request, principal: str | None = None, action: str | None = None, target: str | None = None,
          before: int | None = None) -> Response:
    s = session(request)

    def build() -> dict:
        got = request.app.state.audit.list(tenant=policies.audit_tenant(s.principal), principal=principal or None,
                                           action=action or None, target=target or None, before=before,
                                           limit=AUDIT_PAGE)
        return {"items": got.items, "principal": principal or "", "action": action or "", "target": target or "",
                "before": before, "next": got.next and next_link("/ui/audit", principal=principal, action=action,
                                                                  target=target, before=got.next)}
    return guarded(request, s, "audit.html", build)
