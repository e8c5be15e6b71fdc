"""hosts.metrics_url, hosts.hostd_version, hosts.carved_policy: what hostd registers for
Prometheus's service discovery (``GET /v1/prometheus/targets``). Nullable: a host
registered by an older hostd has none and is not a scrape target until it registers again.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("hosts") as b:
        b.add_column(sa.Column("metrics_url", sa.String(300), nullable=True))
        b.add_column(sa.Column("hostd_version", sa.String(64), nullable=True))
        b.add_column(sa.Column("carved_policy", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("hosts") as b:
        b.drop_column("carved_policy")
        b.drop_column("hostd_version")
        b.drop_column("metrics_url")
