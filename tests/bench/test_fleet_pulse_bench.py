"""bench/fleet_pulse.py --short --json: the mechanism, not the numbers (those are the
bench's to report): two real scheduler replicas on SQLite, 500 hosts registered (every 2 s a beat each), beats
answered at the fleet's rate, placements beside them, the silent hosts all marked down
after their last beat and no host that kept beating marked (one replica restarted in the
middle), the history under 256 bytes a host and day, and no scheduler left running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# quiet: it times mark-downs with the short timings (a 6 s timeout). Beside two other
# workers' tests, the replica restarted mid-phase answered beats from the database while
# its index was being built and fell behind on liveness: 7 hosts that kept beating were
# marked down in one CI run (the cold-restart lag the 100,000-host run shows). A replica
# now builds its index before it opens its port; the test stays quiet for its timings.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("fleet-pulse"), pytest.mark.quiet]
REPO = Path(__file__).resolve().parents[2]


def test_short_pulse_prints_the_numbers_as_json() -> None:
    r = subprocess.run([sys.executable, str(REPO / "bench/fleet_pulse.py"), "--short", "--json"], check=False,
                       capture_output=True, text=True, timeout=240, cwd=REPO)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    got = json.loads(r.stdout)
    for key in ("beats_per_s", "cpu_us_per_beat", "db_writes_per_beat", "placed_ratio_with_beats",
                "placement_p99_ms_with_beats", "history_bytes_per_host_day"):
        assert isinstance(got[key], (int, float)), (key, got)
    assert got["hosts"] == 500 and got["beats_per_s"] > 100 and got["cpu_us_per_beat"] > 0
    assert got["db_writes_per_beat"] >= 0  # WAL pages per beat (liveness written in batches)
    assert got["marked_down"] == got["silent_hosts"] == 5 and got["false_downs"] == 0, got
    assert 6 <= got["mark_down_s_p50"] <= got["mark_down_s_p99"] < 6 + 2 + 4, got  # timeout, lag, checks
    assert 0 < got["history_bytes_per_host_day"] < 256
    left = [p for p in Path("/proc").iterdir() if p.name.isdigit() and p.name != str(os.getpid())
            and b"pulse.toml" in _cmdline(p)]
    assert not left, left


def _cmdline(p: Path) -> bytes:
    try:
        return (p / "cmdline").read_bytes()
    except OSError:
        return b""
