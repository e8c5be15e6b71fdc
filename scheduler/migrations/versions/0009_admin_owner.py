"""hosts.admin_owner, hosts.admin_reason, hosts.admin_since: who cordoned or drained the
host, why, and since when. Only that owner may change the admin state again without
``force``. Hosts cordoned before this revision have no owner ("") and no time (NULL):
anyone may change them, as before.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("hosts") as b:
        b.add_column(sa.Column("admin_owner", sa.String(128), nullable=False, server_default=""))
        b.add_column(sa.Column("admin_reason", sa.String(256), nullable=False, server_default=""))
        b.add_column(sa.Column("admin_since", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("hosts") as b:
        b.drop_column("admin_since")
        b.drop_column("admin_reason")
        b.drop_column("admin_owner")
