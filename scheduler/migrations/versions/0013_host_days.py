"""host_days: one row per host and host-local day, what the fleet's utilisation view
needs (hostd folds it from its samples): the peak window's CPU use by class, the 24
hours' whole-host CPU use, a 20-bin histogram of the day, the IO-health figures. Keyed
by (day, host), no other index: under 256 bytes a row with its key on SQLite and
PostgreSQL (measured); kept for ``stats.history_days``.

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
        sa.Column("day", sa.String(10), primary_key=True),  # first: the view reads by day
        sa.Column("host", sa.String(64), primary_key=True),
        sa.Column("utc_offset_min", sa.SmallInteger(), nullable=False),
        sa.Column("cpus", sa.Integer(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("peak_start", sa.SmallInteger(), nullable=False),  # minutes of the host-local day
        sa.Column("peak_end", sa.SmallInteger(), nullable=False),
        sa.Column("peak_samples", sa.Integer(), nullable=False),
        sa.Column("peak_io", sa.REAL(), nullable=False),
        sa.Column("peak_vms", sa.REAL(), nullable=False),
        sa.Column("peak_other", sa.REAL(), nullable=False),
        sa.Column("hours", sa.LargeBinary(24), nullable=False),
        sa.Column("hist", sa.LargeBinary(40), nullable=False),
        sa.Column("probe_p99_ms_max", sa.REAL(), nullable=True),
        sa.Column("psi_some_avg10_max", sa.REAL(), nullable=True),
        sa.Column("foreign_cpu_s", sa.REAL(), nullable=False),
        sa.Column("probe_failed", sa.Integer(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("host_days")
