"""hostd's local ledger of VMs and the resources each one holds (SQLite, WAL).

One row per VM with its state and claim; the claim tables hold a row per CPU,
VF and disk so the database itself refuses double booking (primary keys), even
if two hostd processes ever ran against one file, and a row per (VM, node, page
size) for hugepages (a VM spanning nodes holds pages on each). Writes use BEGIN
IMMEDIATE so a check-then-claim is one transaction.

One connection serves every thread of the daemon (gRPC workers, libvirt's event
handlers): a lock keeps each transaction, and each read, whole, so a thread never
begins a transaction inside another thread's nor reads its uncommitted rows.

Schema versions (``PRAGMA user_version``), each upgrade one transaction at open:
1 -> 2 adds ``page_claims`` (from ``vms.node/size_kb/pages``, which stay: the VM's
first node and its total).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from hostd.carve.vmclaim import Claim, Usage
from hostd.errors import BadState, LedgerConflict

SCHEMA_VERSION = 2
_PAGES = """
CREATE TABLE page_claims (
    vm_id TEXT NOT NULL REFERENCES vms ON DELETE CASCADE, node INTEGER NOT NULL,
    size_kb INTEGER NOT NULL, pages INTEGER NOT NULL, PRIMARY KEY (vm_id, node, size_kb))
"""
_SCHEMA = """
CREATE TABLE vms (
    vm_id TEXT PRIMARY KEY,
    request_id TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL UNIQUE,
    state TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    node INTEGER NOT NULL,
    size_kb INTEGER NOT NULL,
    pages INTEGER NOT NULL,
    claim_json TEXT NOT NULL,
    spec_json TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE cpu_claims (cpu INTEGER PRIMARY KEY, vm_id TEXT NOT NULL REFERENCES vms ON DELETE CASCADE);
CREATE TABLE vf_claims (
    pf TEXT NOT NULL, vf INTEGER NOT NULL, min_tx_rate_mbps INTEGER NOT NULL,
    vm_id TEXT NOT NULL REFERENCES vms ON DELETE CASCADE, PRIMARY KEY (pf, vf));
CREATE TABLE disk_claims (
    disk TEXT PRIMARY KEY, bytes_sec INTEGER NOT NULL, iops INTEGER NOT NULL,
    vm_id TEXT NOT NULL REFERENCES vms ON DELETE CASCADE);
""" + _PAGES + """;
"""
# version -> statements that bring a ledger of that version to the next
_UPGRADES = {
    1: (_PAGES, "INSERT INTO page_claims SELECT vm_id, node, size_kb, pages FROM vms"),
}


class VmState(StrEnum):
    """A ledger row's state, and the state hostd reports for a VM (WatchEvents,
    ListVMs, the ``hostd_vms`` gauge)."""
    CREATING = "creating"
    RUNNING = "running"
    STOPPED = "stopped"
    FAILED = "failed"
    DELETING = "deleting"
    INCOMING = "incoming"  # a live migration's target, its QEMU receiving
    MIGRATING = "migrating"  # a live migration's source, its job running
    DELETED = "deleted"  # never a row's: the event that a VM's row is gone


# Rows a call in progress owns (CreateVM, DeleteVM, a migration on either side):
# libvirt's lifecycle events and the reconcile leave them to that call
CALL_OWNED = frozenset({VmState.CREATING, VmState.DELETING, VmState.INCOMING, VmState.MIGRATING})
# Rows whose QEMU runs or may be running: an uncarve is refused while one exists,
# whatever the caller says of a drain
ON_HOST = CALL_OWNED | {VmState.RUNNING}


@dataclass(frozen=True)
class VmRecord:
    vm_id: str
    request_id: str
    name: str
    state: str
    reason: str
    claim: Claim
    spec: dict
    created: float


class Ledger:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, timeout=10, isolation_level=None, check_same_thread=False)
        self._lock = threading.RLock()  # a transaction (or a read) at a time on _db
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.execute("PRAGMA synchronous=FULL")
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version == 0:
            with self.tx() as db:
                for stmt in filter(str.strip, _SCHEMA.split(";")):
                    db.execute(stmt)
                db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            version = SCHEMA_VERSION
        elif version > SCHEMA_VERSION:
            raise BadState(f"ledger {path} has schema {version}, this hostd knows up to {SCHEMA_VERSION}",
                             field="state_dir")
        while version < SCHEMA_VERSION:
            with self.tx() as db:
                for stmt in _UPGRADES[version]:
                    db.execute(stmt)
                version += 1
                db.execute(f"PRAGMA user_version={version}")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def usage(self, db: sqlite3.Connection | None = None) -> Usage:
        if db is None:
            with self._lock:
                return self.usage(self._db)
        pages: dict[tuple[int, int], int] = {}
        for node, size, n in db.execute("SELECT node, size_kb, SUM(pages) FROM page_claims GROUP BY node, size_kb"):
            pages[(node, size)] = n
        min_rate: dict[str, int] = {}
        for pf, r in db.execute("SELECT pf, SUM(min_tx_rate_mbps) FROM vf_claims GROUP BY pf"):
            min_rate[pf] = r
        return Usage(
            cpus=frozenset(r[0] for r in db.execute("SELECT cpu FROM cpu_claims")),
            pages=pages,
            vfs=frozenset((pf, vf) for pf, vf in db.execute("SELECT pf, vf FROM vf_claims")),
            min_rate_mbps=min_rate,
            disks={d: (b, i) for d, b, i in db.execute("SELECT disk, bytes_sec, iops FROM disk_claims")},
        )

    def record(self, db: sqlite3.Connection, *, vm_id: str, request_id: str, name: str,
               claim: Claim, spec: dict, state: str = VmState.CREATING) -> None:
        """Insert a VM and its claim rows; primary keys refuse any double booking."""
        now = time.time()
        with _conflicts():
            db.execute("INSERT INTO vms VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                       (vm_id, request_id, name, state, "", claim.node, claim.size_kb, claim.pages,
                        json.dumps(claim.to_dict()), json.dumps(spec), now, now))
            db.executemany("INSERT INTO cpu_claims VALUES (?,?)",
                           [(c, vm_id) for c in claim.dedicated_cpus])
            db.executemany("INSERT INTO page_claims VALUES (?,?,?,?)",
                           [(vm_id, c.node, claim.size_kb, c.pages) for c in claim.numa_cells])
            _insert_rates(db, vm_id, claim)

    def update_claim(self, db: sqlite3.Connection, vm_id: str, claim: Claim, spec: dict) -> None:
        """Replace a VM's claim rows (same CPUs/VFs/disks, new rates and budgets)."""
        db.execute("UPDATE vms SET claim_json=?, spec_json=?, updated=? WHERE vm_id=?",
                   (json.dumps(claim.to_dict()), json.dumps(spec), time.time(), vm_id))
        db.execute("DELETE FROM vf_claims WHERE vm_id=?", (vm_id,))
        db.execute("DELETE FROM disk_claims WHERE vm_id=?", (vm_id,))
        with _conflicts():
            _insert_rates(db, vm_id, claim)

    def set_state(self, vm_id: str, state: str, reason: str = "", *, updated: float | None = None) -> None:
        """``updated``: the row's time of change, when a change is undone (default: now)."""
        with self.tx() as db:
            db.execute("UPDATE vms SET state=?, reason=?, updated=? WHERE vm_id=?",
                       (state, reason, time.time() if updated is None else updated, vm_id))

    def updated(self, vm_id: str) -> float | None:
        with self._lock:
            row = self._db.execute("SELECT updated FROM vms WHERE vm_id=?", (vm_id,)).fetchone()
        return None if row is None else float(row[0])

    def release(self, db: sqlite3.Connection, vm_id: str) -> None:
        db.execute("DELETE FROM vms WHERE vm_id=?", (vm_id,))

    def get(self, *, vm_id: str | None = None, request_id: str | None = None) -> VmRecord | None:
        col, val = ("vm_id", vm_id) if vm_id is not None else ("request_id", request_id)
        with self._lock:
            row = self._db.execute(f"SELECT * FROM vms WHERE {col}=?", (val,)).fetchone()
        return _record(row) if row else None

    def list(self) -> list[VmRecord]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM vms ORDER BY created").fetchall()
        return [_record(r) for r in rows]


@contextmanager
def _conflicts() -> Iterator[None]:
    try:
        yield
    except sqlite3.IntegrityError as e:
        raise LedgerConflict(f"claim conflicts with the ledger: {e}", field="claim") from None


def _insert_rates(db: sqlite3.Connection, vm_id: str, claim: Claim) -> None:
    """The VF and disk rows of a claim (with the rates and budgets they hold)."""
    db.executemany("INSERT INTO vf_claims VALUES (?,?,?,?)",
                   [(v.pf, v.index, v.min_tx_rate_mbps, vm_id) for v in claim.vfs])
    db.executemany("INSERT INTO disk_claims VALUES (?,?,?,?)",
                   [(d.name, d.bytes_sec, d.iops, vm_id) for d in claim.disks])


def _record(row: tuple) -> VmRecord:
    vm_id, request_id, name, state, reason, _n, _s, _p, claim_json, spec_json, created, _u = row
    claim = Claim.from_dict(json.loads(claim_json))
    return VmRecord(vm_id, request_id, name, state, reason, claim, json.loads(spec_json), created)
