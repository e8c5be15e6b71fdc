"""rollouts, rollout_hosts, rollout_transitions, rollout_leases: fleet-rollout's durable
state, kept by the scheduler so that every operator's rollouts see each other (a host
belongs to at most one active rollout). A downgrade drops them with their history.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rollouts",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("policy_digest", sa.String(64), nullable=False),
        sa.Column("spec", sa.Text, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text, nullable=False, server_default=""),
        sa.Column("wave", sa.Integer, nullable=False, server_default="0"),
        sa.Column("waves", sa.Integer, nullable=False),
        sa.Column("skipped", sa.Text, nullable=False),
        sa.Column("created", sa.Float, nullable=False),
        sa.Column("updated", sa.Float, nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
    )
    op.create_table(
        "rollout_hosts",
        sa.Column("rollout", sa.String(64), sa.ForeignKey("rollouts.name"), primary_key=True),
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("wave", sa.Integer, nullable=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("rack", sa.String(64), nullable=False),
        sa.Column("address", sa.String(255), nullable=False),
        sa.Column("host", sa.Text, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("data", sa.Text, nullable=False, server_default="{}"),
        sa.Column("updated", sa.Float, nullable=False),
    )
    op.create_index("ix_rollout_hosts_wave_state", "rollout_hosts", ["rollout", "wave", "state"])
    op.create_index("ix_rollout_hosts_name", "rollout_hosts", ["name"])  # the overlap check
    op.create_table(
        "rollout_transitions",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("rollout", sa.String(64), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("from_state", sa.String(16), nullable=False),
        sa.Column("to_state", sa.String(16), nullable=False),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("holder", sa.String(255), nullable=False),
        sa.Column("detail", sa.Text, nullable=False),
    )
    op.create_index("ix_rollout_transitions_host", "rollout_transitions", ["rollout", "host", "id"])
    op.create_table(
        "rollout_leases",
        sa.Column("rollout", sa.String(64), primary_key=True),
        sa.Column("holder", sa.String(255), nullable=False),
        sa.Column("expires", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("rollout_leases")
    op.drop_table("rollout_transitions")
    op.drop_table("rollout_hosts")
    op.drop_table("rollouts")
