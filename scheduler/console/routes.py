"""The web console's pages under /ui: server-rendered (Jinja2), progressively enhanced
with htmx, charts drawn by ECharts in the browser from numbers the server put in the
page.

Every number comes from the API's own handlers (``scheduler/api/routes``), called with
the session's principal: the console can show nothing the API would not answer to the
same token, and scopes are the API's (a tenant sees its VMs and nothing of hosts or
the audit). A state-changing request must carry the session's CSRF token (a form's
hidden ``csrf`` field, or htmx's ``X-CSRF-Token`` header) and, when the browser sends
one, an ``Origin`` of this server."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import logging
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from pydantic import ValidationError

from api.states import AdminState, HostState, VmStatus
from scheduler.api.deps import Principal
from scheduler.api.routes import audit as audit_routes
from scheduler.api.routes import fleet as fleet_routes
from scheduler.api.routes import hosts as host_routes
from scheduler.api.routes import rollouts as rollout_routes
from scheduler.api.routes import vms as vm_routes
from scheduler.api.wire import read_create
from scheduler.console.sessions import COOKIE, Session
from scheduler.errors import Forbidden, InvalidRequest, SchedulerError
from scheduler.schemas.fleet import FleetHostsPublic
from scheduler.schemas.hosts import AdminChange
from scheduler.service.fleet import ALERT_LIMITS

log = logging.getLogger(__name__)
HERE = Path(__file__).parent
STATIC = HERE / "static"
VENDOR = STATIC / "vendor"  # fetched by `make console-assets` (tools/dev/fetch-console-assets.sh), never committed
router = APIRouter(prefix="/ui", include_in_schema=False)
templates = Jinja2Templates(directory=str(HERE / "templates"))  # autoescape on: names are shown as text
GROUPS = ("class", "rack", "state", "policy")


class LoginNeeded(Exception):
    pass


def when(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


templates.env.filters["when"] = when
templates.env.filters["pct"] = lambda v: "-" if v is None else f"{v * 100:.1f} %"
templates.env.filters["tojson_attr"] = lambda v: json.dumps(v, sort_keys=True)


def session(request: Request) -> Session:
    s = request.app.state.console.find(request.cookies.get(COOKIE))
    if s is None:
        raise LoginNeeded()
    return s


def page(request: Request, name: str, s: Session | None, http_status: int = 200, **ctx: Any) -> HTMLResponse:
    return templates.TemplateResponse(request, name, {"me": s.principal if s else None, "csrf": s.csrf if s else "",
                                                      "vendor": VENDOR.joinpath("echarts.min.js").exists(),
                                                      **ctx}, status_code=http_status)


async def form_of(request: Request, s: Session | None) -> dict[str, str]:
    """The urlencoded form of a POST, after its origin and (with a session) its CSRF
    token were checked; Forbidden names what is wrong."""
    origin = request.headers.get("origin")
    if origin and origin != "null" and urlsplit(origin).netloc != request.headers.get("host"):
        raise Forbidden(f"a request from another origin ({origin})", field="Origin")
    raw = (await request.body()).decode("utf-8", "replace")
    form = {k: v[-1] for k, v in parse_qs(raw, keep_blank_values=True).items()}
    if s is not None and not s.csrf_ok(request.headers.get("x-csrf-token") or form.get("csrf")):
        raise Forbidden("missing or wrong CSRF token: reload the page and try again", field="csrf")
    return form


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


async def guarded(request: Request, s: Session, name: str, build) -> Response:  # type: ignore[no-untyped-def]
    """``build()`` -> the page's context; the API's refusals as an error page with the
    API's status, code and message (a tenant asking for a host: 403)."""
    try:
        ctx = await build() if callable(build) else build
    except SchedulerError as e:
        return page(request, "error.html", s, http_status=e.status, error=e)
    return page(request, name, s, **ctx)


# ---------------------------------------------------------------------- login


@router.get("", response_class=HTMLResponse)
@router.get("/", response_class=HTMLResponse)
def home(request: Request) -> Response:
    s = session(request)
    return RedirectResponse("/ui/fleet" if s.principal.admin else "/ui/vms", status_code=303)


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, next: str = "/ui") -> Response:
    return page(request, "login.html", None, next=safe_next(next))


def safe_next(n: str) -> str:
    """Only a console path: never another site, never out of /ui."""
    return n if n.startswith("/ui") and "//" not in n and "\\" not in n else "/ui"


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request) -> Response:
    try:
        form = await form_of(request, None)
    except SchedulerError as e:
        return page(request, "login.html", None, http_status=e.status, error=e, next="/ui")
    nxt = safe_next(form.get("next", "/ui"))
    try:
        cookie, s = request.app.state.console.open(form.get("token", "").strip())
    except SchedulerError as e:
        log.info("console login refused from %s: %s", request.client.host if request.client else "?", e.message)
        return page(request, "login.html", None, http_status=401, error=e, next=nxt)
    r = RedirectResponse(nxt, status_code=303)
    book = request.app.state.console
    r.set_cookie(COOKIE, cookie, max_age=int(s.expires - book.clock()), path="/ui", secure=True, httponly=True,
                 samesite="strict")
    return r


@router.post("/logout", response_class=HTMLResponse)
async def logout(request: Request) -> Response:
    s = session(request)
    try:
        await form_of(request, s)
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


def free_capacity(f: FleetHostsPublic) -> list[tuple[str, str, str]]:
    """(resource class, free, of total): free on the hosts that take VMs (active, up)."""
    rows = [("CPUs (dedicated)", str(f.cpus_free), str(f.cpus_total))]
    for p in f.pages:
        label = {1048576: "1 GiB pages", 2048: "2 MiB pages"}.get(p.size_kb, f"{p.size_kb} KiB pages")
        rows.append((label, str(p.free), str(p.total)))
    rows += [("SR-IOV VFs", str(f.vfs_free), str(f.vfs_total)), ("VF tx budget", f"{f.tx_free_mbps} Mb/s", "-"),
             ("raw disks", str(f.disks_free), str(f.disks_total)),
             ("disk IO budget", f"{f.disk_iops_free} IOPS", "-")]
    return rows


@router.get("/fleet", response_class=HTMLResponse)
async def fleet(request: Request, day: str | None = None, compare: str | None = None, group: str = "class",
                window: str = "peak") -> Response:
    s = session(request)

    async def build() -> dict:
        p = s.principal
        p.require()
        a = fleet_args(day, compare, group, window)
        u = fleet_routes.utilization(request, p, day=a["day"], compare=a["compare"], window=a["window"],
                                     group=a["group"], bins=20)
        hosts = fleet_routes.hosts_summary(request, p)
        hm = fleet_routes.utilization_heatmap(request, p, day=a["day"], window=a["window"], bins=20,
                                              days=request.app.state.settings.console.heatmap_days)
        heat = [{"day": d.day.isoformat(), "counts": d.counts, "hosts": d.hosts} for d in hm.days]
        ioh = fleet_routes.io_health(request, p, day=a["day"], **ALERT_LIMITS.model_dump())
        return {"u": u.model_dump(mode="json"), "args": a, "groups": GROUPS, "heat": heat, "ioh": ioh,
                "classes": hosts.classes, "capacity": free_capacity(hosts), "hosts_total": hosts.hosts}
    return await guarded(request, s, "fleet.html", build)


@router.get("/fleet/bin", response_class=HTMLResponse)
def fleet_bin(request: Request, day: str, bin: int, window: str = "peak", cls: str = "all") -> Response:
    s = session(request)
    try:
        s.principal.require()
        a = fleet_args(day, None, "class", window)
        got = fleet_routes.utilization_hosts(request, s.principal, day=a["day"], bin=bin, window=a["window"],
                                             bins=20, cls=cls)
    except SchedulerError as e:
        return page(request, "error_fragment.html", s, http_status=e.status, error=e)
    return page(request, "bin_hosts.html", s, b=got.model_dump(mode="json"), cls=cls)


@router.get("/fleet.csv")
def fleet_csv(request: Request, day: str | None = None, compare: str | None = None, group: str = "class",
              window: str = "peak") -> Response:
    s = session(request)
    s.principal.require()
    a = fleet_args(day, compare, group, window)
    u = fleet_routes.utilization(request, s.principal, day=a["day"], compare=a["compare"], window=a["window"],
                                 group=a["group"], bins=20)
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


@router.get("/hosts", response_class=HTMLResponse)
async def hosts(request: Request, rack: str | None = None, state: str | None = None) -> Response:
    s = session(request)

    async def build() -> dict:
        s.principal.require()
        st = state if state in set(HostState) else None
        return {"hosts": host_routes.list_hosts(request, s.principal, rack=rack or None, state=st).items,
                "rack": rack or "", "state": st or "", "states": list(HostState)}
    return await guarded(request, s, "hosts.html", build)


@router.get("/hosts/{name}", response_class=HTMLResponse)
async def host(request: Request, name: str) -> Response:
    s = session(request)

    async def build() -> dict:
        p = s.principal
        p.require()  # a host page is an operator's: the API lets a host token read it, the console does not
        h = host_routes.get_host(name, request, p)
        vms = vm_routes.list_vms(request, p, host=name, status=None, name=None, tenant=None, limit=1000, after="")
        stats = host_routes.host_stats(name, request, p, since=time.time() - 86400, until=None)
        hist = await audit_routes.list_audit(request, p, since=None, until=None, principal=None, action=None,
                                             target=name, before=None, limit=50)
        drain = host_routes.drain_status(name, request, p) if h.admin_state == AdminState.DRAINING else None
        return {"h": h.model_dump(mode="json", by_alias=True), "vms": vms.items, "stats": stats.model_dump(mode="json"),
                "history": hist.items, "drain": drain}
    return await guarded(request, s, "host.html", build)


@router.post("/hosts/{name}/{verb}", response_class=HTMLResponse)
async def host_admin(request: Request, name: str, verb: str) -> Response:
    s = session(request)
    try:
        form = await form_of(request, s)
        if verb not in ("cordon", "uncordon", "drain"):
            raise InvalidRequest(f"{verb!r}: cordon, uncordon or drain", field="verb")
        body = AdminChange(reason=form.get("reason", ""), force=form.get("force") == "on",
                           expect_owner=form.get("expect_owner"))  # the owner: the API's, the session's principal
        getattr(host_routes, verb)(name, request, s.principal, body)
    except ValidationError as e:
        err = e.errors()[0]
        return page(request, "error.html", s, http_status=422,
                    error=InvalidRequest(err["msg"], field=".".join(str(x) for x in err["loc"])))
    except SchedulerError as e:
        return page(request, "error.html", s, http_status=e.status, error=e)
    return RedirectResponse(f"/ui/hosts/{quote(name)}", status_code=303)


# ---------------------------------------------------------------------- VMs


@router.get("/vms", response_class=HTMLResponse)
async def vms(request: Request, tenant: str | None = None, host: str | None = None, status: str | None = None) -> Response:
    s = session(request)

    async def build() -> dict:
        st = status if status in set(VmStatus) else None
        got = vm_routes.list_vms(request, s.principal, host=host or None, status=st, name=None, tenant=tenant or None,
                                 limit=1000, after="")
        return {"vms": got.items, "tenant": tenant or "", "host": host or "", "status": st or "",
                "statuses": list(VmStatus)}
    return await guarded(request, s, "vms.html", build)


@router.get("/vms/{vm_id}", response_class=HTMLResponse)
async def vm(request: Request, vm_id: str) -> Response:
    s = session(request)

    async def build() -> dict:
        return {"v": vm_routes.get_vm(vm_id, request, s.principal).model_dump(mode="json", by_alias=True)}
    return await guarded(request, s, "vm.html", build)


# ---------------------------------------------------------------------- why not


WHY_EXAMPLE = json.dumps({"name": "web-1", "vcpus": 4, "memory_mib": 4096, "image": "online"}, indent=2)


@router.get("/why", response_class=HTMLResponse)
def why_form(request: Request) -> Response:
    s = session(request)
    return page(request, "why.html", s, body=WHY_EXAMPLE, preview=None)


@router.post("/why", response_class=HTMLResponse)
async def why(request: Request) -> Response:
    s = session(request)
    try:
        form = await form_of(request, s)
    except SchedulerError as e:
        return page(request, "error.html", s, http_status=e.status, error=e)
    text = form.get("body", "")
    try:
        req = read_create(s.principal, dry_run="true", key="console-why", ctype="application/json",
                          body=text.encode())
        preview = vm_routes.preview_out(request.app.state.vms.preview(req.body)).model_dump(mode="json")
    except SchedulerError as e:
        return page(request, "why.html", s, http_status=e.status, body=text, preview=None, error=e)
    return page(request, "why.html", s, body=text, preview=preview)


# ---------------------------------------------------------------------- rollouts, audit


@router.get("/rollouts", response_class=HTMLResponse)
async def rollouts(request: Request) -> Response:
    s = session(request)

    async def build() -> dict:
        return {"rollouts": rollout_routes.list_rollouts(request, s.principal).items}
    return await guarded(request, s, "rollouts.html", build)


@router.get("/rollouts/{name}", response_class=HTMLResponse)
async def rollout(request: Request, name: str) -> Response:
    s = session(request)

    async def build() -> dict:
        p = s.principal
        r = rollout_routes.get_rollout(name, request, p)
        hosts = rollout_routes.rollout_hosts(name, request, p, wave=None, brief=True).items
        trans = rollout_routes.transitions(name, request, p, host=None).items
        return {"r": r.model_dump(mode="json", by_alias=True), "hosts": hosts,
                "transitions": [t.model_dump(mode="json", by_alias=True) for t in trans]}
    return await guarded(request, s, "rollout.html", build)


@router.get("/audit", response_class=HTMLResponse)
async def audit(request: Request, principal: str | None = None, action: str | None = None,
                target: str | None = None) -> Response:
    s = session(request)

    async def build() -> dict:
        s.principal.require()
        got = await audit_routes.list_audit(request, s.principal, since=None, until=None, principal=principal or None,
                                            action=action or None, target=target or None, before=None, limit=200)
        return {"items": got.items, "principal": principal or "", "action": action or "", "target": target or ""}
    return await guarded(request, s, "audit.html", build)


def principal_label(p: Principal) -> str:
    return p.name + (" (admin)" if p.admin else f" (tenant {p.tenant})" if p.tenant else "")


templates.env.globals["principal_label"] = principal_label
