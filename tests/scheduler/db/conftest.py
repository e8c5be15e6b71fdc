"""The store's own tests migrate their databases themselves, from nothing: the same
fixtures as tests/scheduler/conftest.py's, with empty PostgreSQL databases."""

from __future__ import annotations

from pathlib import Path

import pytest

from sched_helpers import STORES, STORES_AND_LOCKS, database, database_and_lock


@pytest.fixture(params=STORES)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return database(request, tmp_path, migrated=False)


@pytest.fixture(params=STORES_AND_LOCKS)
def db_and_lock(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    return database_and_lock(request, tmp_path, migrated=False)
