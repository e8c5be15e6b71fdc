"""The benches run end to end in tiny configurations and find no overcommit:
bench/placement.py (SQLite, two replicas, through the API), bench/packing.py, and the
OpenStack Placement baseline; the real numbers are in scheduler/README.md."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.xdist_group("sched-bench")]  # own servers on loopback: not the machine group

REPO = Path(__file__).resolve().parents[2]


def test_placement_bench_tiny():
    out = subprocess.run([sys.executable, str(REPO / "bench/placement.py"), "--hosts", "20", "--requests", "60",
                          "--clients", "4", "--stores", "sqlite", "--no-openstack"],
                         capture_output=True, text=True, timeout=240, cwd=REPO)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    row = next(ln for ln in out.stdout.splitlines() if ln.startswith("hybrid-kvm sqlite"))
    assert row.rstrip().endswith("none"), row  # overcommit column
    assert "offline FFD places" in out.stdout
    # the claim thread is found by its OS thread name (hyb-claims) and did the claiming
    cpu = next(ln for ln in out.stdout.splitlines() if "server CPU per request" in ln)
    claim = float(cpu.split("claim thread ")[1].split(",")[0])
    assert claim > 0, cpu
    busy = next(ln for ln in out.stdout.splitlines() if "machine while it ran" in ln)
    assert 0 < float(busy.split(": ")[1].split(" of")[0]) <= (os.cpu_count() or 1), busy


def test_packing_bench_tiny():
    """bench/packing.py places each mix through the real index and checks the ledger.
    On the storage mix the first 507 is the class ceiling (a 16-core-only class runs
    out), so quality equals the ceiling there; on the matched mixes nothing runs out
    before the fleet fills (ceiling 1.0)."""
    out = subprocess.run([sys.executable, str(REPO / "bench/packing.py"), "--hosts", "200", "--requests", "400"],
                         capture_output=True, text=True, timeout=240, cwd=REPO)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    rows = {ln.split()[0]: ln.split() for ln in out.stdout.splitlines()
            if ln.split() and ln.split()[0] in ("storage", "matched", "matched-heavy")}
    assert set(rows) == {"storage", "matched", "matched-heavy"}, out.stdout
    for mix, (_m, ffd, ceiling, ours, total, quality, _of, _ms, no_hint, *_rest) in rows.items():
        assert 0 < int(ours) <= int(total) <= 400, (mix, rows[mix])
        assert abs(float(quality) - int(ours) / int(ffd)) < 0.001, (mix, rows[mix])
        assert float(quality) >= float(no_hint), (mix, rows[mix])
    assert rows["storage"][2] == rows["storage"][5], rows["storage"]  # quality == ceiling
    assert rows["storage"][-1] != "none" and float(rows["storage"][2]) < 0.8, rows["storage"]
    assert float(rows["matched"][2]) == 1.0, rows["matched"]
    # the 1 GiB demand hint: best fit on CPUs alone lets 2 MiB VMs break the 1 GiB nodes
    assert float(rows["matched-heavy"][5]) == 1.0 > float(rows["matched-heavy"][8]), rows["matched-heavy"]
    assert "overcommit: none" in out.stdout


@pytest.mark.slow
@pytest.mark.integration
def test_openstack_placement_baseline_books_no_overcommit(pg_server: str, tmp_path: Path) -> None:
    """The bench's OpenStack Placement driver (bench/scheduler_osplacement.py) against a
    real Placement (PyPI openstack-placement in its own venv, installed on first use) on
    a real PostgreSQL: 40 hosts (90 providers), 32 concurrent clients, more requests than
    fit. With the bench's allocation_conflict_retry_count = 1 nothing is booked over a
    provider's inventory and Placement never logs its "reduces existing overage" pass.
    With Placement's default (10) this same run overcommits (its in-transaction retry
    counts the failed attempt's own rows as existing usage: scheduler/README.md)."""
    from tools.dev.schedbench import create_database, fleet, trace
    from scheduler_osplacement import run_placement

    port = int(pg_server.rsplit(":", 1)[1])
    create_database(port, "placement")
    r = run_placement("pg", port, fleet(40), trace(150), clients=32, workers=2,
                      venv=Path("/var/cache/hybrid-kvm/placement-venv"), tmp=tmp_path, conflict_retries=1)
    assert not r.note and not r.errors, (r.note, r.errors)
    assert r.placed > 40 and r.rejected > 0, (r.placed, r.rejected)  # the fleet filled up
    assert r.overcommit == [], r.overcommit[:10]
    assert "reduces existing overage" not in (tmp_path / "placement-pg.log").read_text()
