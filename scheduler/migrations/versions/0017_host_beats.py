"""host_beats: each replica's liveness, one row per period naming the hosts it heard
from (a compressed set over ``hosts.beat_id``), instead of a ``last_heartbeat`` write
per beat (scheduler/README.md, Heartbeats and liveness). ``hosts.beat_id``: the small
integer each host is named by there, given to the hosts registered so far in name order.

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "host_beats",
        sa.Column("replica", sa.String(64), primary_key=True),
        sa.Column("period_start", sa.Float(), primary_key=True),
        sa.Column("period_end", sa.Float(), nullable=False),
        sa.Column("hosts", sa.LargeBinary(), nullable=False),
    )
    op.create_index("ix_host_beats_period_end", "host_beats", ["period_end"])
    with op.batch_alter_table("hosts") as b:
        b.add_column(sa.Column("beat_id", sa.Integer(), nullable=True))
    bind = op.get_bind()
    names = [r[0] for r in bind.execute(sa.text("SELECT name FROM hosts ORDER BY name"))]
    for i, name in enumerate(names, start=1):
        bind.execute(sa.text("UPDATE hosts SET beat_id = :i WHERE name = :n"), {"i": i, "n": name})
    op.create_index("ix_hosts_beat_id", "hosts", ["beat_id"], unique=True)
    if bind.dialect.name == "postgresql":
        op.execute(f"CREATE SEQUENCE host_beat_ids START {len(names) + 1}")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP SEQUENCE host_beat_ids")
    op.drop_index("ix_hosts_beat_id", table_name="hosts")
    with op.batch_alter_table("hosts") as b:
        b.drop_column("beat_id")
    op.drop_index("ix_host_beats_period_end", table_name="host_beats")
    op.drop_table("host_beats")
