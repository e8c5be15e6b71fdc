"""The claim batch's statements on PostgreSQL, run on the psycopg connection of the
caller's transaction (``lite.py`` is the SQLite counterpart).

Through SQLAlchemy a claim batch of N VMs sent 4N + 8 statements: a REPEATABLE READ
transaction for the change feed (BEGIN, position, rows, COMMIT), then BEGIN, the key
lookup, N row locks, the change stamp, and N host updates, N VM inserts and N audit
inserts (``executemany`` in pipeline mode, still one statement each on the server),
COMMIT. Here it is N + 5: the feed is one statement (one statement sees one snapshot,
so position and rows agree without REPEATABLE READ), and the batch's writes are one
statement of data-modifying CTEs: an ``UPDATE ... FROM json_to_recordset`` of the hosts
that stamps with the transaction id inline, and an ``INSERT`` per table from a JSON
array (``json_populate_recordset`` over the table's own row type, so the columns follow
the Alembic schema). JSON columns are encoded with orjson and read back as text, as
``lite.py`` does. The models and migrations stay the schema's one definition; the tests
read what these statements wrote back through the ORM.

The PostgreSQL-only locks live here too: the claim lock (``lock_claims``) and the
session-level lock a drain round holds (``session_lock``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import orjson
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from scheduler.db.engine import driver
from scheduler.repo.lite import ClaimRow, dumps


def serves(session: Session) -> bool:
    """True when ``session`` is on PostgreSQL."""
    return session.bind.dialect.name == "postgresql"  # type: ignore[union-attr]


def _conn(session: Session) -> Any:
    return driver(session)  # psycopg.Connection


_COLS = "name, generation, usage::text, layout_rev, admin_state, last_heartbeat, rack, down_since"
_ROW = f"SELECT {_COLS} FROM hosts WHERE name = %s"
_ROW_LOCKED = _ROW + " FOR UPDATE"
_ROW_SKIP_LOCKED = _ROW + " FOR UPDATE SKIP LOCKED"


def _claim_row(r: tuple) -> ClaimRow:
    return ClaimRow(r[0], r[1], orjson.loads(r[2]), r[3], r[4], r[5], r[6], r[7])


def claim_row(session: Session, name: str, *, lock: bool, skip_locked: bool) -> ClaimRow | None | bool:
    """The row, locked with ``lock`` (waiting for another holder) or ``skip_locked`` (not
    waiting); None when no such host; False when another transaction holds its lock."""
    conn = _conn(session)
    got = conn.execute(_ROW_SKIP_LOCKED if skip_locked else _ROW_LOCKED if lock else _ROW, (name,)).fetchone()
    if got is not None:
        return _claim_row(got)
    if skip_locked and conn.execute("SELECT 1 FROM hosts WHERE name = %s", (name,)).fetchone() is not None:
        return False
    return None


# The claim lock (``placement.claim_lock = "store"``): a transaction-level advisory lock,
# released by the commit or rollback. Its key is outside the int4 range that the
# anti-affinity group locks (``hashtext``) use.
CLAIM_LOCK_KEY = int.from_bytes(b"HYBCLAIM", "big")


def lock_claims(session: Session) -> None:
    """Wait for the claim lock, then hold it until this transaction ends. Taken before
    the transaction's first read: a later statement's snapshot sees every claim committed
    by the previous holder (READ COMMITTED takes one per statement)."""
    _conn(session).execute("SELECT pg_advisory_xact_lock(%s)", (CLAIM_LOCK_KEY,))


@contextmanager
def session_lock(engine: Engine, key: int) -> Iterator[bool]:
    """Try the session-level advisory lock ``key`` on a connection of its own, never
    waiting; yields whether it was got, and releases it after the block. Unlike the
    transaction-level locks here it is held across the transactions the block runs on
    other connections (a drain round's)."""
    with engine.connect() as c:
        if not c.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar():
            yield False
            return
        try:
            yield True
        finally:
            c.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
            c.commit()


# The position comes from the same statement (and so the same snapshot) as the rows: the
# oldest transaction still in flight, whose stamp (its transaction id) the next read must
# still ask for. The LEFT JOIN keeps one row when nothing changed.
_FEED = (f"SELECT p.pos, {', '.join('h.' + c for c in _COLS.split(', '))} "
         "FROM (SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS pos) p "
         "LEFT JOIN hosts h ON h.seq >= %s")


def feed(session: Session, position: int) -> tuple[int, list[ClaimRow]]:
    """(next position, hosts stamped at or after ``position``) in one statement."""
    rows = _conn(session).execute(_FEED, (position,)).fetchall()
    return rows[0][0], [_claim_row(r[1:]) for r in rows if r[1] is not None]


_BUMP = ("UPDATE hosts h SET usage = v.u, generation = v.g, updated = %s, "
         "seq = pg_current_xact_id()::text::bigint "
         "FROM json_to_recordset(%s::json) AS v(n text, seen integer, g integer, u json) "
         "WHERE h.name = v.n AND h.generation = v.seen RETURNING 1")


def write_batch(session: Session, bumps: Sequence[tuple[str, int, int, dict[str, Any]]],
                inserts: Sequence[tuple[str, Sequence[str], Sequence[dict[str, Any]]]], now: float) -> int:
    """One statement: each host's new usage iff its generation is the one seen ((name,
    seen generation, new generation, usage dict), stamped with this transaction's id,
    the change feed's stamp on PostgreSQL), and the rows of each (table, columns, rows)
    in ``inserts`` (dicts keyed by column; a column missing from the first row is left
    to its default). Returns the hosts matched. Python None in a JSON column is stored
    as SQL NULL (SQLAlchemy stores JSON ``null``: both read back as None)."""
    ctes, params = [f"b AS ({_BUMP})"], [now, dumps([{"n": n, "seen": seen, "g": g, "u": u} for n, seen, g, u in bumps])]
    for i, (table, columns, rows) in enumerate(inserts):
        cols = ", ".join(c for c in columns if c in rows[0])
        ctes.append(f"i{i} AS (INSERT INTO {table} ({cols}) SELECT {cols} "
                    f"FROM json_populate_recordset(NULL::{table}, %s::json))")
        params.append(dumps(list(rows)))
    return _conn(session).execute(f"WITH {', '.join(ctes)} SELECT count(*) FROM b", params).fetchone()[0]


# By pairs, each one probe of the unique (tenant, idempotency_key) index (a LATERAL
# subquery with LIMIT 1 is never pulled up into a join, so the planner cannot pick a
# scan of vms instead). ``tenant = ANY(..) AND idempotency_key = ANY(..)`` used the
# index on the tenant alone and read every VM of the tenant, and a plain join with the
# unnest went to a hash join over all VMs: 3.2 and 1.3 ms of server CPU per batch at
# ~10,000 VMs, two thirds and then a half of PostgreSQL's CPU in the bench
# (pg_stat_statements).
_BY_KEYS = ("SELECT v.id, v.tenant, v.idempotency_key FROM unnest(%s::text[], %s::text[]) AS k(t, key) "
            "CROSS JOIN LATERAL (SELECT id, tenant, idempotency_key FROM vms "
            "WHERE tenant = k.t AND idempotency_key = k.key LIMIT 1) v")


def ids_by_keys(session: Session, pairs: Sequence[tuple[str, str]]) -> list[tuple[str, str, str]]:
    """(id, tenant, idempotency_key) of the VMs holding any of the (tenant, key) pairs."""
    return _conn(session).execute(_BY_KEYS, ([t for t, _ in pairs], [k for _, k in pairs]),
                                  prepare=False).fetchall()
