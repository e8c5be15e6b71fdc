"""The end of a claim batch: its VM and audit rows and its hosts' new usage, written
together in the batch's transaction (``Placer._batch``)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.orm import Session

from scheduler.repo import lite, pg
from scheduler.repo import vms as vm_repo
from scheduler.resources import Usage


def lock_claims(*, session: Session) -> None:
    """PostgreSQL: hold the claim lock to the end of the transaction (``pg.lock_claims``).
    SQLite has no use for it: a write transaction already holds the only writer lock."""
    if not lite.serves(session):
        pg.lock_claims(session)


def write(*, session: Session, bumps: Sequence[tuple[str, int, int, Usage]], now: float) -> tuple[int, int | None]:
    """Insert the rows ``vm_repo`` deferred and set each host's usage iff its generation
    is still the one seen: ``bumps`` = (name, seen generation, new generation, usage).
    Returns (hosts matched, the SQLite change stamp or None); fewer matched than given =
    a lost race (the caller rolls the batch back). The unique (tenant, idempotency_key)
    of vms fires here too: the batch rolls back and its requests are claimed one by one,
    where the losing request finds the winner's VM.

    SQLite: an ``executemany`` per table, a stamp from the ``fleet`` counter, one per
    batch. PostgreSQL: one statement for all of it (``pg.write_batch``), stamped with
    the transaction id."""
    tables = vm_repo.take_deferred(session=session)
    data = [(n, seen, g, u.to_dict()) for n, seen, g, u in bumps]
    if not lite.serves(session):
        return pg.write_batch(session, data, [(t, cols, rows) for t, cols, _j, rows in tables], now), None
    for table, cols, json_cols, rows in tables:
        lite.insert_many(session, table, cols, json_cols, rows)
    if not data:
        return 0, None
    seq = lite.next_seq(session)
    return lite.bump_many(session, data, now, seq), seq
