"""bench/down_check.py: the index's down check is timed against the change-feed read
it rides on, and the figures it prints are that read's in a claim batch's transaction
(the cheapest: the batch's own connection) below the read with the check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def test_down_check_prints_its_cost_beside_the_feed_read(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(REPO / "bench/down_check.py"), "--hosts", "300", "--calls", "10",
                        "--rounds", "1"], check=False, capture_output=True, text=True, timeout=180, cwd=REPO,
                       env={**os.environ, "TMPDIR": str(tmp_path)})
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    got = json.loads(r.stdout)
    assert got["hosts"] == 300 and got["calls"] == 10
    assert 0 < got["feed_in_batch_ms"] < got["feed_and_down_check_ms"], got
    assert abs(got["down_check_ms"] - (got["feed_and_down_check_ms"] - got["feed_own_tx_ms"])) <= 0.01, got
