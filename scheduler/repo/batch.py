"""A claim batch's writes: its VM and audit rows, collected while the batch claims
(``defer_inserts``), and its hosts' new usage, written together at its end in the
batch's transaction (``Placer._batch``)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

from sqlalchemy import JSON
from sqlalchemy.orm import Session

from scheduler.db.models import Audit, Vm
from scheduler.repo import lite, pg
from scheduler.resources import Usage

DEFER = "hyb_defer"  # session.info key: the rows collected, per table
DEFERRABLE = (("vms", Vm), ("audit", Audit))


def defer_inserts(*, session: Session) -> None:
    """From now on ``repo.vms.insert_vm`` and ``repo.audit.record`` collect their rows;
    ``write`` writes them with the batch's host updates (same transaction, fewer
    statements)."""
    session.info[DEFER] = {table: [] for table, _ in DEFERRABLE}


def deferred(*, session: Session, table: str) -> list[dict[str, Any]] | None:
    """Where a row of ``table`` goes while ``session`` collects them; None: insert it now."""
    rows = session.info.get(DEFER)
    return None if rows is None else rows[table]


def take_deferred(*, session: Session) -> list[tuple[str, tuple[str, ...], frozenset[str], list[dict[str, Any]]]]:
    """The rows collected since ``defer_inserts``, per table that has any: (table, its
    columns, its JSON columns, rows); collecting stops."""
    rows = session.info.pop(DEFER, None) or {}
    return [(table, _columns(model), _json_columns(model), rows[table])
            for table, model in DEFERRABLE if rows.get(table)]


@cache
def _columns(model: type) -> tuple[str, ...]:
    return tuple(c.key for c in model.__table__.columns)  # type: ignore[attr-defined]


@cache
def _json_columns(model: type) -> frozenset[str]:
    return frozenset(c.key for c in model.__table__.columns if isinstance(c.type, JSON))  # type: ignore[attr-defined]


def lock_claims(*, session: Session) -> None:
    """PostgreSQL: hold the claim lock to the end of the transaction (``pg.lock_claims``).
    SQLite has no use for it: a write transaction already holds the only writer lock."""
    if not lite.serves(session):
        pg.lock_claims(session)


def write(*, session: Session, bumps: Sequence[tuple[str, int, int, Usage]], now: float) -> tuple[int, int | None]:
    """Insert the rows deferred since ``defer_inserts`` and set each host's usage iff its generation
    is still the one seen: ``bumps`` = (name, seen generation, new generation, usage).
    Returns (hosts matched, the SQLite change stamp or None); fewer matched than given =
    a lost race (the caller rolls the batch back). The unique (tenant, idempotency_key)
    of vms fires here too: the batch rolls back and its requests are claimed one by one,
    where the losing request finds the winner's VM.

    SQLite: an ``executemany`` per table, a stamp from the ``fleet`` counter, one per
    batch. PostgreSQL: one statement for all of it (``pg.write_batch``), stamped with
    the transaction id."""
    tables = take_deferred(session=session)
    data = [(n, seen, g, u.to_dict()) for n, seen, g, u in bumps]
    if not lite.serves(session):
        return pg.write_batch(session, data, [(t, cols, rows) for t, cols, _j, rows in tables], now), None
    for table, cols, json_cols, rows in tables:
        lite.insert_many(session, table, cols, json_cols, rows)
    if not data:
        return 0, None
    seq = lite.next_seq(session)
    return lite.bump_many(session, data, now, seq), seq
