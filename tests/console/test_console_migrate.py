"""The console's live moves (issue 38, item 5): the VM page's Migrate button and the VM
and host pages' progress, against a real scheduler (SQLite, its drain loop and migration
service) and three real hostd gRPC servers in-process, each on its own libvirt test
driver (tests/scheduler/drain_fleet.py ``private_fleet``; only libvirt's job is played).
The button is offered to who may move VMs (an admin) on a running VM, goes through the
console's origin and CSRF checks, then the API's own path (``MigrationService.ask``): the
same refusals, naming the field, and nothing changes when refused."""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scheduler"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from drain_fleet import Fleet, certs, create, private_fleet, wait  # noqa: E402,F401 - fixtures
from sched_helpers import ADM  # noqa: E402
from test_console_security import login  # noqa: E402

DISK = {"disks": [{"class": "nvme", "iotune": {"total_bytes_sec": 10**8, "total_iops_sec": 1000}}]}
STATS = {"time_elapsed": 2500, "memory_remaining": 64 << 20, "disk_remaining": 3 << 29, "memory_bps": 100 << 20,
         "downtime": 40}


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/sched.db"


def moves(api, vm_id: str) -> list[dict]:  # type: ignore[no-untyped-def]
    return [a for a in api.get("/v1/audit", headers=ADM).json()["items"]
            if a["action"] == "vm.migrate" and a["target"] == vm_id]


def cell(page: str, el: str) -> str:
    got = re.search(rf'id="{el}">(.*?)</td>', page, re.S)
    return got.group(1) if got else ""


def test_the_migrate_button_moves_a_vm_and_the_pages_show_its_progress(private_fleet: Fleet) -> None:
    f = private_fleet
    with f.scheduler(register=True, migration={"progress_s": 0.05}) as api:
        a = create(api, "app-1", **DISK)
        assert api.post("/v1/hosts/h3/cordon", json={"reason": "x"}, headers=ADM).status_code == 200
        b, csrf = login(api, "adm")
        page = b.get(f"/ui/vms/{a}").text
        form = re.search(r'<form method="post" action="/ui/vms/([^"]+)/migrate".*?</form>', page, re.S)
        assert form and form.group(1) == a, page
        assert re.findall(r'<option value="([^"]*)">', form.group(0)) == ["", "h2"]  # active, not its own host
        assert "data-confirm=" in form.group(0) and "<script" not in form.group(0)
        assert 'hx-get="/ui/live/vms/' in page and 'id="vm-move"' not in page

        # a tenant is offered no button, and its POST is refused as the API refuses it
        t, tcsrf = login(api, "ta")
        assert 'id="form-migrate"' not in t.get(f"/ui/vms/{a}").text
        r = t.post(f"/ui/vms/{a}/migrate", data={"csrf": tcsrf, "target_host": "h2"})
        assert r.status_code == 403 and "hyb.auth.forbidden" in r.text, r.text[:300]
        # no CSRF token, a forged one, another origin: refused naming what, nothing moves
        for data, headers, field in (({"target_host": "h2"}, {}, "csrf"),
                                     ({"csrf": "forged", "target_host": "h2"}, {}, "csrf"),
                                     ({"csrf": csrf, "target_host": "h2"}, {"Origin": "https://evil.example"},
                                      "Origin")):
            r = b.post(f"/ui/vms/{a}/migrate", data=data, headers=headers)
            assert r.status_code == 403 and f"[{field}]" in r.text, r.text[:300]
        # bad targets: the API's refusals, each naming the field
        for target, status, text in (("h9", 422, "no host named"), ("h3", 409, "h3 is cordoned"),
                                     ("h1", 409, "runs on h1 already"), ("x" * 65, 422, "")):
            r = b.post(f"/ui/vms/{a}/migrate", data={"csrf": csrf, "target_host": target})
            assert r.status_code == status and "[target_host]" in r.text and text in r.text, (target, r.text[:400])
        assert moves(api, a) == [] and api.get(f"/v1/vms/{a}", headers=ADM).json()["migration"] is None

        # the move, held in the source's job: the pages show its progress
        src = f.hostds["h1"].migrations
        src.gate, src.stats = threading.Event(), dict(STATS)
        try:
            r = b.post(f"/ui/vms/{a}/migrate", data={"csrf": csrf, "target_host": "h2"})
            assert r.status_code == 303 and r.headers["location"] == f"/ui/vms/{a}", r.text[:300]
            assert src.waiting.wait(10)
            wait(lambda: api.get(f"/v1/vms/{a}", headers=ADM).json()["migration"]["progress"], "a sample")
            live = b.get(f"/ui/live/vms/{a}", headers={"HX-Request": "true"}).text
            assert "<!doctype" not in live.lower() and 'hx-trigger="every 3s, refresh"' in live.split(">", 1)[0]
            move = cell(live, "vm-move")
            assert move.startswith("to h2: ") and 'data-phase="disks"' in move, move
            assert "64 MiB memory and 1.5 GiB disk left" in move and "100 MiB/s" in move and "40 ms" in move, move
            assert cell(b.get(f"/ui/vms/{a}").text, "vm-move") == move  # the page carries the same part
            for host in ("h1", "h2"):  # the source's and the target's host page
                h = b.get(f"/ui/live/hosts/{host}").text
                row = re.search(rf'<tr data-vm="{a}">(.*?)</tr>', h, re.S)
                assert 'id="host-moves"' in h and row and "1.5 GiB disk left" in row.group(1), (host, h[:600])
            [started] = moves(api, a)
            assert started["principal"] == "adm" and started["detail"]["to"] == "h2"
        finally:
            src.gate.set()
        got = wait(lambda: (v := api.get(f"/v1/vms/{a}", headers=ADM).json())["migration"] is None and v,
                   "the move to end")
        assert got["host"] == "h2"
        live = b.get(f"/ui/live/vms/{a}").text
        assert 'id="vm-move"' not in live and cell(live, "vm-host") == "h2"
        last = cell(live, "vm-last-move")
        assert "h1 &rarr; h2" in last and ">done</span>" in last and "downtime 3 ms" in last, last
        assert 'id="host-moves"' not in b.get("/ui/live/hosts/h1").text
        # on the target now: its picker offers the source back
        page = b.get(f"/ui/vms/{a}").text
        assert re.findall(r'<option value="([^"]*)">', page) == ["", "h1"]
