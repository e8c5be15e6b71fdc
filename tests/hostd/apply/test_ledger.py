"""The ledger on a real SQLite file: claims persist, double booking is refused
by the database, and released resources come back."""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

import pytest

from hostd.apply.ledger import Ledger
from hostd.carve.vmclaim import Claim, ClaimCell, ClaimedDisk, ClaimedVf
from hostd.errors import HostdError, LedgerConflict


def _claim(cpus=(2, 10), vf=("ens1f0", 0), disk="nvme0n1", isolate=False) -> Claim:
    return Claim(node=0, vcpu_pins=cpus, emulator_cpus=(3,) if isolate else (1,), size_kb=2048,
                 pages=256, vfs=(ClaimedVf(vf[0], vf[1], 1000, 100, "52:54:00:00:00:01", 0),),
                 disks=(ClaimedDisk(disk, 100, 10),), emulator_dedicated=isolate)


def test_record_usage_release_and_reopen(tmp_path: Path) -> None:
    db = tmp_path / "ledger.sqlite"
    led = Ledger(db)
    with led.tx() as tx:
        led.record(tx, vm_id="u1", request_id="r1", name="vm1", claim=_claim(isolate=True), spec={"x": 1})
    u = led.usage()
    assert u.cpus == {2, 3, 10}
    assert u.pages == {(0, 2048): 256}
    assert u.vfs == {("ens1f0", 0)} and u.min_rate_mbps == {"ens1f0": 100}
    assert u.disks == {"nvme0n1": (100, 10)}
    led.close()

    led = Ledger(db)  # survives a restart
    rec = led.get(request_id="r1")
    assert rec is not None and rec.claim == _claim(isolate=True) and rec.spec == {"x": 1}
    with led.tx() as tx:
        led.release(tx, "u1")
    assert led.usage().cpus == frozenset() and led.list() == []


@pytest.mark.parametrize("second", [
    dict(cpus=(10, 11), vf=("ens1f0", 1), disk="sdb"),  # CPU 10 again
    dict(cpus=(4, 5), vf=("ens1f0", 0), disk="sdb"),  # same VF
    dict(cpus=(4, 5), vf=("ens1f0", 1), disk="nvme0n1"),  # same disk
])
def test_database_refuses_double_booking_and_keeps_nothing(tmp_path: Path, second) -> None:
    led = Ledger(tmp_path / "l.sqlite")
    with led.tx() as tx:
        led.record(tx, vm_id="u1", request_id="r1", name="vm1", claim=_claim(), spec={})
    before = led.usage()
    with pytest.raises(LedgerConflict):
        with led.tx() as tx:
            led.record(tx, vm_id="u2", request_id="r2", name="vm2", claim=_claim(**second), spec={})
    assert led.usage() == before and [r.vm_id for r in led.list()] == ["u1"]


def test_concurrent_claims_of_one_cpu_one_winner(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    Ledger(path).close()
    results: list[str] = []

    def worker(i: int) -> None:
        led = Ledger(path)  # its own connection, as a second process would have
        try:
            with led.tx() as tx:
                led.record(tx, vm_id=f"u{i}", request_id=f"r{i}", name=f"vm{i}",
                           claim=_claim(vf=("p", i), disk=f"d{i}"), spec={})
            results.append("ok")
        except LedgerConflict:
            results.append("conflict")
        finally:
            led.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["conflict"] * 7 + ["ok"]


def test_spanned_claim_holds_pages_on_each_node(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "l.sqlite")
    spanned = Claim(node=0, vcpu_pins=(2, 3, 20), emulator_cpus=(1,), size_kb=2048, pages=768, vfs=(),
                    disks=(), cells=(ClaimCell(0, 2, 512), ClaimCell(1, 1, 256)))
    with led.tx() as tx:
        led.record(tx, vm_id="u1", request_id="r1", name="vm1", claim=spanned, spec={})
        led.record(tx, vm_id="u2", request_id="r2", name="vm2", claim=_claim(cpus=(4, 5)), spec={})
    assert led.usage().pages == {(0, 2048): 768, (1, 2048): 256}
    assert led.get(vm_id="u1").claim == spanned
    with led.tx() as tx:
        led.release(tx, "u1")
    assert led.usage().pages == {(0, 2048): 256}


_V1 = """
CREATE TABLE vms (vm_id TEXT PRIMARY KEY, request_id TEXT NOT NULL UNIQUE, name TEXT NOT NULL UNIQUE,
    state TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '', node INTEGER NOT NULL, size_kb INTEGER NOT NULL,
    pages INTEGER NOT NULL, claim_json TEXT NOT NULL, spec_json TEXT NOT NULL, created REAL NOT NULL,
    updated REAL NOT NULL);
CREATE TABLE cpu_claims (cpu INTEGER PRIMARY KEY, vm_id TEXT NOT NULL REFERENCES vms ON DELETE CASCADE);
CREATE TABLE vf_claims (pf TEXT NOT NULL, vf INTEGER NOT NULL, min_tx_rate_mbps INTEGER NOT NULL,
    vm_id TEXT NOT NULL REFERENCES vms ON DELETE CASCADE, PRIMARY KEY (pf, vf));
CREATE TABLE disk_claims (disk TEXT PRIMARY KEY, bytes_sec INTEGER NOT NULL, iops INTEGER NOT NULL,
    vm_id TEXT NOT NULL REFERENCES vms ON DELETE CASCADE);
PRAGMA user_version=1;
"""


def test_version_1_ledger_is_upgraded_in_place(tmp_path: Path) -> None:
    """A ledger written by the previous hostd (schema 1, the exact DDL it shipped):
    its VMs keep their pages after the upgrade, and release still frees them."""
    path = tmp_path / "l.sqlite"
    db = sqlite3.connect(path)
    db.executescript(_V1)
    old = _claim()
    db.execute("INSERT INTO vms VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
               ("u1", "r1", "vm1", "running", "", 1, 2048, 256, json.dumps(old.to_dict()), "{}", 1.0, 1.0))
    db.commit()
    db.close()
    led = Ledger(path)
    assert led._db.execute("PRAGMA user_version").fetchone()[0] == 2
    assert led.usage().pages == {(1, 2048): 256}
    assert led.get(vm_id="u1").claim == old
    with led.tx() as tx:
        led.release(tx, "u1")
    assert led.usage().pages == {}
    led.close()
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version=7")
    db.commit()
    db.close()
    with pytest.raises(HostdError, match="schema 7, this hostd knows up to 2"):
        Ledger(path)
