"""A real scheduler app in-process (its database real: SQLite or PostgreSQL, migrated),
spoken to through its HTTP interface by Starlette's TestClient: for the scheduler's API
tests and for fleet-rollout's engine tests, which keep their rollouts in it."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from fastapi.testclient import TestClient

from scheduler.api.app import create_app
from scheduler.config import Settings
from scheduler.db.engine import Store
from scheduler.db.migrate import upgrade


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
                            "server": {"shed_loop_lag_s": 0}}
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
    store = Store.from_url(db_url)
    upgrade(store.engine)
    app = create_app(settings(db_url, tokens, **over), store=store, hostd=hostd, clock=clock)
    client = _Client(app, raise_server_exceptions=False)
    client.store = store
    return client
