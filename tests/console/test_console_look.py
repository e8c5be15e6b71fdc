"""Issue 40, the console's look, through the app's HTTP interface (real scheduler app,
SQLite): policies by name with the digest on hover, counts with separators, states in
colour with a legend, the audit's detail as a table with one-line times, waves numbered
as the heading counts them, no empty chart box or header-only table on a host page, a
bin's list headed by what it shows. What the browser draws (legends, the heatmap's days
without data, the compare day's lines) is in test_console_browser.py."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scheduler"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from sched_helpers import ADM, HOST, Clock, host_body, make_client  # noqa: E402
from test_console_security import T0, login  # noqa: E402

DIGEST = "ab" * 32
OTHER = "cd" * 32


@pytest.fixture
def app(tmp_path: Path):  # type: ignore[no-untyped-def]
    with make_client(f"sqlite:///{tmp_path}/sched.db", clock=Clock(T0)) as api:
        for name, policy in (("h1", DIGEST), ("h2", OTHER), ("h3", None)):
            body = host_body(name, rack="r1") | ({"carved_policy": policy} if policy else {})
            assert api.post("/v1/hosts", json=body, headers=HOST).status_code == 201
        r = api.post("/v1/rollouts", headers=ADM, json={
            "name": "conv-1", "kind": "convert", "policy_digest": DIGEST,
            "spec": {"name": "conv-1", "policy": "policies/storage-v2.toml"},
            "waves": [[{"name": h, "address": f"{h}:7443", "rack": "r1", "host": {"name": h}}] for h in ("h1", "h2")]})
        assert r.status_code == 201, r.text
        yield api


def cell(page: str, id_: str) -> str:
    return re.search(rf'id="{id_}"[^>]*>(.*?)</td>', page, re.S).group(1)


def test_a_policy_is_shown_by_its_name_with_its_digest_on_hover(app) -> None:  # type: ignore[no-untyped-def]
    b, _ = login(app, "adm")
    named = f'<abbr class="policy" title="sha256 {DIGEST}">storage-v2</abbr>'
    assert named in cell(b.get("/ui/hosts/h1").text, "host-policy")
    assert f'<abbr class="policy" title="sha256 {OTHER}">{OTHER[:12]}</abbr>' in cell(b.get("/ui/hosts/h2").text,
                                                                                     "host-policy")
    assert cell(b.get("/ui/hosts/h3").text, "host-policy").strip() == "-"
    for page in (b.get("/ui/hosts").text, b.get("/ui/rollouts").text, b.get("/ui/rollouts/conv-1").text):
        assert named in page and DIGEST not in page.replace(f"sha256 {DIGEST}", "")
    fleet = b.get("/ui/fleet", params={"day": "2025-11-25", "group": "policy"}).text
    assert '"labels"' in fleet  # the chart's names for the groups (empty here: no days sent)


def test_states_are_coloured_with_a_legend(app) -> None:  # type: ignore[no-untyped-def]
    assert app.post("/v1/hosts/h2/cordon", json={"reason": "disk swap"}, headers=ADM).status_code == 200
    b, _ = login(app, "adm")
    page = b.get("/ui/hosts").text
    for name, tone in (("h1", "ok"), ("h2", "held")):
        row = re.search(rf'<a href="/ui/hosts/{name}">{name}</a>.*?</tr>', page, re.S).group(0)
        assert f'class="st st-{tone}"' in row, row
    assert 'id="tones"' in page and "st-bad" in page  # the legend names every colour
    host = b.get("/ui/hosts/h2").text
    assert '<span class="st st-held">cordoned</span>' in cell(host, "host-admin")


def test_the_audit_is_a_table_with_one_line_times(app) -> None:  # type: ignore[no-untyped-def]
    assert app.post("/v1/hosts/h1/cordon", json={"reason": "disk swap"}, headers=ADM).status_code == 200
    b, _ = login(app, "adm")
    for page, table in ((b.get("/ui/audit").text, "audit"), (b.get("/ui/hosts/h1").text, "host-history")):
        body = re.search(rf'<table id="{table}">.*?</table>\s*(?=<p|</section>|{{)', page, re.S) or \
            re.search(rf'<table id="{table}">.*', page, re.S)
        text = body.group(0)
        assert "<th>reason</th><td>disk swap</td>" in text, text[:800]
        assert '{"' not in text and "&#34;reason&#34;" not in text  # no raw JSON
        assert re.search(r'<td class="when">\d{4}-\d\d-\d\d \d\d:\d\d:\d\d</td>', text)


def test_counts_have_separators(app) -> None:  # type: ignore[no-untyped-def]
    from scheduler.console.look import num
    assert (num(168000000), num(999), num(1000), num(12.5), num(3.0), num(None)) == \
        ("168,000,000", "999", "1,000", "12.50", "3", "-")
    b, _ = login(app, "adm")
    want = app.get("/v1/fleet/hosts", headers=ADM).json()
    page = b.get("/ui/fleet", params={"day": "2025-11-25"}).text
    row = re.search(r"<th>CPUs \(dedicated\)</th>(.*?)</tr>", page).group(1)
    assert f'<td class="n">{want["cpus_free"]:,}</td><td class="n">{want["cpus_total"]:,}</td>' == row


def test_waves_are_numbered_as_the_heading_counts_them(app) -> None:  # type: ignore[no-untyped-def]
    b, _ = login(app, "adm")
    page = b.get("/ui/rollouts/conv-1").text
    assert "Wave 1 of 2" in page
    waves = re.findall(r'<tr><td class="n">(\d+)</td><td>(h\d)</td>', page)
    assert waves == [("1", "h1"), ("2", "h2")], waves
    assert re.findall(r"<div>wave (\d+):", b.get("/ui/rollouts").text) == ["1", "2"]


def test_a_host_page_has_no_empty_boxes(app) -> None:  # type: ignore[no-untyped-def]
    b, _ = login(app, "adm")
    page = b.get("/ui/hosts/h3").text  # no VMs, no stats
    assert 'id="health"' not in page and "No stats buckets" in page
    assert 'id="host-vms"' not in page and 'id="host-vms-none"' in page
    assert 'id="host-history"' in page and "host.register" in page  # its registration


def test_a_bins_list_is_headed_by_what_it_shows(app) -> None:  # type: ignore[no-untyped-def]
    b, _ = login(app, "adm")
    vms = b.get("/ui/fleet/bin", params={"day": "2025-11-25", "bin": 3, "cls": "vms"}).text
    assert "vms's share of the CPUs" in vms and "CPU use" not in vms
    whole = b.get("/ui/fleet/bin", params={"day": "2025-11-25", "bin": 3}).text
    assert "CPU use (whole host)" in whole
