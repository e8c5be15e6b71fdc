"""``scheduler db upgrade``: Alembic migrations (scheduler/migrations), run in-process."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine

HERE = Path(__file__).resolve().parents[1] / "migrations"


def alembic_config(engine: Engine) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(HERE))
    cfg.attributes["engine"] = engine
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    command.upgrade(alembic_config(engine), revision)


def downgrade(engine: Engine, revision: str) -> None:
    command.downgrade(alembic_config(engine), revision)


def current(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext
    with engine.connect() as c:
        return MigrationContext.configure(c).get_current_revision()


@cache
def head() -> str:
    """The newest revision of scheduler/migrations (read once per process)."""
    from alembic.script import ScriptDirectory
    found = ScriptDirectory(str(HERE)).get_current_head()
    assert found is not None, f"no migrations under {HERE}"
    return found
