"""A bench run as its README says (one command, from the repository), for the tests of
bench/: its exit code checked, with the tails of what it printed when it failed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def run_bench(script: str, *args: str, timeout: float, tmpdir: Path | None = None) -> str:
    """``bench/<script> ARGS``'s standard output; it must exit 0. ``tmpdir``: its TMPDIR
    (a bench that makes its own temporary directory makes it there)."""
    env = {**os.environ, "TMPDIR": str(tmpdir)} if tmpdir is not None else None
    r = subprocess.run([sys.executable, str(REPO / "bench" / script), *args], check=False, capture_output=True,
                       text=True, timeout=timeout, cwd=REPO, env=env)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    return r.stdout


def bench_json(script: str, *args: str, timeout: float, tmpdir: Path | None = None) -> Any:
    """What ``run_bench`` printed, read as JSON (the bench's ``--json`` line)."""
    return json.loads(run_bench(script, *args, timeout=timeout, tmpdir=tmpdir))
