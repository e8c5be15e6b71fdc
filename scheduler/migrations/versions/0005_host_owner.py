"""hosts.owner: the principal that registered the host. Another host principal may not
re-register or heartbeat it (a host token must not act for another host); hosts
registered before this revision are claimed by their next registration.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("hosts") as b:
        b.add_column(sa.Column("owner", sa.String(64), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("hosts") as b:
        b.drop_column("owner")
