"""host_days: one row per host and host-local day, what the fleet's utilisation view
needs (hostd folds it from its samples): the peak window's CPU use by class, the 24
hours' whole-host CPU use, a 20-bin histogram of the day, the IO-health figures. Under
256 bytes a row; kept for ``history.retention_days``.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "host_days",
        sa.Column("host", sa.String(64), primary_key=True),
        sa.Column("day", sa.String(10), primary_key=True),
        sa.Column("utc_offset_min", sa.Integer(), nullable=False),
        sa.Column("cpus", sa.Integer(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("peak", sa.String(40), nullable=False),
        sa.Column("peak_samples", sa.Integer(), nullable=False),
        sa.Column("peak_io", sa.Float(), nullable=False),
        sa.Column("peak_vms", sa.Float(), nullable=False),
        sa.Column("peak_other", sa.Float(), nullable=False),
        sa.Column("hours", sa.String(100), nullable=False),
        sa.Column("hist", sa.String(140), nullable=False),
        sa.Column("probe_p99_ms_max", sa.Float(), nullable=True),
        sa.Column("psi_some_avg10_max", sa.Float(), nullable=True),
        sa.Column("foreign_cpu_s", sa.Float(), nullable=False),
        sa.Column("probe_failed", sa.Integer(), nullable=False),
        sa.Column("received", sa.Float(), nullable=False),
    )
    op.create_index("ix_host_days_day", "host_days", ["day"])


def downgrade() -> None:
    op.drop_index("ix_host_days_day", "host_days")
    op.drop_table("host_days")
