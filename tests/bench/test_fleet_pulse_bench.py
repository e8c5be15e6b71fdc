"""bench/fleet_pulse.py --short --json: the mechanism, not the numbers (those are the
bench's to report): two real scheduler replicas on SQLite, 500 hosts registered (every 2 s a beat each), beats
answered at the fleet's rate, placements beside them, the silent hosts all marked down
after their last beat and no host that kept beating marked (one replica restarted in the
middle), the history under 256 bytes a host and day, and no scheduler left running.

Database writes per beat (SQLite: the liveness rows the replicas wrote, their
``hyb_sched_liveness_rows_written_total``): a replica writes one row per period
(``heartbeat_period_s``, 1.5 s here) naming the hosts it heard from, and a host's own row
only when it comes back from down or every ``heartbeat_write_s`` (300 s: never within the
run). At ~250 beats/s and two replicas that is 1.3 rows a second: ~0.005 a beat, under the
issue's bound of 0.01 (issue 39)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

# One worker runs both (their replicas' ports and the bench's CPU would meet otherwise).
# Only the mark-down (phase 5) is quiet: it times liveness with the short timings (a 7 s
# timeout), which the CPU taken by other workers' tests would stretch. Phases 1-4 measure
# and print; what is asserted of them is counted, not timed, so they run beside other
# tests (run together, the bench held the machine quiet for ~58 s of every suite).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("fleet-pulse")]
REPO = Path(__file__).resolve().parents[2]


def _bench(tmp_path: Path, *args: str) -> dict:
    """bench/fleet_pulse.py --short --json ``args``: its JSON, once no process it started
    is left. The bench's own directory (its replicas' config, pulse.toml, is in it) is
    under this test's, so the processes left are found by that path, never by a name
    another run shares. In a session of its own: a test stopped meanwhile (its timeout,
    an interrupted run) takes the bench's replicas with it; killed alone, the bench left
    them running."""
    proc = subprocess.Popen([sys.executable, str(REPO / "bench/fleet_pulse.py"), "--short", "--json", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, "TMPDIR": str(tmp_path)}, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=240)
    except BaseException:  # a bench that ended by itself is checked for leftovers below
        # SIGTERM first: the bench stops its replicas on it, and they run in sessions of
        # their own, out of reach of a SIGKILL to the bench's group
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        raise
    assert proc.returncode == 0, (out[-3000:], err[-3000:])
    left = [p for p in Path("/proc").iterdir() if p.name.isdigit() and p.name != str(os.getpid())
            and str(tmp_path).encode() in _cmdline(p)]
    assert not left, left
    return json.loads(out)


def test_short_pulse_prints_the_numbers_as_json(tmp_path: Path) -> None:
    got = _bench(tmp_path, "--no-markdown")
    for key in ("beats_per_s", "cpu_us_per_beat", "db_writes_per_beat", "placed_ratio_with_beats",
                "placement_p99_ms_with_beats", "history_bytes_per_host_day"):
        assert isinstance(got[key], (int, float)), (key, got)
    assert got["hosts"] == 500 and got["beats_per_s"] > 100 and got["cpu_us_per_beat"] > 0
    assert got["db_writes_per_beat"] <= 0.01, got  # liveness rows per beat (the docstring)
    # the bare-ASGI floor, driven by the same generator at the same rate (bench/floor_app.py),
    # and the replicas' idle CPU: measured and printed, not held to issue 39's 1.5x here
    # (500 hosts at 250 beats/s on a shared machine is not where that bar is set)
    assert got["floor_beats_answered"] == got["beats_sent"], got
    assert got["floor_cpu_us_per_beat"] > 0 and got["cpu_over_floor"] > 0, got
    # the replicas' GC stops, from their /metrics: a part of their CPU a beat, never more
    assert 0 <= got["gc_us_per_beat"] < got["cpu_us_per_beat"] and got["gc_pauses_over_25ms"] >= 0, got
    assert 0 <= got["idle_cpu_ms_per_s"] < 100 and 0 <= got["floor_idle_cpu_ms_per_s"] < 100, got
    assert got["db_writes_from"] == "scheduler metrics", got
    # placements alone, beside the beats and beside the floor's beats, in windows taken in
    # turn (2 of each, 2 s), each kind pooled: all placed at about the offered 80/s (counted:
    # placed over the windows' length), each timed inside the replica too, window by window
    assert got["placement_windows"] == "2 of each kind (alone, beside the beats, beside the floor's), 2 s each", got
    for kind in ("", "_with_beats", "_beats_to_floor"):
        assert 60 <= got[f"placed_per_s{kind}"] <= 90 and got[f"claim_p99_ms{kind}"] > 0, (kind, got)
        assert got[f"refused_for_capacity{kind}"] == 0, (kind, got)
    assert [len(w) for w in got["claim_p99_ms_by_window"].values()] == [2, 2, 2], got
    assert got["placement_p99_ratio_vs_floor"] > 0 and got["cpu_budget"]["alone"]["replicas"] > 0, got
    assert 0 < got["history_bytes_per_host_day"] < 256
    assert "false_downs" not in got, got  # phase 5 is the next test's


@pytest.mark.quiet
def test_short_pulse_marks_the_silent_hosts_down_and_no_other(tmp_path: Path) -> None:
    got = _bench(tmp_path, "--only", "markdown")
    assert got["hosts"] == 500, got
    assert got["marked_down"] == got["silent_hosts"] == 5 and got["false_downs"] == 0, got
    assert 7 <= got["mark_down_s_p50"] <= got["mark_down_s_p99"] < 7 + 2 + 4, got  # timeout, lag, checks


def _cmdline(p: Path) -> bytes:
    try:
        return (p / "cmdline").read_bytes()
    except OSError:
        return b""
