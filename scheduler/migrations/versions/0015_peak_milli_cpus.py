"""host_days: the peak window's CPUs in use by class as whole milli-CPUs (INTEGER), not
single-precision REAL, so the share of a host's CPUs is an exact fraction and a share
on a bin edge (2.4 of 48 CPUs: 5 %) lands in the bin it opens, in Python and in SQL
(scheduler/utilization.py). A kept value is rounded once, from the decimal it reads as
(PostgreSQL: its REAL's shortest text, as the Python reader saw it). hostd sends three
decimals, so no kept value is changed by the rounding.

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

CLASSES = ("io", "vms", "other")


def _as_milli(col: str) -> str:
    if op.get_bind().dialect.name == "postgresql":
        return f"CAST(ROUND(CAST(CAST({col} AS TEXT) AS NUMERIC) * 1000) AS INTEGER)"
    return f"CAST(ROUND({col} * 1000) AS INTEGER)"


def upgrade() -> None:
    with op.batch_alter_table("host_days") as b:
        for c in CLASSES:
            b.add_column(sa.Column(f"peak_{c}_mcpu", sa.Integer(), nullable=True))
    op.execute("UPDATE host_days SET " + ", ".join(f"peak_{c}_mcpu = {_as_milli(f'peak_{c}')}" for c in CLASSES))
    with op.batch_alter_table("host_days") as b:
        for c in CLASSES:
            b.alter_column(f"peak_{c}_mcpu", existing_type=sa.Integer(), nullable=False)
            b.drop_column(f"peak_{c}")


def downgrade() -> None:
    with op.batch_alter_table("host_days") as b:
        for c in CLASSES:
            b.add_column(sa.Column(f"peak_{c}", sa.REAL(), nullable=True))
    op.execute("UPDATE host_days SET " + ", ".join(f"peak_{c} = peak_{c}_mcpu / 1000.0" for c in CLASSES))
    with op.batch_alter_table("host_days") as b:
        for c in CLASSES:
            b.alter_column(f"peak_{c}", existing_type=sa.REAL(), nullable=False)
            b.drop_column(f"peak_{c}_mcpu")
