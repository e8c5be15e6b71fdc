"""The claim batch's statements on SQLite, run on the driver connection of the caller's
transaction.

A one-VM claim batch runs seven statements (feed position and changes, key lookup,
change stamp, host update, VM and audit inserts). Through SQLAlchemy each cost far more
Python than SQLite spends on it: on a one-VM batch the execution machinery (contexts,
parameter processing, result wrappers) and the JSON columns' encoders take a third of
the claim thread's CPU. These functions send the same SQL to ``sqlite3`` directly, in the
same transaction (the Session's own connection: commit and rollback are unchanged), and
encode/decode JSON columns as SQLAlchemy's ``JSON`` type stores them on SQLite (text;
Python None as JSON ``null``). ``pg.py`` does the same for PostgreSQL.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import orjson
from sqlalchemy.orm import Session

from scheduler.db.engine import driver

_JSON_OPTS = orjson.OPT_NON_STR_KEYS


def dumps(v: Any) -> str:
    return orjson.dumps(v, option=_JSON_OPTS).decode()


def serves(session: Session) -> bool:
    """True when ``session`` is on SQLite: the repo functions then call this module."""
    return session.bind.dialect.name == "sqlite"  # type: ignore[union-attr]


def cursor(session: Session) -> sqlite3.Cursor:
    return driver(session).cursor()


class ClaimRow(NamedTuple):
    """``repo.hosts.CLAIM_COLUMNS`` of one host, usage decoded."""

    name: str
    generation: int
    usage: dict[str, Any]
    layout_rev: int
    admin_state: str
    last_heartbeat: float
    rack: str
    down_since: float | None = None  # the feed's rows carry it (the liveness marks, in memory)


_CHANGED = ("SELECT name, generation, usage, layout_rev, admin_state, last_heartbeat, rack, down_since "
            "FROM hosts WHERE seq >= ?")


def changed_since(session: Session, position: int) -> list[ClaimRow]:
    return [ClaimRow(n, g, orjson.loads(u), rev, st, hb, rack, down)
            for n, g, u, rev, st, hb, rack, down in cursor(session).execute(_CHANGED, (position,))]


def counter(session: Session) -> int:
    return cursor(session).execute("SELECT seq FROM fleet WHERE id = 1").fetchone()[0]


def next_seq(session: Session) -> int:
    return cursor(session).execute("UPDATE fleet SET seq = seq + 1 WHERE id = 1 RETURNING seq").fetchone()[0]


class Quiet(NamedTuple):
    name: str
    last_heartbeat: float


def quiet(session: Session, before: float) -> list[Quiet]:
    return [Quiet(*r) for r in cursor(session).execute(
        "SELECT name, last_heartbeat FROM hosts WHERE last_heartbeat < ?", (before,))]


def bump_many(session: Session, rows: Iterable[tuple[str, int, int, dict[str, Any]]], now: float, seq: int) -> int:
    """(name, seen generation, new generation, usage dict) -> rows matched."""
    cur = cursor(session)
    cur.executemany("UPDATE hosts SET usage = ?, generation = ?, updated = ?, seq = ? WHERE name = ? AND generation = ?",
                    [(dumps(u), g, now, seq, n, seen) for n, seen, g, u in rows])
    return cur.rowcount


def ids_by_keys(session: Session, pairs: Sequence[tuple[str, str]]) -> list[tuple[str, str, str]]:
    """(id, tenant, idempotency_key) of VMs whose tenant and key are among those of the
    (tenant, key) pairs, a superset of the pairs' VMs (the unique (tenant,
    idempotency_key) index serves both IN lists)."""
    tenants, keys = sorted({t for t, _ in pairs}), sorted({k for _, k in pairs})
    sql = (f"SELECT id, tenant, idempotency_key FROM vms WHERE tenant IN ({','.join('?' * len(tenants))}) "
           f"AND idempotency_key IN ({','.join('?' * len(keys))})")
    return cursor(session).execute(sql, (*tenants, *keys)).fetchall()


def insert_many(session: Session, table: str, columns: Sequence[str], json_columns: frozenset[str],
                rows: Sequence[dict[str, Any]]) -> None:
    """INSERT ``rows`` (dicts keyed by column) with one executemany; a column missing
    from a row is left to its default only if it is missing from every row."""
    cols = [c for c in columns if c in rows[0]]
    sql = f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
    enc = [c in json_columns for c in cols]
    cursor(session).executemany(sql, [tuple(dumps(r[c]) if j else r[c] for c, j in zip(cols, enc)) for r in rows])
