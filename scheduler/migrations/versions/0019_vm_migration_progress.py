"""vms.migration_progress, vms.last_migration: what operators see of a live move
(scheduler/service/migrations.py). ``migration_progress``: while a move runs, when it
started and the source hostd's last GetMigration sample the driving scheduler took (memory
and disk remaining, rate, expected downtime, and when it was taken): every replica serves
it from the row, no hostd is asked per API read. ``last_migration``: the last move's end
(from, to, result, reason, total time, libvirt's job time and downtime). VMs created
before this revision have neither.

Revision ID: 0019
Revises: 0018
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("vms") as b:
        b.add_column(sa.Column("migration_progress", sa.JSON(), nullable=True))
        b.add_column(sa.Column("last_migration", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("vms") as b:
        b.drop_column("last_migration")
        b.drop_column("migration_progress")
