"""vms.replaces, vms.disruption_group: what a drain needs to move VMs. A replacement
names the VM it replaces (deleted once the replacement runs); the group is the VM's
disruption budget's, indexed for the drain's fleet-wide count of the group's VMs that
are unavailable. VMs created before this revision have neither: no group, replace
nothing; their request has no ``on_maintenance`` and reads as ``block``.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("vms") as b:
        b.add_column(sa.Column("replaces", sa.String(36), nullable=True))
        b.add_column(sa.Column("disruption_group", sa.String(64), nullable=False, server_default=""))
        b.create_index("ix_vms_replaces", ["replaces"])
        b.create_index("ix_vms_disruption_group", ["disruption_group"])


def downgrade() -> None:
    with op.batch_alter_table("vms") as b:
        b.drop_index("ix_vms_disruption_group")
        b.drop_index("ix_vms_replaces")
        b.drop_column("disruption_group")
        b.drop_column("replaces")
