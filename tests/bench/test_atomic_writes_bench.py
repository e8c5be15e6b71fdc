"""bench/atomic_writes.py: its parsing and accounting on recorded output (a --short run on
this machine, tests/data/bench/atomic_writes/), and the --short run itself (~25 s: the
mechanism, not the numbers): a real mariadbd on a loop device, doublewrite ON writes
doublewrite pages and more bytes per transaction than OFF, which writes none, and nothing
is left behind. The short run is skipped, naming what is missing, where MariaDB or sysbench
is not installed (tools/dev/install-bench-db.sh installs them; `make test` never does)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from benchrun import bench_json

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests/data/bench/atomic_writes"
_spec = importlib.util.spec_from_file_location("hyb_bench_atomic_writes", REPO / "bench/atomic_writes.py")
aw = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(aw)  # type: ignore[union-attr]


def recorded(mode: str) -> dict:
    out = aw.parse_sysbench((DATA / f"round1-{mode}.sysbench.txt").read_text())
    before, after = (DATA / f"round1-{mode}.stat.txt").read_text().splitlines()
    return {"mode": mode, **out, **aw.per_trx(aw.parse_disk_stat(before), aw.parse_disk_stat(after),
                                             out["transactions"]), "dblwr_pages": 0.0}


def test_sysbench_summary_is_parsed():
    r = aw.parse_sysbench((DATA / "round1-ON.sysbench.txt").read_text())
    assert r == {"transactions": 5110.0, "tps": 637.74, "p95_ms": 11.65, "errors": 0.0}


def test_a_summary_without_the_numbers_is_refused_naming_what_is_missing():
    with pytest.raises(ValueError, match="95th percentile"):
        aw.parse_sysbench("    transactions:   10   (1.00 per sec.)\n    ignored errors: 0\n")


def test_device_bytes_per_transaction_from_the_stat_snapshots():
    on = recorded("ON")
    # write sectors 17766563 -> 20469509 over 5110 transactions, 512-byte sectors
    assert on["write_bytes"] == (20469509 - 17766563) * 512
    assert on["write_bytes_per_trx"] == pytest.approx(on["write_bytes"] / 5110)
    assert on["write_ios_per_trx"] == pytest.approx((509782 - 452119) / 5110)  # field 5, write IOs
    with pytest.raises(ValueError):
        aw.per_trx(aw.parse_disk_stat("1 2 3 4 5 6 7 8 9 10 11"), aw.parse_disk_stat("1 2 3 4 5 6 7 8 9 10 11"), 0)
    with pytest.raises(ValueError, match="block stat"):
        aw.parse_disk_stat("1 2 3")


def test_summary_and_report_put_off_against_on_beside_the_published_numbers():
    runs = [recorded("ON"), recorded("OFF"), {**recorded("ON"), "tps": 1000.0}]
    s = aw.summarize(runs)
    assert s["ON"]["tps"] == pytest.approx((637.74 + 1000.0) / 2)  # median of two
    lines = aw.report_lines(s, "recorded")
    tps = next(ln for ln in lines if ln.startswith("TPS"))
    assert f"{aw.change_pct(s['ON']['tps'], s['OFF']['tps']):+.1f}%" in tps and tps.endswith("+28 %")
    wb = next(ln for ln in lines if ln.startswith("write bytes/trx"))
    assert wb.endswith("-53 %") and "-54.7%" in wb  # 122696 vs 270824 B/trx in the recorded run


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.integration
@pytest.mark.timeout(240)
def test_short_run_on_a_real_mariadb(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root (loop device, mount)")
    if os.environ.get("HYB_BENCH_DB") != "1":
        pytest.skip("opt-in (HYB_BENCH_DB=1): MariaDB is not part of make test's install, and in the full "
                    "suite of 2026-11-29 its mariadbd aborted at start on this machine (docs/roadmap.md)")
    missing = [b for b in ("mariadbd", "mariadb-install-db", "mariadb", "sysbench") if shutil.which(b) is None]
    if missing:
        pytest.skip(f"not installed: {missing} (tools/dev/install-bench-db.sh)")
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
    res = bench_json("atomic_writes.py", "--short", "--json", "--workdir", str(tmp_path), timeout=200)
    on, off = res["summary"]["ON"], res["summary"]["OFF"]
    assert on["dblwr_pages"] > 0 and off["dblwr_pages"] == 0, res  # the mode really ran
    assert on["transactions"] > 0 and off["transactions"] > 0 and on["errors"] == off["errors"] == 0
    assert off["write_bytes_per_trx"] < on["write_bytes_per_trx"], res  # each page written once, not twice
    assert list(tmp_path.iterdir()) == []  # the work dir (loop file, datadir) is gone
    assert str(tmp_path) not in subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
    assert subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout.count("hyb-atomic-bench") \
        <= loops.count("hyb-atomic-bench")
