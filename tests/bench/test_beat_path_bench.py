"""bench/beat_path.py: the scheduler's ASGI app answers the heartbeats it is called with
from memory (every call counted as a beat), and the figures it prints are the two
apps' CPU per call, the floor's the smaller."""

from __future__ import annotations

from pathlib import Path

import pytest
from benchrun import bench_json

pytestmark = [pytest.mark.slow]


def test_beat_path_prints_both_apps_cost(tmp_path: Path) -> None:
    got = bench_json("beat_path.py", "--hosts", "50", "--calls", "300", "--rounds", "2", timeout=180,
                     tmpdir=tmp_path)
    assert got["hosts"] == 50 and got["calls"] == 300
    # 2 rounds of 300 calls, and the one beat that started the flusher
    assert got["beats_counted"] == 2 * 300 + 1, got
    assert 0 < got["floor_us_per_beat"] < got["app_us_per_beat"], got
