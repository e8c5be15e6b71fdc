"""The console's live fragments and its carve picture, against the real scheduler app
(SQLite store, migrated) through its HTTP interface: each fragment answers only its part
(no page around it), polls itself every few seconds, shows a change made through the API
and is refused exactly as its page is; the host page's CPU boxes name the owners the API
gives (the layout's IO and host CPUs, each VM's placement), and a VM page its pinning."""

from __future__ import annotations

import html
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scheduler"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sched_helpers import ADM, HOST, TA, Clock, host_body, make_client, vm_body  # noqa: E402
from test_console_security import login  # noqa: E402

T0 = 1_764_100_000.0
FRAGMENTS = ("/ui/live/hosts/h1", "/ui/live/hosts?rack=r1", "/ui/live/fleet")


@pytest.fixture
def app(tmp_path: Path):  # type: ignore[no-untyped-def]
    with make_client(f"sqlite:///{tmp_path}/sched.db", clock=Clock(T0)) as api:
        assert api.post("/v1/hosts", json=host_body("h1", rack="r1"), headers=HOST).status_code == 201
        yield api


def test_each_fragment_is_only_its_part_and_polls_itself(app) -> None:  # type: ignore[no-untyped-def]
    b, _ = login(app, "adm")
    for url in FRAGMENTS:
        r = b.get(url, headers={"HX-Request": "true"})
        assert r.status_code == 200, (url, r.text[:300])
        assert "<!doctype" not in r.text.lower() and "<header>" not in r.text, url
        own = r.text.split(">", 1)[0]  # the fragment's own element carries the poll
        assert "data-live" in own and 'hx-trigger="every 3s, refresh"' in own and 'hx-swap="outerHTML"' in own, own
    # a page carries the same element, so the poll replaces it in place
    for page, el in (("/ui/hosts/h1", 'id="host-live"'), ("/ui/hosts?rack=r1", 'id="hosts-rows"'),
                     ("/ui/fleet?day=2025-11-25", 'id="fleet-live"')):
        assert el in b.get(page).text, page


def test_a_cordon_through_the_api_shows_in_the_fragments(app) -> None:  # type: ignore[no-untyped-def]
    b, _ = login(app, "adm")
    assert "cordoned" not in b.get("/ui/live/hosts/h1").text
    r = app.post("/v1/hosts/h1/cordon", json={"reason": "dimm B3"}, headers=ADM)
    assert r.status_code == 200, r.text
    live = b.get("/ui/live/hosts/h1").text
    admin = re.search(r'id="host-admin">(.*?)</td>', live, re.S).group(1)
    assert '<span class="st st-held">cordoned</span>' in admin and "dimm B3" in admin
    assert '<span class="st st-held">cordoned</span>' in b.get("/ui/live/hosts").text
    counts = b.get("/ui/live/fleet").text
    want = app.get("/v1/fleet/hosts", headers=ADM).json()["classes"]
    got = {k: int(v.replace(",", "")) for k, v in re.findall(r'data-class="([^"]+)">([^<]+)<', counts)}
    assert got == want and got["cordoned"] == 1, (got, want)


def test_a_drain_shows_its_plan_in_the_host_fragment(app) -> None:  # type: ignore[no-untyped-def]
    b, _ = login(app, "adm")
    vm = app.post("/v1/vms", json=vm_body(name="web-1"), headers={**TA, "Idempotency-Key": "k1"}).json()
    assert 'id="host-drain"' not in b.get("/ui/live/hosts/h1").text
    assert app.post("/v1/hosts/h1/drain", json={"reason": "kernel"}, headers=ADM).status_code == 200
    live = b.get("/ui/live/hosts/h1").text
    want = app.get("/v1/hosts/h1/drain", headers=ADM).json()
    drain = re.search(r'<section id="host-drain">(.*?)</section>', live, re.S).group(1)
    assert f"{want['left']} VMs left" in drain and vm["id"] in drain


def test_a_fragment_is_refused_as_its_page_is(app) -> None:  # type: ignore[no-untyped-def]
    b, _ = login(app, "ta")  # a tenant: no hosts, no fleet
    for url in FRAGMENTS:
        r = b.get(url, headers={"HX-Request": "true"})
        assert r.status_code == 403, (url, r.status_code)
        assert "<!doctype" not in r.text.lower() and "hyb.auth" in r.text, (url, r.text[:300])
    anon = app.__class__(app.app, base_url="https://testserver", follow_redirects=False)
    r = anon.get("/ui/live/hosts/h1", headers={"HX-Request": "true"})
    assert r.status_code == 401 and r.headers["hx-redirect"] == "/ui/login"
    b, _ = login(app, "adm")
    r = b.get("/ui/live/hosts/nope", headers={"HX-Request": "true"})
    assert r.status_code == 404 and "<!doctype" not in r.text.lower()


def owners(page: str) -> dict[int, str]:
    return {int(c): html.unescape(o) for c, o in re.findall(r'class="cpu cpu-[a-z]+" data-cpu="(\d+)" data-owner="([^"]+)"',
                                                             page)}


def test_the_carve_picture_names_each_cpus_owner_as_the_api_does(app) -> None:  # type: ignore[no-untyped-def]
    b, _ = login(app, "adm")
    ids = []
    for i, n in enumerate((2, 3)):
        r = app.post("/v1/vms", json=vm_body(name=f"web-{i}", vcpus=n), headers={**TA, "Idempotency-Key": f"k{i}"})
        assert r.status_code == 202, r.text
        ids.append(r.json()["id"])
    h = app.get("/v1/hosts/h1", headers=ADM).json()
    vms = [app.get(f"/v1/vms/{i}", headers=ADM).json() for i in ids]
    want: dict[int, str] = {}
    for n in h["nodes"]:
        assert n["io_cpus"], "the test shape has IO CPUs on every node"
        want |= {c: "io" for c in n["io_cpus"]} | {c: "host" for c in n["host_cpus"]}
        want |= {c: "free" for c in n["vm_cpus"]}
    for v in vms:
        assert v["placement"], v
        want |= {c: f"vm:{v['id']}" for c in v["placement"]["cpus"]}
    page = b.get("/ui/hosts/h1").text
    assert owners(page) == want
    # a VM's box names it on hover; each node's pages and VFs in use as the API counts them
    c0 = vms[0]["placement"]["cpus"][1]
    assert re.search(rf'data-cpu="{c0}" data-owner="vm:{vms[0]["id"]}" title="CPU {c0}: web-0 vCPU 1"', page)
    for n in h["nodes"]:
        block = re.search(rf'<div class="numa" data-node="{n["node"]}">(.*?)</div>\s*(?:<div class="numa"|</div>)',
                          page, re.S).group(1)
        for p in n["hugepages"]:
            assert f'{p["size_kb"]:,} KiB pages: {p["used"]:,} / {p["total"]:,} used' in block, block
        for p in h["pfs"]:
            if p["node"] == n["node"]:
                assert f'{p["name"]}: {p["vfs_used"]} / {p["vfs_total"]} VFs in use' in block
    # a tenant sees no host page, so no picture
    t, _ = login(app, "ta")
    assert t.get("/ui/hosts/h1").status_code == 403


def test_a_vm_page_shows_its_pinning_and_throttles(app) -> None:  # type: ignore[no-untyped-def]
    b, _ = login(app, "adm")
    r = app.post("/v1/vms", json=vm_body(name="web-1", vcpus=3), headers={**TA, "Idempotency-Key": "k1"})
    v = app.get(f"/v1/vms/{r.json()['id']}", headers=ADM).json()
    page = b.get(f"/ui/vms/{v['id']}").text
    pins = re.findall(r'<tr data-vcpu="(\d+)"><td>\d+</td><td class="n" data-cpu="(\d+)">', page)
    assert [(int(i), int(c)) for i, c in pins] == list(enumerate(v["placement"]["cpus"]))
    assert 'id="vm-throttles"' in page
    for d in v["placement"]["disks"]:
        assert f'data-disk="{d["name"]}"' in page


def test_viewers_share_a_fleet_wide_read_and_not_the_rules(app, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from scheduler.console import routes
    one, _ = login(app, "adm")
    two, _ = login(app, "adm")
    svc = app.app.state.hosts
    calls: list[str] = []
    real_summary, real_list = svc.summary, svc.list
    monkeypatch.setattr(svc, "summary", lambda: calls.append("summary") or real_summary())
    monkeypatch.setattr(svc, "list", lambda **kw: calls.append("list") or real_list(**kw))
    for c in (one, two, one):
        assert c.get("/ui/live/fleet").status_code == 200
        assert c.get("/ui/live/hosts").status_code == 200
    assert calls == ["summary", "list"]  # three viewers' polls within LIVE_TTL_S: one read each
    assert one.get("/ui/live/hosts?rack=r1").status_code == 200 and calls[-1] == "list"  # another page: its own read
    t, _ = login(app, "ta")
    assert t.get("/ui/live/fleet").status_code == 403 and t.get("/ui/live/hosts").status_code == 403
    monkeypatch.setattr(routes, "LIVE_TTL_S", 0.0)
    assert one.get("/ui/live/fleet").status_code == 200 and calls.count("summary") == 2


def test_the_api_names_each_nodes_io_and_host_cpus_from_the_layout(app) -> None:  # type: ignore[no-untyped-def]
    body = host_body("h2")
    assert app.post("/v1/hosts", json=body, headers=HOST).status_code == 201
    want = {n["node"]: (sorted(n["io_cpus"]), sorted(n["host_cpus"])) for n in body["layout"]["nodes"]}
    assert any(io for io, _ in want.values())
    for h in (app.get("/v1/hosts/h2", headers=ADM).json(),
              next(x for x in app.get("/v1/hosts", headers=ADM).json()["items"] if x["name"] == "h2")):
        assert {n["node"]: (n["io_cpus"], n["host_cpus"]) for n in h["nodes"]} == want
