"""console_sessions: the web console's logins (scheduler/service/sessions.py), one row
each, kept in the database so every replica knows a session and a logout ends it
everywhere. Only hashes are stored: the cookie's and the bearer token's.

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "console_sessions",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("token_sha256", sa.String(64), nullable=False),
        sa.Column("csrf", sa.String(64), nullable=False),
        sa.Column("created", sa.Float(), nullable=False),
        sa.Column("expires", sa.Float(), nullable=False),
    )
    op.create_index("ix_console_sessions_expires", "console_sessions", ["expires"])


def downgrade() -> None:
    op.drop_index("ix_console_sessions_expires", table_name="console_sessions")
    op.drop_table("console_sessions")
