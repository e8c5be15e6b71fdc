"""The console's sessions and its refusals, against the real scheduler app (SQLite store,
migrated) through its HTTP interface (Starlette's TestClient over https://testserver, so
the Secure cookie is kept): login and logout, a cookie replayed after logout, a revoked
token, a form without its CSRF token or from another origin, a tenant asking for a
host page, each page refused exactly when the API refuses its calls to the same token,
and script in what a page shows."""

from __future__ import annotations

import html
import json
import re
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scheduler"))
from sched_helpers import ADM, HOST, TA, Clock, host_body, make_client, vm_body  # noqa: E402

from scheduler.console.routes import COOKIE  # noqa: E402

T0 = 1_764_100_000.0


@pytest.fixture
def app(tmp_path: Path):  # type: ignore[no-untyped-def]
    with make_client(f"sqlite:///{tmp_path}/sched.db", clock=Clock(T0)) as api:
        assert api.post("/v1/hosts", json=host_body("h1", rack="r1"), headers=HOST).status_code == 201
        yield api


def browser(api: TestClient) -> TestClient:
    return TestClient(api.app, base_url="https://testserver", follow_redirects=False)


def login(api: TestClient, token: str) -> tuple[TestClient, str]:
    """A logged-in browser and its CSRF token."""
    b = browser(api)
    r = b.post("/ui/login", data={"token": token, "next": "/ui/hosts"})
    assert r.status_code == 303 and r.headers["location"] == "/ui/hosts", r.text
    cookie = r.headers["set-cookie"]
    for attr in ("HttpOnly", "Secure", "SameSite=strict", "Path=/ui", "Max-Age="):
        assert attr.lower() in cookie.lower(), cookie
    page = b.get("/ui/why")
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
    return b, csrf


def test_login_logout_and_a_replayed_cookie(app) -> None:  # type: ignore[no-untyped-def]
    anon = browser(app)
    r = anon.get("/ui/hosts")
    assert r.status_code == 303 and r.headers["location"] == "/ui/login?next=/ui/hosts"
    r = anon.post("/ui/login", data={"token": "wrong"})
    assert r.status_code == 401 and "unknown or revoked token" in r.text and COOKIE not in r.headers.get("set-cookie", "")
    b, csrf = login(app, "adm")
    assert b.get("/ui/hosts").status_code == 200 and "h1" in b.get("/ui/hosts").text
    stolen = b.cookies.get(COOKIE)
    thief = browser(app)
    thief.cookies.set(COOKIE, stolen)
    assert thief.get("/ui/hosts").status_code == 200  # a copied cookie is the session, until logout
    r = b.post("/ui/logout", data={"csrf": csrf})
    assert r.status_code == 303
    r = thief.get("/ui/hosts")
    assert r.status_code == 303 and r.headers["location"].startswith("/ui/login"), r.text


def test_a_form_without_its_csrf_token_or_from_elsewhere_changes_nothing(app) -> None:  # type: ignore[no-untyped-def]
    b, csrf = login(app, "adm")
    for data, headers, field in (({}, {}, "csrf"), ({"csrf": "forged"}, {}, "csrf"),
                                 ({"csrf": csrf}, {"Origin": "https://evil.example"}, "Origin")):
        r = b.post("/ui/hosts/h1/cordon", data={**data, "reason": "x"}, headers=headers)
        assert r.status_code == 403 and f"[{field}]" in r.text, r.text
        assert app.get("/v1/hosts/h1", headers=ADM).json()["admin_state"] == "active"
    r = b.post("/ui/hosts/h1/cordon", data={"csrf": csrf, "reason": "disk swap", "owner": "alice"})
    assert r.status_code == 303
    h = app.get("/v1/hosts/h1", headers=ADM).json()  # the owner: the session's principal, never a form's
    assert (h["admin_state"], h["admin_owner"], h["admin_reason"]) == ("cordoned", "adm", "disk swap")
    # the same through htmx: the token in its header
    r = b.post("/ui/hosts/h1/uncordon", headers={"X-CSRF-Token": csrf})
    assert r.status_code == 303 and app.get("/v1/hosts/h1", headers=ADM).json()["admin_state"] == "active"


def test_a_tenant_sees_its_vms_and_audit_and_no_host(app) -> None:  # type: ignore[no-untyped-def]
    for tenant, name, key in ((TA, "mine-1", "k1"), (ADM, "theirs-1", "k2")):
        body = vm_body(name=name) | ({"tenant": "b"} if tenant is ADM else {})
        r = app.post("/v1/vms", json=body, headers={**tenant, "Idempotency-Key": key})
        assert r.status_code == 202, r.text
    b, csrf = login(app, "ta")
    for path in ("/ui/hosts", "/ui/hosts/h1", "/ui/fleet", "/ui/rollouts"):
        r = b.get(path)
        assert r.status_code == 403 and "hyb.auth.forbidden" in r.text, (path, r.status_code)
    vms = b.get("/ui/vms").text
    assert "mine-1" in vms and "theirs-1" not in vms
    theirs = app.get("/v1/vms", params={"name": "theirs-1"}, headers=ADM).json()["items"][0]["id"]
    mine = app.get("/v1/vms", params={"name": "mine-1"}, headers=TA).json()["items"][0]["id"]
    assert b.get(f"/ui/vms/{theirs}").status_code == 404
    audit = b.get("/ui/audit").text  # as GET /v1/audit answers the tenant: its own records
    assert mine in audit and theirs not in audit
    assert [a["target"] for a in app.get("/v1/audit", headers=TA).json()["items"]] == [mine]
    r = b.post("/ui/why", data={"csrf": csrf, "body": '{"name": "w", "vcpus": 1, "memory_mib": 128, "image": "smoke"}'})
    assert r.status_code == 200 and "Fits: h1" in r.text
    r = b.post("/ui/why", data={"csrf": csrf, "body": '{"name": "w", "vcpus": 1, "memory_mib": 128, "image": "smoke", '
                                                      '"tenant": "b"}'})
    assert r.status_code == 403 and "[tenant]" in r.text  # another tenant's VM: refused as the API refuses it
    r = b.post("/ui/why", data={"csrf": csrf, "body": '{"name": "w", "vcpus": "many"}'})
    assert r.status_code == 422 and "[vcpus]" in r.text


@pytest.mark.parametrize("token", ["adm", "ta", "hst", "oss1"])
def test_each_page_answers_as_the_api_does(app, token) -> None:  # type: ignore[no-untyped-def]
    """The console adds no rule and skips none: for every kind of token, a page is
    refused exactly when the API call it shows is."""
    vm = app.post("/v1/vms", json=vm_body(name="web-1"), headers={**TA, "Idempotency-Key": "k9"}).json()["id"]
    assert app.post("/v1/hosts/h1/cordon", json={"reason": "x"}, headers=ADM).status_code == 200
    assert app.post("/v1/hosts/h1/drain", json={"reason": "x"}, headers=ADM).status_code == 200
    day = "2025-11-25"
    pages = {"/ui/hosts": ["/v1/hosts"], "/ui/vms": ["/v1/vms"], f"/ui/vms/{vm}": [f"/v1/vms/{vm}"],
             "/ui/audit": ["/v1/audit"], "/ui/rollouts": ["/v1/rollouts"],
             f"/ui/fleet?day={day}": [f"/v1/fleet/utilization?day={day}", "/v1/fleet/hosts",
                                      f"/v1/fleet/utilization/heatmap?day={day}", f"/v1/fleet/io-health?day={day}"],
             f"/ui/fleet/bin?day={day}&bin=0": [f"/v1/fleet/utilization/hosts?day={day}&bin=0"],
             "/ui/hosts/h1": ["/v1/hosts/h1", "/v1/vms?host=h1", "/v1/hosts/h1/stats", "/v1/audit?target=h1",
                              "/v1/hosts/h1/drain"]}
    b, _ = login(app, token)
    for ui, calls in pages.items():
        api = [app.get(c, headers={"Authorization": f"Bearer {token}"}).status_code for c in calls]
        want = 200 if all(st == 200 for st in api) else next(st for st in api if st != 200)
        assert b.get(ui).status_code == want, (token, ui, api)
    r = b.post("/ui/hosts/h1/uncordon", headers={"X-CSRF-Token": _csrf(b)}, data={"reason": "done"})
    api = app.post("/v1/hosts/h1/uncordon", json={"reason": "done"}, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == (303 if api.status_code == 200 else api.status_code), (token, r.text[:500], api.text)


def _csrf(b: TestClient) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', b.get("/ui/why").text).group(1)


def test_script_in_what_a_page_shows_is_text(app) -> None:  # type: ignore[no-untyped-def]
    evil = '<img src=x onerror=alert(1)>'
    r = app.post("/v1/vms", json=vm_body(name=evil), headers={**TA, "Idempotency-Key": "k3"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "name"  # a VM name cannot hold it
    r = app.post("/v1/vms", json=vm_body(name="web-1", labels={"note": evil}), headers={**TA, "Idempotency-Key": "k4"})
    assert r.status_code == 202, r.text
    assert app.post("/v1/hosts", json=host_body("h2", rack=evil), headers=HOST).status_code == 201
    b, _ = login(app, "adm")
    for page in (b.get(f"/ui/vms/{r.json()['id']}").text, b.get("/ui/hosts").text):
        assert evil not in page and "&lt;img src=x onerror=alert(1)&gt;" in page


def test_a_revoked_token_ends_its_sessions(app) -> None:  # type: ignore[no-untyped-def]
    """A database token revoked (as `hybctl token revoke` does) ends the console sessions
    made with it once the replica's token book has read the change (within its
    ``refresh_s``; forced here). (Dot segments are refused before routing:
    tests/console/test_console_browser.py sends them raw to a real server; an HTTP client
    library normalises them away.)"""
    from scheduler.service.tokens import create_token, revoke_tokens
    store, book = app.app.state.store, app.app.state.tokens
    new = create_token(store, name="tenant-a-ops", scopes=["tenant:a"], ttl_s=None, now=T0)
    b, _ = login(app, new.token)
    assert b.get("/ui/static/console.css").status_code == 200
    assert b.get("/ui/vms").status_code == 200
    assert revoke_tokens(store, token_id=new.id, now=T0 + 1) == [new.id]
    book._refresh(force=True)
    r = b.get("/ui/vms")
    assert r.status_code == 303 and r.headers["location"].startswith("/ui/login")
    assert browser(app).post("/ui/login", data={"token": new.token, "next": "/ui/hosts"}).status_code != 303


# Origins that are not this https console's: nobody's (null), its own name over plain
# http, another port, another site, userinfo or a path smuggled in, no scheme at all.
FOREIGN = ("null", "http://testserver", "http://testserver:443", "https://testserver:8443",
           "https://evil.example", "https://testserver.evil.example", "https://user@testserver",
           "https://testserver/ui", "testserver", "")


@pytest.mark.parametrize("origin", FOREIGN)
def test_login_from_a_foreign_origin_opens_no_session(app, origin) -> None:  # type: ignore[no-untyped-def]
    r = browser(app).post("/ui/login", data={"token": "adm", "next": "/ui/hosts"}, headers={"Origin": origin})
    assert r.status_code == 403 and "[Origin]" in r.text, (origin, r.status_code, r.text[:300])
    assert COOKIE not in r.headers.get("set-cookie", "")


@pytest.mark.parametrize("origin", FOREIGN)
def test_a_form_from_a_foreign_origin_with_a_good_csrf_token_changes_nothing(app, origin) -> None:  # type: ignore[no-untyped-def]
    b, csrf = login(app, "adm")
    r = b.post("/ui/hosts/h1/cordon", data={"csrf": csrf, "reason": "x"}, headers={"Origin": origin})
    assert r.status_code == 403 and "[Origin]" in r.text, (origin, r.status_code, r.text[:300])
    assert app.get("/v1/hosts/h1", headers=ADM).json()["admin_state"] == "active"


@pytest.mark.parametrize("origin", ["https://testserver", "https://TestServer", "https://testserver:443", None])
def test_this_consoles_own_origin_is_taken(app, origin) -> None:  # type: ignore[no-untyped-def]
    """Its own origin, with the default port written or not (or no Origin header: a
    client that is not a browser, which still needs the token and the CSRF token)."""
    headers = {"Origin": origin} if origin else {}
    b = browser(app)
    r = b.post("/ui/login", data={"token": "adm", "next": "/ui/hosts"}, headers=headers)
    assert r.status_code == 303 and COOKIE in r.headers["set-cookie"], r.text
    r = b.post("/ui/hosts/h1/cordon", data={"csrf": _csrf(b), "reason": "x"}, headers=headers)
    assert r.status_code == 303 and app.get("/v1/hosts/h1", headers=ADM).json()["admin_state"] == "cordoned"


def test_a_console_served_over_http_takes_its_http_origin_only(app) -> None:  # type: ignore[no-untyped-def]
    """(Local development with server.plaintext: the scheme the request came by.)"""
    plain = TestClient(app.app, base_url="http://testserver", follow_redirects=False)
    r = plain.post("/ui/login", data={"token": "adm"}, headers={"Origin": "https://testserver"})
    assert r.status_code == 403 and "[Origin]" in r.text
    r = plain.post("/ui/login", data={"token": "adm"}, headers={"Origin": "http://testserver"})
    assert r.status_code == 303


SECURE = {"content-security-policy", "x-frame-options", "x-content-type-options", "referrer-policy",
          "strict-transport-security"}


def _check_headers(r, *, https: bool = True, static: bool = False) -> None:  # type: ignore[no-untyped-def]
    where = f"{r.request.method} {r.request.url} -> {r.status_code}"
    csp = dict(d.strip().split(" ", 1) for d in r.headers.get("content-security-policy", "").split(";") if d.strip())
    assert csp.get("default-src") == "'none'" and csp.get("script-src") == "'self'", (where, csp)
    assert csp.get("frame-ancestors") == "'none'" and csp.get("form-action") == "'self'", (where, csp)
    assert not any("unsafe-inline" in v or "unsafe-eval" in v for k, v in csp.items() if k.startswith("script")), csp
    assert "unsafe-inline" not in csp.get("style-src", "") + csp.get("style-src-elem", ""), csp
    assert r.headers.get("x-frame-options") == "DENY", where
    assert r.headers.get("x-content-type-options") == "nosniff", where
    assert r.headers.get("referrer-policy") == "same-origin", where  # never no-referrer: Origin would be null
    hsts = r.headers.get("strict-transport-security", "")
    assert (hsts.startswith("max-age=") and int(hsts.split("=")[1]) >= 180 * 86400) if https else not hsts, where
    assert (r.headers.get("cache-control") == "no-store") != static, (where, r.headers.get("cache-control"))


def test_every_console_response_carries_the_security_headers(app) -> None:  # type: ignore[no-untyped-def]
    vm = app.post("/v1/vms", json=vm_body(name="web-1"), headers={**TA, "Idempotency-Key": "k9"}).json()["id"]
    anon = browser(app)
    for r in (anon.get("/ui/login"), anon.get("/ui/hosts"), anon.get("/ui"), anon.post("/ui/login", data={"token": "x"}),
              anon.post("/ui/login", data={"token": "adm"}, headers={"Origin": "null"})):
        _check_headers(r)
    b, csrf = login(app, "adm")
    day = "2025-11-25"
    for path in ("/ui", "/ui/fleet", f"/ui/fleet?day={day}&compare=2025-11-24&group=rack", f"/ui/fleet/bin?day={day}&bin=0",
                 f"/ui/fleet.csv?day={day}", "/ui/hosts", "/ui/hosts/h1", "/ui/vms", f"/ui/vms/{vm}", "/ui/why",
                 "/ui/rollouts", "/ui/audit", "/ui/hosts/nope", "/ui/rollouts/nope", "/ui/nothing-here",
                 "/ui/fleet?day=someday", "/ui/fleet/bin?day=2025-11-25&bin=abc"):
        _check_headers(b.get(path))
    for path in ("/ui/static/console.css", "/ui/static/console.js"):
        r = b.get(path)
        assert r.status_code == 200, path
        _check_headers(r, static=True)
    for path, data in (("/ui/why", {"csrf": csrf, "body": "{"}), ("/ui/hosts/h1/cordon", {"csrf": csrf, "reason": "x"}),
                       ("/ui/hosts/h1/cordon", {"csrf": "forged"}), ("/ui/logout", {"csrf": csrf})):
        _check_headers(b.post(path, data=data))
    r = b.post("/ui/why", content=b"x" * (app.app.state.settings.server.max_body_bytes + 1),
               headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 413  # refused before any route: the headers still
    _check_headers(r)
    plain = TestClient(app.app, base_url="http://testserver", follow_redirects=False)
    _check_headers(plain.get("/ui/login"), https=False)  # HSTS only over https
    api = app.get("/v1/hosts", headers=ADM)  # the API is not a page: none of the page headers
    assert not SECURE & set(api.headers), api.headers


def test_the_templates_hold_no_inline_script() -> None:
    """What the policy would block: inline handlers, javascript: URLs, script elements
    with code (a JSON data block is not run)."""
    root = Path(__file__).resolve().parents[2] / "scheduler" / "console" / "templates"
    for t in sorted(root.glob("*.html")):
        src = t.read_text()
        assert not re.search(r"\son[a-z]+\s*=", src), t.name
        assert "javascript:" not in src, t.name
        assert "<style" not in src, t.name
        for m in re.finditer(r"<script([^>]*)>(.*?)</script>", src, re.S):
            assert "src=" in m.group(1) or 'type="application/json"' in m.group(1), (t.name, m.group(0)[:80])


def _is_page(r, status: int, code: str, field: str | None = None) -> None:  # type: ignore[no-untyped-def]
    where = f"{r.request.method} {r.request.url}"
    assert r.status_code == status, (where, r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith("text/html"), (where, r.headers["content-type"], r.text[:200])
    assert r.text.lstrip().startswith("<!doctype html>") and '<a class="brand" href="/ui">' in r.text, where
    err = re.search(r'<p class="error" id="error">(.*?)</p>', r.text, re.S).group(1)
    assert f"<code>{code}</code>" in err and (f"[{field}]" in err if field else "[" not in err), (where, err)
    assert f"<h1 id=\"error-title\">{status}: " in r.text, where


def test_a_failing_console_url_answers_a_page_the_api_json(app) -> None:  # type: ignore[no-untyped-def]
    b, csrf = login(app, "adm")
    _is_page(b.get("/ui/nothing-here"), 404, "hyb.http.not_found")
    _is_page(b.get("/ui/logout"), 405, "hyb.http.method_not_allowed")
    _is_page(b.get("/ui/fleet.csv?day=someday"), 422, "hyb.request.invalid", "day")
    _is_page(b.get("/ui/fleet.csv?group=colour"), 422, "hyb.request.invalid", "group")
    _is_page(b.get("/ui/fleet/bin?day=2025-11-25&bin=abc"), 422, "hyb.request.invalid", "bin")
    _is_page(b.get("/ui/fleet/bin?bin=3"), 422, "hyb.request.invalid", "day")
    _is_page(b.get("/ui/hosts/nope"), 404, "hyb.host.not_found", "name")
    assert "Log out" in b.get("/ui/nothing-here").text  # the session's header: the console's layout
    # 409: another owner's hold, as the API refuses it
    assert app.post("/v1/hosts/h1/cordon", json={"reason": "x"}, headers=ADM).status_code == 200
    r = b.post("/ui/hosts/h1/drain", data={"csrf": csrf, "reason": "y", "expect_owner": "someone-else"})
    api = app.post("/v1/hosts/h1/drain", json={"reason": "y", "expect_owner": "someone-else"}, headers=ADM)
    assert api.status_code == 409, api.text
    _is_page(r, 409, api.json()["error"]["code"], "expect_owner")
    # htmx asks for a fragment: the error alone, for its target
    r = b.get("/ui/fleet/bin?day=2025-11-25&bin=abc", headers={"HX-Request": "true"})
    assert r.status_code == 422 and "<html" not in r.text and "<code>hyb.request.invalid</code> [bin]" in r.text
    ta, _ = login(app, "ta")
    _is_page(ta.get("/ui/fleet.csv"), 403, "hyb.auth.forbidden")
    # refused before any route (a why-not pasted over the body limit): a page too
    big = app.app.state.settings.server.max_body_bytes + 1
    r = b.post("/ui/why", content=b"x" * big, headers={"Content-Type": "application/x-www-form-urlencoded"})
    _is_page(r, 413, "hyb.request.too_large", "body")
    assert "server.max_body_bytes" in r.text
    r = app.post("/v1/vms", content=b"x" * big, headers={**TA, "Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "hyb.request.too_large"
    # the API keeps its JSON for the same failures
    for path, status in (("/v1/nothing-here", 404), ("/v1/hosts/nope", 404),
                         ("/v1/fleet/utilization/hosts?day=2025-11-25&bin=abc", 422)):
        r = app.get(path, headers=ADM)
        assert r.status_code == status and r.headers["content-type"] == "application/json" and r.json()["error"], path


def test_a_console_page_that_fails_answers_a_page(app) -> None:  # type: ignore[no-untyped-def]
    """A failure of ours (500) and the store's (503): a page naming it, as the API names it."""
    b, _ = login(app, "adm")
    crashing = TestClient(app.app, base_url="https://testserver", follow_redirects=False,
                          raise_server_exceptions=False, cookies=dict(b.cookies))
    fleet = app.app.state.fleet
    app.app.state.fleet = None  # the fleet service gone: an AttributeError in the page
    try:
        r = crashing.get("/ui/fleet?day=2025-11-25")
        api = TestClient(app.app, raise_server_exceptions=False).get("/v1/fleet/utilization?day=2025-11-25",
                                                                      headers=ADM)
    finally:
        app.app.state.fleet = fleet
    assert api.status_code == 500 and api.headers["content-type"] == "application/json"
    _is_page(r, 500, api.json()["error"]["code"])
    assert "AttributeError" in r.text and "Traceback" not in r.text
    with app.app.state.store.engine.begin() as c:  # the store loses a table the page reads
        c.exec_driver_sql("ALTER TABLE audit RENAME TO audit_gone")
    try:
        r = crashing.get("/ui/audit")
    finally:
        with app.app.state.store.engine.begin() as c:
            c.exec_driver_sql("ALTER TABLE audit_gone RENAME TO audit")
    _is_page(r, 503, "hyb.store.unavailable")
    assert "no such table" in r.text


def _day(day: str, cpus: int, vms: float) -> dict:
    return {"day": day, "utc_offset_min": 0, "cpus": cpus, "samples": 86400,
            "peak": {"start": "21:00", "end": "22:00", "samples": 3600, "io": 0.5, "vms": vms, "other": 0.0},
            "hours": [10] * 24, "hist": [0] * 19 + [86400], "probe_p99_ms_max": None, "psi_some_avg10_max": None,
            "foreign_cpu_s": 0.0, "probe_failed": 0}


def test_a_group_only_the_compare_day_has_is_drawn(app) -> None:  # type: ignore[no-untyped-def]
    """Issue 40 A2: the charts draw every group of both days (the page's data lists them),
    a rack whose hosts sent only the compare day among them."""
    day, before = "2025-11-25", "2025-11-20"
    assert app.post("/v1/hosts", json=host_body("h2", rack="r-gone"), headers=HOST).status_code == 201
    for name, days in (("h1", [_day(before, 16, 2.0), _day(day, 16, 6.0)]), ("h2", [_day(before, 16, 4.0)])):
        assert app.post(f"/v1/hosts/{name}/days", json={"days": days}, headers=HOST).status_code == 202
    want = app.get("/v1/fleet/utilization", params={"day": day, "compare": before, "group": "rack"}, headers=ADM).json()
    assert set(want["day"]["groups"]) == {"r1"} and set(want["compare"]["groups"]) == {"r1", "r-gone"}
    b, _ = login(app, "adm")
    r = b.get("/ui/fleet", params={"day": day, "compare": before, "group": "rack"})
    assert r.status_code == 200, r.text
    data = json.loads(html.unescape(re.search(r'<script type="application/json" id="fleet-data">(.*?)</script>',
                                              r.text, re.S).group(1)))
    assert data["groups"] == ["r1", "r-gone"]
    assert data["u"] == want  # the numbers the charts draw are the API's
