"""vms.migration_*: a VM's live move under way (scheduler/service/migrations.py). The
target host and the claim held on it (``migration_host``, ``migration_allocation``: the
VM holds both its source and its target claim until it runs on the target), where the
move stands (``migration_state``, api/states.py MigrationState; "" when none), which
scheduler process drives it and since when (``migration_owner``, ``migration_at``: a
restarted scheduler, or another replica once the owner's lease ran out, resumes or undoes
it). VMs created before this revision have no move under way.

Revision ID: 0018
Revises: 0017
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("vms") as b:
        b.add_column(sa.Column("migration_host", sa.String(64), nullable=True))
        b.add_column(sa.Column("migration_allocation", sa.JSON(), nullable=True))
        b.add_column(sa.Column("migration_state", sa.String(16), nullable=False, server_default=""))
        b.add_column(sa.Column("migration_owner", sa.String(64), nullable=False, server_default=""))
        b.add_column(sa.Column("migration_at", sa.Float(), nullable=False, server_default="0"))
        b.create_index("ix_vms_migration_host", ["migration_host"])


def downgrade() -> None:
    with op.batch_alter_table("vms") as b:
        b.drop_index("ix_vms_migration_host")
        b.drop_column("migration_at")
        b.drop_column("migration_owner")
        b.drop_column("migration_state")
        b.drop_column("migration_allocation")
        b.drop_column("migration_host")
