"""A real scheduler (SQLite, HTTPS from a dev CA that also signs the fleet-rollout client
certificate) for a module's simulated fleet; stopped by PID in a finally."""

from __future__ import annotations

import os

import pytest
from tools.dev.fleetsim import dev_certs, write_scheduler_config
from tools.dev.procs import Scheduler, free_port

ADMIN, HOST_TOKEN = "fleet-admin-token", "fleet-host-token"


@pytest.fixture(scope="module")
def sched(tmp_path_factory: pytest.TempPathFactory):
    w = tmp_path_factory.mktemp("fleet")
    certs = dev_certs(w / "tls", ("fleet-rollout",))
    port = free_port()
    write_scheduler_config(w / "scheduler.toml", port=port, certs=certs, db=w / "scheduler.db",
                           admin_token=ADMIN, host_token=HOST_TOKEN, extra="[drain]\ninterval_s = 1\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOSTD_", "HYB_SCHED_"))}
    s = Scheduler(w / "scheduler.toml", port, env, w / "scheduler.log", ca=certs / "ca.crt")
    try:
        s.start()
        yield {"sched": s, "certs": certs, "dir": w, "admin": ADMIN, "host_token": HOST_TOKEN}
    finally:
        s.stop()
