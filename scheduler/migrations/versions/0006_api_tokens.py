"""api_tokens: bearer tokens in the database, with expiry and revocation
(`scheduler token create|list|revoke`); TOML tokens stay for bootstrap

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(16), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False, unique=True),
        sa.Column("scopes", sa.JSON, nullable=False),
        sa.Column("created", sa.Float, nullable=False),
        sa.Column("expires", sa.Float, nullable=True),
        sa.Column("revoked", sa.Float, nullable=True),
        sa.Column("changed", sa.Float, nullable=False),
        sa.Column("note", sa.String(200), nullable=False, server_default=""),
    )
    op.create_index("ix_api_tokens_name", "api_tokens", ["name"])
    op.create_index("ix_api_tokens_changed", "api_tokens", ["changed"])


def downgrade() -> None:
    op.drop_table("api_tokens")
