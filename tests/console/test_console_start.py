"""The console's Start button: a VM a drain stopped (``on_maintenance = "stop"``) starts
again from its page, against a real scheduler (SQLite, its drain loop) and three real
hostd gRPC servers in-process (tests/scheduler/drain_fleet.py ``fleet``). The button is
offered on a stopped VM to who sees it (its tenant, an admin), goes through the
console's origin and CSRF checks, then the API's own start (``VmService.start``): the
same refusals, and nothing changes when refused."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scheduler"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from drain_fleet import certs, create, fleet, wait  # noqa: E402,F401 - fixtures
from sched_helpers import ADM, TA  # noqa: E402
from test_console_security import login  # noqa: E402


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/sched.db"


def test_the_start_button_starts_a_vm_the_drain_stopped(fleet) -> None:  # type: ignore[no-untyped-def]
    api, managers = fleet
    a = create(api, "batch-1", on_maintenance="stop")
    t, tcsrf = login(api, "ta")
    assert 'id="form-start"' not in t.get(f"/ui/vms/{a}").text  # running: nothing to start
    assert api.post("/v1/hosts/h1/drain", json={"reason": "disk swap"}, headers=ADM).status_code == 200
    wait(lambda: api.get(f"/v1/vms/{a}", headers=TA).json()["status"] == "stopped", "the drain's stop")

    page = t.get(f"/ui/vms/{a}").text
    form = re.search(r'<form method="post" action="/ui/vms/([^"]+)/start".*?</form>', page, re.S)
    assert form and form.group(1) == a and "data-confirm=" in form.group(0), page
    # no CSRF token, a forged one, another origin: refused naming what, nothing starts
    for data, headers, field in (({}, {}, "csrf"), ({"csrf": "forged"}, {}, "csrf"),
                                 ({"csrf": tcsrf}, {"Origin": "https://evil.example"}, "Origin")):
        r = t.post(f"/ui/vms/{a}/start", data=data, headers=headers)
        assert r.status_code == 403 and f"[{field}]" in r.text, r.text[:300]
    # another tenant: not found, as the API answers
    o, ocsrf = login(api, "tb")
    r = o.post(f"/ui/vms/{a}/start", data={"csrf": ocsrf})
    assert r.status_code == 404 and "hyb.vm.not_found" in r.text, r.text[:300]
    assert api.get(f"/v1/vms/{a}", headers=TA).json()["status"] == "stopped"

    r = t.post(f"/ui/vms/{a}/start", data={"csrf": tcsrf}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == f"/ui/vms/{a}", r.text[:300]
    vm = wait(lambda: (v := api.get(f"/v1/vms/{a}", headers=TA).json())["status"] == "running" and v,
              "the started VM to run")
    assert vm["host"] in ("h2", "h3")
    assert [v.state for v in managers[vm["host"]].list() if v.name.startswith("batch-1")] == ["running"]
    assert 'id="form-start"' not in t.get(f"/ui/vms/{a}").text
