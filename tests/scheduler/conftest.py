"""Scheduler fixtures: the same tests run on SQLite (a file in tmp_path) and on a real
PostgreSQL 15 server this fixture starts on loopback in a temp dir, as the `postgres`
user (PostgreSQL refuses root), and stops by PID even when tests fail. ``api``: the
scheduler app on that database behind a TestClient, on a ``clock`` the test moves
(a module may define its own ``api``: more tokens, hosts registered first)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sched_helpers import STORES, STORES_AND_LOCKS, Clock, database, database_and_lock, make_client, new_pg_database

from tools.dev.schedbench import PG_BIN, postgres


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """A throwaway PostgreSQL server (tools/dev/schedbench.py.postgres); yields its base
    URL (no database name)."""
    if not (PG_BIN / "postgres").exists():
        pytest.skip("PostgreSQL 15 server binaries not installed")
    with postgres({"fsync": "off", "max_connections": "300", "synchronous_commit": "off"}) as (_user, port, _pid):
        yield f"postgresql://postgres@127.0.0.1:{port}"


@pytest.fixture(params=STORES)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return database(request, tmp_path)


@pytest.fixture
def pg_url(pg_server: str) -> str:
    """A new database on the PostgreSQL server, for tests that are about PostgreSQL only."""
    return new_pg_database(pg_server)


@pytest.fixture(params=STORES_AND_LOCKS)
def db_and_lock(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """(database URL, ``placement.claim_lock``): SQLite, and PostgreSQL in both modes."""
    return database_and_lock(request, tmp_path)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def api(db_url: str, clock: Clock):  # type: ignore[no-untyped-def]
    with make_client(db_url, clock=clock) as c:
        yield c
