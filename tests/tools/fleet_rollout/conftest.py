"""The scheduler fleet-rollout keeps its rollouts in: a real scheduler app on SQLite, in
this process behind Starlette's TestClient (``rollouts``: a fresh database per test, for
the engine), or a real `scheduler serve` process (``sched_url``: one per module, for the
command line, which speaks HTTP to it)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tools.dev.procs import Scheduler as SchedulerProc
from tools.dev.procs import free_port
from tools.dev.sched_inproc import scheduler_client, token_config
from tools.fleet_rollout.clients import Scheduler
from tools.fleet_rollout.store import Store

ADMIN = "rollout-admin-token"


@pytest.fixture
def rollouts(tmp_path: Path) -> Iterator[Callable[..., Store]]:
    """``rollouts(holder=...)``: a Store on one fresh scheduler (real time: leases lapse)."""
    # Inside ``with`` the client keeps one event loop thread for all its requests;
    # without, Starlette's TestClient starts one per request (about 6 ms of CPU each, and
    # an engine run makes ~250).
    with scheduler_client(f"sqlite:///{tmp_path}/scheduler.db", {ADMIN: ["admin"]}, clock=time.time) as http:
        api = Scheduler("http://testserver", ADMIN, http=http)

        def store(holder: str = "c1", retry_s: float = 1.0) -> Store:
            return Store(api, holder=holder, retry_s=retry_s)
        yield store


@pytest.fixture(scope="module")
def sched_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(URL, admin token file) of a `scheduler serve` on plain HTTP and SQLite."""
    d = tmp_path_factory.mktemp("sched")
    port = free_port()
    tokens = "".join(f'[[auth.tokens]]\nname = "{t["name"][:12]}"\nsha256 = "{t["sha256"]}"\nscopes = ["admin"]\n'
                     for t in token_config({ADMIN: ["admin"]}))
    (d / "scheduler.toml").write_text(f'log_level = "WARNING"\n[server]\nplaintext = true\n'
                                      f'[db]\nurl = "sqlite:///{d}/scheduler.db"\n{tokens}')
    (d / "admin.token").write_text(ADMIN)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOSTD_", "HYB_SCHED_"))}
    s = SchedulerProc(d / "scheduler.toml", port, env, d / "scheduler.log")
    try:
        s.start()
        yield s.url, d / "admin.token"
    finally:
        s.stop()
