"""The console in a real browser: headless Chromium from Debian, driven by Selenium
through Debian's chromedriver, against a real `scheduler serve` (SQLite, HTTPS from a
dev CA) whose fleet has a known utilisation (tools/dev/console_fleet.py: hosts
registered and their days sent through the API). Each page is checked against the
REST API's answer to the same question; screenshots of every page go to the test's
directory (kept by pytest under its basetemp). No browser process outlives the module:
the last test looks for any process started with its profile directory."""

from __future__ import annotations

import datetime as dt
import json
import socket
import time

import httpx
import pytest
from tools.dev.console_fleet import CHROMEDRIVER, CHROMIUM, Chromium, login, populate, wait_for
from tools.dev.fleetsim import fleet_scheduler

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
                                 reason="Debian's chromium and chromium-driver are not installed (make sysdeps)")]
ADMIN, HOST, WEB = "console-admin", "console-host", "console-web"
TODAY = dt.date.today()
BEFORE, AFTER = (TODAY - dt.timedelta(days=30)).isoformat(), (TODAY - dt.timedelta(days=1)).isoformat()
N = 120


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    w = tmp_path_factory.mktemp("console")
    with fleet_scheduler(w, admin_token=ADMIN, host_token=HOST, tenants={WEB: "web"}) as s:
        url = s["sched"].url
        populate(url, s["sched"].verify, HOST, ADMIN, N, before=BEFORE, after=AFTER)
        api = httpx.Client(base_url=url, verify=s["sched"].verify, timeout=30,
                           headers={"Authorization": f"Bearer {ADMIN}"})
        r = api.post("/v1/rollouts", json={
            "name": "conv-1", "kind": "convert", "policy_digest": "ab" * 32, "spec": {"name": "conv-1"},
            "waves": [[{"name": h, "address": f"{h}:7443", "rack": "r0000", "host": {"name": h}}]
                      for h in ("oss-00000", "oss-00001")]})
        assert r.status_code == 201, r.text
        for name, tenant, key in (("web-a", "web", "k1"), ("db-a", "db", "k2")):
            r = api.post("/v1/vms", json={"name": name, "vcpus": 1, "memory_mib": 128, "image": "smoke",
                                          "tenant": tenant}, headers={"Idempotency-Key": key})
            assert r.status_code == 202, r.text
        b = Chromium(w)
        # every page records what its Content-Security-Policy blocked (a script the CDP
        # adds before the page's own: the policy does not apply to it)
        b.driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": CSP_WATCH})
        try:
            yield {"url": url, "api": api, "b": b, "shots": w / "screenshots", "sched": s["sched"], "dir": w,
                   "certs": s["certs"]}
        finally:
            b.quit()  # again after the last test's: a no-op then
            api.close()


CSP_WATCH = """window.__csp = [];
document.addEventListener('securitypolicyviolation',
  e => window.__csp.push([e.effectiveDirective, e.blockedURI, e.sourceFile + ':' + e.lineNumber, e.sample]));"""


def blocked(env: dict) -> list:
    return env["b"].driver.execute_script("return window.__csp || ['no watch'];")


def shot(env: dict, name: str) -> None:
    env["shots"].mkdir(exist_ok=True)
    env["b"].driver.save_screenshot(str(env["shots"] / f"{name}.png"))


def text(env: dict, css: str) -> str:
    """The first match's text, read in one script (``texts``)."""
    got = texts(env, css)
    assert got, f"nothing on the page matches {css!r}"
    return got[0]


def texts(env: dict, css: str) -> list[str]:
    """Every match's text, read in one script: on a part htmx swaps on a timer, an
    element found before a swap is stale after it."""
    return env["b"].driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(e => e.innerText);", css)


def test_the_fleet_chart_shows_the_apis_bins(env) -> None:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By
    b = env["b"]
    login(b, env["url"], ADMIN, f"/ui/fleet?day={AFTER}&compare={BEFORE}&group=class")
    wait_for(lambda: b.driver.find_element(By.ID, "hist"))
    want = env["api"].get("/v1/fleet/utilization", params={"day": AFTER, "compare": BEFORE, "group": "class"}).json()
    assert text(env, "#included") == f"{want['day']['hosts_included']:,}" == f"{N:,}"
    assert text(env, "#missing") == "0"
    series = wait_for(lambda: b.driver.execute_script(
        "const c = echarts.getInstanceByDom(document.getElementById('hist'));"
        "return c && c.getOption().series.map(s => [s.name, s.data]);"))
    got = {name: data for name, data in series}
    # the compare day over the day's bars as stepped lines: 3 bars a bin, not 6
    kinds = dict(b.driver.execute_script(
        "return echarts.getInstanceByDom(document.getElementById('hist')).getOption().series.map(s => [s.name, s.type]);"))
    assert {k for n, k in kinds.items() if n.endswith(BEFORE)} == {"line"}
    assert {k for n, k in kinds.items() if n.endswith(AFTER)} == {"bar"}
    for key in ("day", "compare"):
        d = want[key]
        for g in d["groups"]:
            assert got.get(f"{g} {d['day']}") == [bin_["counts"].get(g, 0) for bin_ in d["bins"]], (key, g, list(got))
    # the table under the chart says the same, and a bin lists its hosts (htmx)
    vms_col = [int(td.text) for td in b.driver.find_elements(By.CSS_SELECTOR, "#bins td[data-group=vms]")]
    assert vms_col == [bin_["counts"].get("vms", 0) for bin_ in want["day"]["bins"]]
    busiest = max(range(20), key=lambda i: want["day"]["bins"][i]["counts"].get("vms", 0))
    b.driver.find_element(By.CSS_SELECTOR, f'tr[data-bin="{busiest}"] td[data-group=vms] a').click()
    listed = wait_for(lambda: b.driver.find_elements(By.CSS_SELECTOR, "#bin-hosts table.bin-hosts tbody tr"))
    api_hosts = env["api"].get("/v1/fleet/utilization/hosts",
                               params={"day": AFTER, "bin": busiest, "class": "vms"}).json()["hosts"]
    assert [r.find_element(By.CSS_SELECTOR, "td").text for r in listed] == [h["host"] for h in api_hosts]
    heat_days = b.driver.execute_script(
        "return echarts.getInstanceByDom(document.getElementById('heat')).getOption().yAxis[0].data;")
    assert heat_days[-1] == AFTER and len(heat_days) == 28
    # a day no host sent is blank, not 20 bins of zero hosts: cells only on the day with data
    cells = b.driver.execute_script(
        "return echarts.getInstanceByDom(document.getElementById('heat')).getOption().series[0].data;")
    assert {c[1] for c in cells} == {27} and len(cells) == 20
    # every legend entry shown (no pages), the plot below the lines the legend takes
    legend = b.driver.execute_script(
        "const o = echarts.getInstanceByDom(document.getElementById('hist')).getOption();"
        "return [o.legend[0].type, o.grid[0].top];")
    assert legend[0] == "plain" and legend[1] >= 66, legend
    # read in one script: the table is the live part htmx swaps every 3 s (an element
    # found before a swap is stale after it)
    classes = {k: int(v.replace(",", "")) for k, v in b.driver.execute_script(
        "return Object.fromEntries([...document.querySelectorAll('#classes td[data-class]')]"
        ".map(td => [td.dataset.class, td.textContent]));").items()}
    # registered, none carved by a hostd; the two in conv-1 are converting (its hosts' state: pending -> ...)
    assert sum(classes.values()) == N and classes["unconverted"] + classes["converting"] == N
    ioh = env["api"].get("/v1/fleet/io-health", params={"day": AFTER}).json()
    assert ioh["hosts_over"], "the known fleet has slow probes after the conversion"
    assert text(env, "#ioh-over") == f"{len(ioh['hosts_over']):,}"
    shown = [tr.find_element(By.CSS_SELECTOR, "td").text
             for tr in b.driver.find_elements(By.CSS_SELECTOR, "#ioh tbody tr")]
    assert shown == [h["host"] for h in ioh["hosts_over"]][:50]
    shot(env, "fleet")


def test_csv_export_is_the_same_numbers(env) -> None:  # type: ignore[no-untyped-def]
    b = env["b"]
    cookie = b.driver.get_cookie("hyb_session")
    assert cookie and cookie["httpOnly"] and cookie["secure"] and cookie["sameSite"] == "Strict"
    r = httpx.get(f"{env['url']}/ui/fleet.csv", params={"day": AFTER, "group": "rack"},
                  cookies={"hyb_session": cookie["value"]}, verify=env["sched"].verify)
    want = env["api"].get("/v1/fleet/utilization", params={"day": AFTER, "group": "rack"}).json()
    rows = [ln.split(",") for ln in r.text.strip().splitlines()[1:]]
    assert sum(int(x[4]) for x in rows) == sum(sum(b_["counts"].values()) for b_ in want["day"]["bins"]) == N


def test_a_host_page_shows_its_carve_and_a_form_without_csrf_is_refused(env) -> None:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By
    b = env["b"]
    name = "oss-00003"
    h = env["api"].get(f"/v1/hosts/{name}").json()
    b.driver.get(f"{env['url']}/ui/hosts/{name}")
    cells = [td.text for td in b.driver.find_elements(By.CSS_SELECTOR, "#carve td.cpus")]
    assert cells == [",".join(map(str, n["vm_cpus"])) for n in h["nodes"]]
    shot(env, "host")
    # a forged form: the hidden token removed before submitting
    b.driver.execute_script("document.querySelector('#form-cordon input[name=csrf]').remove();")
    b.driver.find_element(By.ID, "btn-cordon").click()
    assert "[csrf]" in wait_for(lambda: text(env, "#error"))
    assert env["api"].get(f"/v1/hosts/{name}").json()["admin_state"] == "active"
    b.driver.get(f"{env['url']}/ui/hosts/{name}")
    b.driver.find_element(By.CSS_SELECTOR, "#form-cordon input[name=reason]").send_keys("browser test")
    b.driver.find_element(By.ID, "btn-cordon").click()
    wait_for(lambda: "cordoned" in text(env, "#host-admin"))
    got = env["api"].get(f"/v1/hosts/{name}").json()
    assert (got["admin_state"], got["admin_owner"], got["admin_reason"]) == \
        ("cordoned", ADMIN_NAME, "browser test")
    b.driver.find_element(By.ID, "btn-uncordon").click()
    wait_for(lambda: "active" in text(env, "#host-admin"))


ADMIN_NAME = "ops"  # the admin token's name in tools/dev/fleetsim.write_scheduler_config


def test_a_cordon_made_through_the_api_appears_on_an_open_host_page(env) -> None:  # type: ignore[no-untyped-def]
    """The host page polls its live part (htmx, every 3 s): a cordon made elsewhere shows
    within seconds, the page never reloaded (a mark set in it survives)."""
    b, api, name = env["b"], env["api"], "oss-00005"
    b.driver.get(f"{env['url']}/ui/hosts/{name}")
    assert "active" in wait_for(lambda: text(env, "#host-admin"))
    b.driver.execute_script("window.__notReloaded = true;")
    t0 = time.monotonic()
    assert api.post(f"/v1/hosts/{name}/cordon", json={"reason": "live test"}).status_code == 200
    try:
        wait_for(lambda: "cordoned" in text(env, "#host-admin") and "live test" in text(env, "#host-admin"),
                 timeout_s=10)
        took = time.monotonic() - t0
        assert b.driver.execute_script("return window.__notReloaded === true;"), "the page was reloaded"
        assert took < 10, took
        # the hosts list too: its row of the host turns cordoned without a reload
        b.driver.get(f"{env['url']}/ui/hosts?rack={api.get(f'/v1/hosts/{name}').json()['rack']}")
        b.driver.execute_script("window.__notReloaded = true;")
        row = f"//table[@id='hosts']//tr[td/a[text()='{name}']]/td[4]"
        from selenium.webdriver.common.by import By
        assert "cordoned" in wait_for(lambda: b.driver.find_element(By.XPATH, row).text)
        assert api.post(f"/v1/hosts/{name}/uncordon", json={}).status_code == 200
        wait_for(lambda: "cordoned" not in b.driver.find_element(By.XPATH, row).text, timeout_s=10)
        assert b.driver.execute_script("return window.__notReloaded === true;"), "the list was reloaded"
        # a hidden tab asks nothing; shown again, it asks at once
        polls = "return performance.getEntriesByType('resource').filter(e => e.name.includes('/ui/live/')).length;"
        b.driver.execute_script("Object.defineProperty(document, 'hidden', {configurable: true, get: () => true});")
        before = b.driver.execute_script(polls)
        time.sleep(7)  # two polls' worth: their requests are cancelled
        assert b.driver.execute_script(polls) == before
        b.driver.execute_script("Object.defineProperty(document, 'hidden', {configurable: true, get: () => false});"
                                "document.dispatchEvent(new Event('visibilitychange'));")
        wait_for(lambda: b.driver.execute_script(polls) > before, timeout_s=2)
    finally:
        api.post(f"/v1/hosts/{name}/uncordon", json={"force": True})


def test_why_not_shows_the_dry_runs_counts(env) -> None:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By
    b = env["b"]
    req = {"name": "big", "vcpus": 40, "memory_mib": 1024, "image": "smoke"}
    b.driver.get(f"{env['url']}/ui/why")
    area = b.driver.find_element(By.ID, "why-body")
    area.clear()
    area.send_keys(json.dumps(req))
    b.driver.find_element(By.ID, "why-run").click()
    wait_for(lambda: b.driver.find_element(By.ID, "verdict"))
    want = env["api"].post("/v1/vms", params={"dry_run": "true"}, json=req,
                           headers={"Idempotency-Key": "why"}).json()
    shown = {td.get_attribute("data-resource"): int(td.text)
             for td in b.driver.find_elements(By.CSS_SELECTOR, "#rejections td[data-resource]")}
    assert shown == want["rejections"] and sum(shown.values()) > 0
    assert text(env, "#verdict").startswith("Fits" if not want["fits"] else f"Fits: {want['host']}")
    shot(env, "why")
    for page in ("hosts", "vms", "rollouts", "audit", "rollouts/conv-1"):
        b.driver.get(f"{env['url']}/ui/{page}")
        shot(env, page.replace("/", "-"))
    assert "Wave 1 of 2" in text(env, "#rollout-state")
    rows = [t.split() for t in texts(env, "#rollout-hosts tbody tr")]
    assert [(r[0], r[1]) for r in rows] == [("1", "oss-00000"), ("2", "oss-00001")]  # as the heading counts
    # the page follows the rollout (htmx, every 5 s): paused through the API, shown without a reload
    r = env["api"].post("/v1/rollouts/conv-1/pause", json={"expect": "running", "reason": "browser test"})
    assert r.status_code == 200, r.text
    wait_for(lambda: text(env, "#rollout-state").startswith("paused"), timeout_s=15)


def test_a_tenant_sees_only_its_vms_and_no_host(env) -> None:  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By
    b = env["b"]
    b.driver.get(f"{env['url']}/ui/fleet")
    # the fleet page can take seconds on a loaded CI machine: wait for its header
    wait_for(lambda: b.driver.find_element(By.CSS_SELECTOR, "header form.who button")).click()  # log out
    wait_for(lambda: b.driver.find_element(By.ID, "token"))
    login(b, env["url"], WEB, "/ui/vms")
    names = wait_for(lambda: [e.text for e in b.driver.find_elements(By.CSS_SELECTOR, "#vms td.vm-name")])
    assert names == ["web-a"]
    assert "tenant web" in text(env, "#who")
    b.driver.get(f"{env['url']}/ui/hosts/oss-00001")
    assert "hyb.auth.forbidden" in text(env, "#error")
    shot(env, "tenant-vms")


def test_dot_segments_are_refused_before_any_route(env) -> None:  # type: ignore[no-untyped-def]
    """Sent raw over TLS: a browser or an HTTP library would normalise them away."""
    host, port = env["url"].removeprefix("https://").split(":")
    ctx = env["sched"].verify
    for path in ("/ui/../v1/hosts", "/ui/static/../../scheduler.db", "/ui/./fleet"):
        with socket.create_connection((host, int(port)), timeout=10) as raw, \
                ctx.wrap_socket(raw, server_hostname=host) as tls:
            tls.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
            chunks = []
            while chunk := tls.recv(4096):
                chunks.append(chunk)
            head = b"".join(chunks).decode("latin-1")
        assert head.startswith("HTTP/1.1 400") and "hyb.request.bad_path" in head, (path, head[:300])


def test_no_page_has_anything_blocked_by_its_policy(env) -> None:  # type: ignore[no-untyped-def]
    """Each page under the Content-Security-Policy (no inline script): its charts drawn,
    their tooltips shown, its htmx requests made, nothing blocked; the drain button still
    asks first (data-confirm, wired by console.js)."""
    from selenium.webdriver.common.by import By
    b = env["b"]
    login(b, env["url"], ADMIN, "/ui/hosts")
    vm = env["api"].get("/v1/vms", params={"name": "web-a"}).json()["items"][0]["id"]
    for path in ("/ui/fleet?day=" + AFTER + "&compare=" + BEFORE, "/ui/hosts", "/ui/hosts/oss-00005", "/ui/vms",
                 f"/ui/vms/{vm}", "/ui/why", "/ui/rollouts", "/ui/rollouts/conv-1", "/ui/audit", "/ui/hosts/nope"):
        b.driver.get(env["url"] + path)
        wait_for(lambda: b.driver.execute_script("return document.readyState") == "complete")
        charts = b.driver.execute_script(
            "return [...document.querySelectorAll('.chart')].map(el => { const c = window.echarts &&"
            " echarts.getInstanceByDom(el); if (c) { c.dispatchAction({type: 'showTip', seriesIndex: 0, dataIndex: 3}); }"
            " return !!c; });")
        if path.startswith("/ui/fleet"):
            assert charts and all(charts), charts
            b.driver.find_element(By.CSS_SELECTOR, 'tr[data-bin="0"] a').click()  # an htmx request
            wait_for(lambda: b.driver.find_element(By.CSS_SELECTOR, "#bin-hosts table, #bin-hosts p"))
            # a bin that fails to load says why in its place (htmx swaps no 4xx by itself)
            b.driver.execute_script(f"htmx.ajax('GET', '/ui/fleet/bin?day={AFTER}&bin=abc', '#bin-hosts');")
            assert "[bin]" in wait_for(lambda: text(env, "#bin-hosts p.error"))
        assert blocked(env) == [], (path, blocked(env))
    b.driver.get(env["url"] + "/ui/hosts/oss-00005")
    b.driver.execute_script("window.confirm = m => { window.__asked = m; return false; };")
    b.driver.find_element(By.ID, "btn-drain").click()
    assert "Drain oss-00005" in b.driver.execute_script("return window.__asked;")
    assert env["api"].get("/v1/hosts/oss-00005").json()["admin_state"] == "active"  # declined: nothing sent
    assert blocked(env) == []


def test_a_rack_only_the_compare_day_has_is_in_the_chart(env) -> None:  # type: ignore[no-untyped-def]
    """Issue 40 A2: a rack whose one host sent only the compare day: the API answers it on
    that day, and the chart draws it, with the API's counts (read from ECharts' option)."""
    from selenium.webdriver.common.by import By
    from tools.dev.console_fleet import day_of
    from tools.dev.schedbench import SHAPES, register_body
    b = env["b"]
    with httpx.Client(base_url=env["url"], verify=env["sched"].verify, timeout=30,
                      headers={"Authorization": f"Bearer {HOST}"}) as c:
        assert c.post("/v1/hosts", json=register_body("gone-1", SHAPES[0], "r-gone")).status_code in (200, 201)
        assert c.post("/v1/hosts/gone-1/days", json={"days": [day_of(BEFORE, 48, 1.0, 0.0, 0.5)]}).status_code == 202
    q = {"day": AFTER, "compare": BEFORE, "group": "rack"}
    want = wait_for(lambda: (lambda u: u if "r-gone" in u["compare"]["groups"] else None)(
        env["api"].get("/v1/fleet/utilization", params=q).json()))
    assert "r-gone" not in want["day"]["groups"]
    login(b, env["url"], ADMIN, f"/ui/fleet?day={AFTER}&compare={BEFORE}&group=rack")
    wait_for(lambda: b.driver.find_element(By.ID, "hist"))
    got = dict(wait_for(lambda: b.driver.execute_script(
        "const c = echarts.getInstanceByDom(document.getElementById('hist'));"
        "return c && c.getOption().series.map(s => [s.name, s.data]);")))
    racks = sorted(set(want["day"]["groups"]) | set(want["compare"]["groups"]))
    assert len(got) == 2 * len(racks), sorted(got)
    for key in ("day", "compare"):
        d = want[key]
        for g in racks:
            assert got[f"{g} {d['day']}"] == [bin_["counts"].get(g, 0) for bin_ in d["bins"]], (key, g)
    assert sum(got[f"r-gone {BEFORE}"]) == 1 and sum(got[f"r-gone {AFTER}"]) == 0


def test_the_carve_picture_shows_the_apis_owners(env) -> None:  # type: ignore[no-untyped-def]
    """Each CPU box of a host page names the owner the API gives: the layout's IO and host
    CPUs, each VM's placement (its name on hover), the rest of the VM CPUs free. A real
    (simulated-tree) hostd carves the host and runs its VMs; last but one in the module:
    the tests before count the fleet without it."""
    from selenium.webdriver.common.by import By
    from tools.dev.fleetsim import SimFleet
    b, api = env["b"], env["api"]
    f = SimFleet(env["dir"] / "sim", 1, 1, scheduler_url=env["url"], host_token=HOST, admin_token=ADMIN,
                 certs=env["certs"], prefix="con", labels=lambda i, n: {"pic": "yes"})
    try:
        f.start(timeout_s=180)
        ids = []
        for i in range(2):
            r = api.post("/v1/vms", json={"name": f"pic-{i}", "vcpus": 1 + i, "memory_mib": 128, "image": "smoke",
                                          "tenant": "db", "host_labels": {"pic": "yes"}},
                         headers={"Idempotency-Key": f"pic-{i}"})
            assert r.status_code == 202, r.text
            ids.append(r.json()["id"])
        placed = wait_for(lambda: all(api.get(f"/v1/vms/{i}").json()["status"] == "running" for i in ids)
                          and [api.get(f"/v1/vms/{i}").json() for i in ids], timeout_s=90)
        carve_picture_is_the_apis(env, placed[0]["host"])
    finally:
        f.stop()


def carve_picture_is_the_apis(env: dict, name: str) -> None:
    from selenium.webdriver.common.by import By
    b, api = env["b"], env["api"]
    h = api.get(f"/v1/hosts/{name}").json()
    on_it = [v for v in api.get("/v1/vms", params={"host": name}).json()["items"] if v["placement"]]
    want: dict[str, str] = {}
    for n in h["nodes"]:
        want |= {str(c): "io" for c in n["io_cpus"]} | {str(c): "host" for c in n["host_cpus"]}
        want |= {str(c): "free" for c in n["vm_cpus"]}
    for v in on_it:
        want |= {str(c): f"vm:{v['id']}" for c in v["placement"]["cpus"]}
    assert "io" in want.values() and any(o.startswith("vm:") for o in want.values())
    login(b, env["url"], ADMIN, f"/ui/hosts/{name}")
    boxes = wait_for(lambda: b.driver.find_elements(By.CSS_SELECTOR, "#carve-picture .cpu[data-cpu]"))
    got = {e.get_attribute("data-cpu"): e.get_attribute("data-owner") for e in boxes}
    assert got == want
    v = on_it[0]
    c = v["placement"]["cpus"][0]
    box = b.driver.find_element(By.CSS_SELECTOR, f'#carve-picture .cpu[data-cpu="{c}"]')
    assert box.get_attribute("title") == f"CPU {c}: {v['name']} vCPU 0"
    # boxes of different owners look different (drawn, not only labelled)
    colour = {o: b.driver.execute_script("return getComputedStyle(arguments[0]).backgroundColor;", e)
              for e in boxes for o in [e.get_attribute("data-owner")]}
    assert colour["io"] != colour[f"vm:{v['id']}"] and (("free" not in colour) or colour["free"] != colour["io"])
    shot(env, "host-carve")
    # the VM's page: its pinning, vCPU by vCPU
    b.driver.get(f"{env['url']}/ui/vms/{v['id']}")
    pins = wait_for(lambda: b.driver.find_elements(By.CSS_SELECTOR, "#vm-pinning tbody tr"))
    assert [int(r.find_element(By.CSS_SELECTOR, "td[data-cpu]").text) for r in pins] == v["placement"]["cpus"]


def test_no_browser_process_is_left(env) -> None:  # type: ignore[no-untyped-def]
    b = env["b"]
    assert b.pids()  # alive while the module runs: the check below can fail
    b.quit()
    assert b.pids() == []
