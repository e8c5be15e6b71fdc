"""host_stats: each host's IO-health history from its heartbeats, one row per host and
window (stats.bucket_s), kept stats.retention_days

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    f, i = sa.Float, sa.Integer
    op.create_table(
        "host_stats",
        sa.Column("host", sa.String(64), primary_key=True),
        sa.Column("bucket", sa.BigInteger, primary_key=True),
        *[sa.Column(c, i, nullable=False) for c in ("heartbeats", "samples", "psi_n", "throttled_periods",
                                                     "probe_ok", "probe_failed", "foreign_threads_max")],
        *[sa.Column(c, f, nullable=False) for c in ("io_cpu_busy", "cpu_io_service", "cpu_vms", "cpu_other",
                                                     "irqs_per_s", "foreign_cpu_s", "io_cpu_busy_max")],
        *[sa.Column(c, f, nullable=True) for c in ("psi_stall", "psi_some_avg10_max", "probe_p99_ms_max")],
    )
    op.create_index("ix_host_stats_bucket", "host_stats", ["bucket"])  # retention deletes by age


def downgrade() -> None:
    op.drop_table("host_stats")
