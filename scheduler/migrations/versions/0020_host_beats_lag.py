"""host_beats.lag: why the replica that wrote a period's row could not vouch for it (its
event loop or flush late, registrations shed: ``liveness_rule.lag_reason``), or NULL.
A host whose beats sit unread at a lagging replica is missing from that replica's rows,
so its peers must not judge it silent either: each replica holds its checks while a
peer's newest row says it lags (``service.pulse``). Rows written before this revision
say nothing.

Revision ID: 0020
Revises: 0019
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("host_beats") as b:
        b.add_column(sa.Column("lag", sa.String(200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("host_beats") as b:
        b.drop_column("lag")
