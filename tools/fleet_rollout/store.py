"""The rollout's durable state: SQLite (WAL), one row per host, one row per transition.

Every transition is a compare-and-set on the host's state, written together with its
record (the decision and its measured numbers) in one transaction, and only while the
writer holds the rollout's lease: a controller whose lease lapsed and was taken over
cannot write behind its successor's back (the lease is the fencing token).

The lease has a TTL; the holder renews it. A controller killed by SIGKILL leaves a
lease that lapses after the TTL, so the next ``run`` takes over without an operator.

A database error (a full disk, an unreadable file) is a ``StoreError`` of one line
naming the file and the cause; the transaction it happened in is rolled back, so a
run after the cause is gone resumes from the last transition that was written.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tools.fleet_rollout.inventory import Host
from tools.fleet_rollout.plan import Plan
from tools.fleet_rollout.spec import RolloutSpec

SCHEMA = """
CREATE TABLE IF NOT EXISTS rollouts (
  name TEXT PRIMARY KEY, spec TEXT NOT NULL, state TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '',
  wave INTEGER NOT NULL DEFAULT 0, waves INTEGER NOT NULL, skipped TEXT NOT NULL,
  created REAL NOT NULL, updated REAL NOT NULL);
CREATE TABLE IF NOT EXISTS hosts (
  rollout TEXT NOT NULL, name TEXT NOT NULL, wave INTEGER NOT NULL, seq INTEGER NOT NULL,
  rack TEXT NOT NULL, address TEXT NOT NULL, host TEXT NOT NULL, state TEXT NOT NULL,
  data TEXT NOT NULL DEFAULT '{}', updated REAL NOT NULL, PRIMARY KEY (rollout, name));
CREATE INDEX IF NOT EXISTS hosts_state ON hosts (rollout, wave, state);
CREATE TABLE IF NOT EXISTS transitions (
  id INTEGER PRIMARY KEY AUTOINCREMENT, rollout TEXT NOT NULL, host TEXT NOT NULL,
  from_state TEXT NOT NULL, to_state TEXT NOT NULL, at REAL NOT NULL, holder TEXT NOT NULL,
  detail TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS transitions_host ON transitions (rollout, host, id);
CREATE TABLE IF NOT EXISTS leases (
  rollout TEXT PRIMARY KEY, holder TEXT NOT NULL, expires REAL NOT NULL);
"""

ROLLOUT = "-"  # the host column of a rollout-level transition (state, wave, pause...)


class StoreError(RuntimeError):
    pass


def _failed(path: Path, e: sqlite3.Error) -> StoreError:
    return StoreError(f"rollout state {path}: {e}")


class LeaseHeld(StoreError):
    def __init__(self, rollout: str, holder: str, expires: float):
        super().__init__(f"rollout {rollout} is being run by {holder} (lease until "
                         f"{time.strftime('%H:%M:%S', time.localtime(expires))}; it lapses if that run dies)")
        self.holder = holder


class LeaseLost(StoreError):
    pass


class StaleState(StoreError):
    """The host was not in the state the writer thought (another writer moved it)."""


@dataclass
class HostRow:
    name: str
    wave: int
    seq: int
    rack: str
    address: str
    host: Host
    state: str
    data: dict
    updated: float


@dataclass
class RolloutRow:
    name: str
    spec: RolloutSpec
    state: str
    reason: str
    wave: int
    waves: int
    skipped: list[dict]
    created: float
    updated: float


def default_holder() -> str:
    return f"{os.environ.get('USER', 'root')}@{socket.gethostname()}:{os.getpid()}"


def dead_here(holder: str) -> bool:
    """``holder`` (a default_holder) names a process of this machine that is gone."""
    where, _, pid = holder.rpartition(":")
    if not where.endswith("@" + socket.gethostname()) or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


class Store:
    def __init__(self, path: Path, holder: str | None = None):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.holder = holder or default_holder()
        try:
            self.db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: a commit survives a process kill
            self.db.executescript(SCHEMA)
        except sqlite3.Error as e:
            raise _failed(path, e) from None
        self.lock = threading.RLock()  # one connection, shared by the controller's threads

    def _q(self, sql: str, args: tuple = ()) -> list[tuple]:
        with self.lock:
            try:
                return self.db.execute(sql, args).fetchall()
            except sqlite3.Error as e:
                raise _failed(self.path, e) from None

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        with self.lock:
            try:
                self.db.execute("BEGIN IMMEDIATE")
                try:
                    yield self.db
                    self.db.execute("COMMIT")
                except BaseException:
                    if self.db.in_transaction:
                        self.db.execute("ROLLBACK")
                    raise
            except sqlite3.Error as e:
                raise _failed(self.path, e) from None

    # ------------------------------------------------------------ rollouts

    def create(self, spec: RolloutSpec, plan: Plan) -> None:
        now = time.time()
        with self.tx() as db:
            if db.execute("SELECT 1 FROM rollouts WHERE name=?", (spec.name,)).fetchone():
                raise StoreError(f"rollout {spec.name} exists (status, resume, or rollback it)")
            db.execute("INSERT INTO rollouts VALUES (?,?,?,?,?,?,?,?,?)",
                       (spec.name, spec.to_json(), "running", "", 0, len(plan.waves),
                        json.dumps([{"host": h.name, "reason": r} for h, r in plan.skipped]), now, now))
            seq = 0
            rows = []
            for w, hosts in enumerate(plan.waves):
                for h in hosts:
                    rows.append((spec.name, h.name, w, seq, h.rack, h.address, json.dumps(h.to_dict()),
                                 "pending", "{}", now))
                    seq += 1
            db.executemany("INSERT INTO hosts VALUES (?,?,?,?,?,?,?,?,?,?)", rows)
            self._record(db, spec.name, ROLLOUT, "", "running", now, {"hosts": seq, "waves": len(plan.waves)})

    def rollout(self, name: str) -> RolloutRow:
        rows = self._q("SELECT * FROM rollouts WHERE name=?", (name,))
        if not rows:
            raise StoreError(f"no rollout named {name} in {self.path}")
        r = rows[0]
        return RolloutRow(r[0], RolloutSpec.from_json(r[1]), r[2], r[3], r[4], r[5], json.loads(r[6]), r[7], r[8])

    def state(self, name: str) -> tuple[str, int]:
        """(state, wave): what a running controller polls, without the spec."""
        rows = self._q("SELECT state, wave FROM rollouts WHERE name=?", (name,))
        if not rows:
            raise StoreError(f"no rollout named {name} in {self.path}")
        return rows[0][0], rows[0][1]

    def rollouts(self) -> list[str]:
        return [r[0] for r in self._q("SELECT name FROM rollouts ORDER BY created")]

    def set_rollout(self, name: str, state: str, reason: str = "", *, wave: int | None = None,
                    fenced: bool = True, detail: dict | None = None) -> None:
        """Rollout-level transition. Operator commands (pause, abort) are not fenced: they
        are how an operator talks to a running controller."""
        now = time.time()
        with self.tx() as db:
            if fenced:
                self._check_lease(db, name, now)
            cur = db.execute("SELECT state, wave FROM rollouts WHERE name=?", (name,)).fetchone()
            if cur is None:
                raise StoreError(f"no rollout named {name}")
            db.execute("UPDATE rollouts SET state=?, reason=?, wave=?, updated=? WHERE name=?",
                       (state, reason, cur[1] if wave is None else wave, now, name))
            self._record(db, name, ROLLOUT, cur[0], state, now, {"reason": reason, "wave": wave, **(detail or {})})

    # ------------------------------------------------------------ hosts

    _HOST_COLS = "SELECT name, wave, seq, rack, address, host, state, data, updated FROM hosts WHERE rollout=?"

    @staticmethod
    def _host_row(r: tuple) -> HostRow:
        return HostRow(r[0], r[1], r[2], r[3], r[4], Host.from_dict(json.loads(r[5])), r[6], json.loads(r[7]), r[8])

    def hosts(self, name: str, *, wave: int | None = None) -> list[HostRow]:
        q, args = self._HOST_COLS, (name,)
        if wave is not None:
            q, args = q + " AND wave=?", (name, wave)
        return [self._host_row(r) for r in self._q(q + " ORDER BY seq", args)]

    def brief(self, name: str, *, wave: int | None = None) -> list[HostRow]:
        """Hosts without their recorded data (baselines are large), for scheduling: ``data``
        holds only ``rollback_failed``, ``host`` only name, address and rack."""
        q = ("SELECT name, wave, seq, rack, address, state, json_extract(data, '$.rollback_failed'), updated "
             "FROM hosts WHERE rollout=?")
        args: tuple = (name,)
        if wave is not None:
            q, args = q + " AND wave=?", (name, wave)
        return [HostRow(r[0], r[1], r[2], r[3], r[4], Host(r[0], r[4], r[3]), r[5],
                        {"rollback_failed": r[6]} if r[6] else {}, r[7]) for r in self._q(q + " ORDER BY seq", args)]

    def host(self, name: str, host: str) -> HostRow:
        rows = self._q(self._HOST_COLS + " AND name=?", (name, host))
        if not rows:
            raise StoreError(f"rollout {name} has no host {host}")
        return self._host_row(rows[0])

    def move(self, name: str, host: str, frm: str, to: str, detail: dict | None = None,
             data: dict | None = None) -> None:
        """host: ``frm`` -> ``to``, with the decision's record; ``data`` merges into the
        host's durable data (what later steps need: the baseline, the prior state)."""
        now = time.time()
        with self.tx() as db:
            self._check_lease(db, name, now)
            r = db.execute("SELECT state, data FROM hosts WHERE rollout=? AND name=?", (name, host)).fetchone()
            if r is None or r[0] != frm:
                raise StaleState(f"{host}: expected state {frm}, found {r[0] if r else 'nothing'}")
            merged = {**json.loads(r[1]), **(data or {})}
            db.execute("UPDATE hosts SET state=?, data=?, updated=? WHERE rollout=? AND name=?",
                       (to, json.dumps(merged), now, name, host))
            self._record(db, name, host, frm, to, now, detail or {})

    def note(self, name: str, host: str, detail: dict) -> None:
        """A record without a state change (a retried RPC, an undecided gate)."""
        now = time.time()
        with self.tx() as db:
            self._check_lease(db, name, now)
            r = db.execute("SELECT state FROM hosts WHERE rollout=? AND name=?", (name, host)).fetchone()
            if r is None:
                raise StoreError(f"rollout {name} has no host {host}")
            self._record(db, name, host, r[0], r[0], now, detail)

    def _record(self, db: sqlite3.Connection, name: str, host: str, frm: str, to: str, at: float,
                detail: dict) -> None:
        """One transition's row (inside the caller's transaction): who, when, and the numbers."""
        db.execute("INSERT INTO transitions (rollout, host, from_state, to_state, at, holder, detail) "
                   "VALUES (?,?,?,?,?,?,?)", (name, host, frm, to, at, self.holder, json.dumps(detail)))

    def transitions(self, name: str, host: str | None = None) -> list[dict]:
        q = "SELECT id, host, from_state, to_state, at, holder, detail FROM transitions WHERE rollout=?"
        args: tuple = (name,)
        if host is not None:
            q += " AND host=?"
            args += (host,)
        return [{"id": r[0], "host": r[1], "from": r[2], "to": r[3], "at": r[4], "holder": r[5],
                 "detail": json.loads(r[6])} for r in self._q(q + " ORDER BY id", args)]

    # ------------------------------------------------------------ lease

    def acquire(self, name: str, ttl_s: float) -> None:
        """Take the rollout's lease: refused (LeaseHeld) while another holder's is live.
        A holder on this machine whose process is gone is not live, whatever its TTL
        says (a run that died where it could not release, as on a full disk)."""
        now = time.time()
        with self.tx() as db:
            r = db.execute("SELECT holder, expires FROM leases WHERE rollout=?", (name,)).fetchone()
            if r and r[0] != self.holder and r[1] > now and not dead_here(r[0]):
                raise LeaseHeld(name, r[0], r[1])
            db.execute("INSERT INTO leases VALUES (?,?,?) ON CONFLICT(rollout) DO UPDATE SET holder=excluded.holder,"
                       " expires=excluded.expires", (name, self.holder, now + ttl_s))

    def renew(self, name: str, ttl_s: float) -> None:
        now = time.time()
        with self.tx() as db:
            self._check_lease(db, name, now)
            db.execute("UPDATE leases SET expires=? WHERE rollout=?", (now + ttl_s, name))

    def release(self, name: str) -> None:
        with self.tx() as db:
            db.execute("DELETE FROM leases WHERE rollout=? AND holder=?", (name, self.holder))

    def lease(self, name: str) -> tuple[str, float] | None:
        rows = self._q("SELECT holder, expires FROM leases WHERE rollout=?", (name,))
        return (rows[0][0], rows[0][1]) if rows else None

    def _check_lease(self, db: sqlite3.Connection, name: str, now: float) -> None:
        r = db.execute("SELECT holder, expires FROM leases WHERE rollout=?", (name,)).fetchone()
        if r is None or r[0] != self.holder or r[1] <= now:
            raise LeaseLost(f"rollout {name}: this controller ({self.holder}) no longer holds the lease"
                            + (f" ({r[0]} does)" if r and r[0] != self.holder else ""))
