"""rollout_leases.fence, .principal, .taken; rollout_transitions.principal, .fence: the
lease's fence is a number the scheduler hands out (one more with every take, never
reused), which every controller write carries and which only the principal that took
the lease may use; each transition records whose token wrote it and under which fence.
A lease taken before this revision has fence 0, which no write carries: its controller
takes the lease again. A downgrade drops the fences and the principals.

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("rollout_leases") as b:
        b.add_column(sa.Column("fence", sa.Integer(), nullable=False, server_default="0"))
        b.add_column(sa.Column("principal", sa.String(128), nullable=False, server_default=""))
        b.add_column(sa.Column("taken", sa.Float(), nullable=False, server_default="0"))
    with op.batch_alter_table("rollout_transitions") as b:
        b.add_column(sa.Column("principal", sa.String(128), nullable=False, server_default=""))
        b.add_column(sa.Column("fence", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("rollout_transitions") as b:
        b.drop_column("fence")
        b.drop_column("principal")
    with op.batch_alter_table("rollout_leases") as b:
        b.drop_column("taken")
        b.drop_column("principal")
        b.drop_column("fence")
