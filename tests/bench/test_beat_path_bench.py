"""bench/beat_path.py: the scheduler's ASGI app answers the heartbeats it is called with
from memory (every call counted as a beat), and the figures it prints are the two
apps' CPU per call, the floor's the smaller."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def test_beat_path_prints_both_apps_cost(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(REPO / "bench/beat_path.py"), "--hosts", "50", "--calls", "300",
                        "--rounds", "2"], check=False, capture_output=True, text=True, timeout=180, cwd=REPO,
                       env={**os.environ, "TMPDIR": str(tmp_path)})
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    got = json.loads(r.stdout)
    assert got["hosts"] == 50 and got["calls"] == 300
    # 2 rounds of 300 calls, and the one beat that started the flusher
    assert got["beats_counted"] == 2 * 300 + 1, got
    assert 0 < got["floor_us_per_beat"] < got["app_us_per_beat"], got
