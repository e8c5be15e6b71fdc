"""The `fleet-rollout` command as the fleet tests run it: a process of its own, pointed
by its FLEET_ROLLOUT_* environment at the module's scheduler (the ``sched`` fixture of
conftest.py: its URL, CA and admin token, and the dev CA's fleet-rollout certificate),
which keeps the rollouts."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tools.dev.procs import REPO

BIN = str(REPO / ".venv/bin/fleet-rollout")


def rollout_env(sched: dict, work: Path) -> dict[str, str]:
    token = work / "admin.token"
    token.write_text(sched["admin"])
    return {**os.environ, "FLEET_ROLLOUT_SCHEDULER_URL": sched["sched"].url, "FLEET_ROLLOUT_TOKEN_FILE": str(token),
            "FLEET_ROLLOUT_SCHEDULER_CA": str(sched["certs"] / "ca.crt"),
            "FLEET_ROLLOUT_TLS_DIR": str(sched["certs"])}


def rollout(sched: dict, work: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``fleet-rollout ARGS`` run to its end (cwd: ``work``)."""
    return subprocess.run([BIN, *args], cwd=work, env=rollout_env(sched, work), text=True, capture_output=True,
                          timeout=timeout, check=False)
