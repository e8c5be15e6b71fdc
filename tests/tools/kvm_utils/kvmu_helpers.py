"""Helpers the kvm-utils live tests share (a module with a unique name: pytest
imports every conftest.py as `conftest`, so tests must not import from one)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def kvm_utils_popen(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tools.kvm_utils", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(predicate, timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def instance_dirs(tracefs_root: Path, pid: int) -> list[Path]:
    return [p for p in (tracefs_root / "instances").iterdir() if p.name.startswith(f"kvm-utils-{pid}-")]


def instance_of(tracefs_root: Path, pid: int) -> Path | None:
    """The recording instance of ``pid`` once it records: a new instance starts with
    tracing_on=1 before any event is enabled, so tracing_on alone is not readiness;
    kvm-utils enables its events with tracing off and switches it on last."""
    for p in (tracefs_root / "instances").iterdir():
        if not p.name.startswith(f"kvm-utils-{pid}-"):
            continue
        try:
            ready = ((p / "tracing_on").read_text().strip() == "1"
                     and (p / "events/kvm/kvm_pio/enable").read_text().strip() == "1")
        except OSError:  # the instance is being made or removed
            ready = False
        if ready:
            return p
    return None


def stop(proc: subprocess.Popen, sig: int = 2, timeout: float = 30) -> tuple[str, str]:
    """Signal a process we started (by PID) and collect its output; SIGKILL if it hangs."""
    if proc.poll() is None:
        os.kill(proc.pid, sig)
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"pid {proc.pid} ignored signal {sig}: {err}")
