"""A real scheduler (SQLite, HTTPS from a dev CA that also signs the fleet-rollout client
certificate) for a module's simulated fleet; stopped by PID in a finally."""

from __future__ import annotations

import pytest
from tools.dev.fleetsim import fleet_scheduler

ADMIN, HOST_TOKEN = "fleet-admin-token", "fleet-host-token"


@pytest.fixture(scope="module")
def sched(tmp_path_factory: pytest.TempPathFactory):
    with fleet_scheduler(tmp_path_factory.mktemp("fleet"), admin_token=ADMIN, host_token=HOST_TOKEN,
                         extra="[drain]\ninterval_s = 1\n") as s:
        yield s
