"""hosts.down_since: when the scheduler marked the host down (silent past the heartbeat
timeout), NULL while it is up. Marked once, by whichever replica sees it first (a
conditional update); cleared when the host beats or registers again. Hosts silent
before this revision are marked at the first check after the grace period.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("hosts") as b:
        b.add_column(sa.Column("down_since", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("hosts") as b:
        b.drop_column("down_since")
