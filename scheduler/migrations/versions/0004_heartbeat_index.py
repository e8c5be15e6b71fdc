"""index on hosts.last_heartbeat: the placement index asks for the hosts gone quiet
(``last_heartbeat < now - timeout``) every few seconds instead of reading the whole fleet

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_hosts_last_heartbeat", "hosts", ["last_heartbeat"])


def downgrade() -> None:
    op.drop_index("ix_hosts_last_heartbeat", "hosts")
