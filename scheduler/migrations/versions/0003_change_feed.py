"""change feed for the placement index: hosts.seq, stamped from the fleet counter
(SQLite) or with the writing transaction's id (PostgreSQL)

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("hosts") as b:
        b.add_column(sa.Column("seq", sa.BigInteger, nullable=False, server_default="0"))
    op.create_index("ix_hosts_seq", "hosts", ["seq"])
    op.create_table("fleet", sa.Column("id", sa.Integer, primary_key=True),
                    sa.Column("seq", sa.BigInteger, nullable=False))
    op.execute("INSERT INTO fleet (id, seq) VALUES (1, 0)")


def downgrade() -> None:
    op.drop_table("fleet")
    op.drop_index("ix_hosts_seq", "hosts")
    with op.batch_alter_table("hosts") as b:
        b.drop_column("seq")
