"""Alembic environment: the engine comes from the caller (scheduler.db.migrate)."""

from __future__ import annotations

from alembic import context

from scheduler.db.models import Base

engine = context.config.attributes["engine"]
with engine.connect() as connection:
    context.configure(connection=connection, target_metadata=Base.metadata,
                      render_as_batch=engine.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()
    connection.commit()
