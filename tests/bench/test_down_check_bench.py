"""bench/down_check.py: the index's down check is timed against the change-feed read
it rides on, and the figures it prints are that read's in a claim batch's transaction
(the cheapest: the batch's own connection) below the read with the check."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchrun import bench_json

pytestmark = [pytest.mark.slow]


def test_down_check_prints_its_cost_beside_the_feed_read(tmp_path: Path) -> None:
    got = bench_json("down_check.py", "--hosts", "300", "--calls", "10", "--rounds", "1", timeout=180,
                     tmpdir=tmp_path)
    assert got["hosts"] == 300 and got["calls"] == 10
    assert 0 < got["feed_in_batch_ms"] < got["feed_and_down_check_ms"], got
    assert abs(got["down_check_ms"] - (got["feed_and_down_check_ms"] - got["feed_own_tx_ms"])) <= 0.01, got
