"""hosts and vms: the first tables

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "hosts",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("address", sa.String(255), nullable=False),
        sa.Column("rack", sa.String(64), nullable=False),
        sa.Column("labels", sa.JSON, nullable=False),
        sa.Column("layout", sa.JSON, nullable=False),
        sa.Column("siblings", sa.JSON, nullable=False),
        sa.Column("pf_min_rate", sa.JSON, nullable=False),
        sa.Column("disk_classes", sa.JSON, nullable=False),
        sa.Column("layout_rev", sa.Integer, nullable=False),
        sa.Column("usage", sa.JSON, nullable=False),
        sa.Column("generation", sa.Integer, nullable=False),
        sa.Column("admin_state", sa.String(16), nullable=False),
        sa.Column("last_heartbeat", sa.Float, nullable=False),
        sa.Column("created", sa.Float, nullable=False),
        sa.Column("updated", sa.Float, nullable=False),
    )
    op.create_table(
        "vms",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("idempotency_key", sa.String(128), nullable=False),
        sa.Column("request_hash", sa.String(64), nullable=False),
        sa.Column("request", sa.JSON, nullable=False),
        sa.Column("host", sa.String(64), sa.ForeignKey("hosts.name"), nullable=True),
        sa.Column("allocation", sa.JSON, nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("hostd_vm_id", sa.String(64), nullable=False),
        sa.Column("affinity_group", sa.String(64), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("created", sa.Float, nullable=False),
        sa.Column("updated", sa.Float, nullable=False),
        sa.UniqueConstraint("tenant", "idempotency_key", name="uq_vms_tenant_key"),
    )
    op.create_index("ix_vms_tenant", "vms", ["tenant"])
    op.create_index("ix_vms_host", "vms", ["host"])
    op.create_index("ix_vms_status", "vms", ["status"])
    op.create_index("ix_vms_affinity_group", "vms", ["affinity_group"])


def downgrade() -> None:
    op.drop_table("vms")
    op.drop_table("hosts")
