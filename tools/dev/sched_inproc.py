"""A real scheduler app in-process (its database real: SQLite or PostgreSQL, migrated),
spoken to through its HTTP interface by Starlette's TestClient: for the scheduler's API
tests and for fleet-rollout's engine tests, which keep their rollouts in it."""

from __future__ import annotations

import atexit
import hashlib
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from scheduler.api.app import create_app
from scheduler.config import Settings
from scheduler.db.engine import Store
from scheduler.db.migrate import current, head, upgrade


_TEMPLATE: list[Path] = []  # this process's migrated, empty SQLite database


def _from_template(path: Path) -> None:
    """A new SQLite database at ``path`` as a copy of one migrated once per process:
    Alembic's upgrade loads every migration's module each time (90 ms of CPU a database,
    hundreds of databases a suite run). An existing file is left as it is."""
    if path.exists():
        return
    if not _TEMPLATE:
        d = Path(tempfile.mkdtemp(prefix="hyb-sched-template-"))
        atexit.register(shutil.rmtree, d, True)
        store = Store.from_url(f"sqlite:///{d}/template.db")
        try:
            upgrade(store.engine)
        finally:
            store.dispose()
        _TEMPLATE.append(d / "template.db")
    shutil.copyfile(_TEMPLATE[0], path)


def token_config(tokens: dict[str, list[str]]) -> list[dict]:
    """``{token: scopes}`` -> the config's tokens, each named after itself."""
    return [{"name": k, "sha256": hashlib.sha256(k.encode()).hexdigest(), "scopes": v} for k, v in tokens.items()]


def settings(db_url: str, tokens: dict[str, list[str]], **over: Any) -> Settings:
    data: dict[str, Any] = {"db": {"url": db_url}, "auth": {"tokens": token_config(tokens)},
                            "dispatch": {"enabled": False}, "reconcile": {"interval_s": 0},
                            "stats": {"heartbeat_flush_s": 0},  # write-through: tests read at once
                            "liveness": {"check_s": 0},  # tests call app.state.liveness.check()
                            # tests beat on a clock they step (or not): the rate limit is opt-in here
                            "placement": {"heartbeat_min_interval_s": 0},
                            # the machine's load must not turn a test's requests away: shedding
                            # is tested on a real server (tests/scheduler/api/test_sched_shed.py)
                            "server": {"shed_loop_lag_s": 0,
                                       # a full collection of the test process's heap at every
                                       # app start: the freeze has tests of its own
                                       "gc_freeze_s": 0}}
    for k, v in over.items():
        data.setdefault(k, {}).update(v)
    return Settings(**data)


class _Client(TestClient):
    """A TestClient that closes its scheduler's store when its ``with`` ends: each thread
    of the app keeps a database connection for the store's life (a batch thread per
    queue, the drain's pool...), and a PostgreSQL test server ran out of connections
    ("too many clients") once a suite's clients were left to the garbage collector."""

    store: Store

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self.store.dispose()


def scheduler_client(db_url: str, tokens: dict[str, list[str]], *, clock: Callable[[], float],
                     hostd=None, **over: Any) -> TestClient:  # type: ignore[no-untyped-def]
    """The scheduler on ``db_url`` (migrated to the head first), behind a TestClient; its
    store is closed when the client's ``with`` ends."""
    if db_url.startswith("sqlite:///"):
        _from_template(Path(db_url.removeprefix("sqlite:///")))
    store = Store.from_url(db_url)
    if current(store.engine) != head():  # a new PostgreSQL database (a copied SQLite one is at the head)
        upgrade(store.engine)
    app = create_app(settings(db_url, tokens, **over), store=store, hostd=hostd, clock=clock)
    client = _Client(app, raise_server_exceptions=False)
    client.store = store
    return client
