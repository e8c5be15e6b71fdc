"""What operators see of a VM's live move (issue 38, item 5), in one place: the records
the migration service keeps on the VM's row (``vms.migration_progress``,
``vms.last_migration``; migration 0019) and the JSON the API, the drain view, hybctl and
the console show of them (``migration`` and ``last_migration`` on a VM).

No hostd is asked per read: the scheduler driving a move samples the source's
GetMigration every ``migration.progress_s`` while MigrateVM runs and writes the sample on
the row, so any replica answers from it, with the sample's age.
"""

from __future__ import annotations

from typing import Any

from api import hostd_pb2 as pb
from api.states import MigrationPhase, MigrationResult, MigrationState
from scheduler.db.models import Vm

SAMPLE_FIELDS = ("elapsed_ms", "memory_remaining_bytes", "disk_remaining_bytes", "memory_bps", "expected_downtime_ms")


def progress_record(started: float) -> dict[str, Any]:
    """The row's record of a move just asked: when (no sample yet)."""
    return {"started": started}


def with_sample(record: dict[str, Any] | None, p: pb.MigrationProgress, at: float) -> dict[str, Any]:
    """``record`` with the source's GetMigration answer taken at ``at``. A sample of no
    job (not started yet, or ended) keeps the last figures and says the job is not active."""
    rec = dict(record or {})
    last = rec.get("sample") or {}
    if p.active:
        rec["sample"] = {"at": at, "active": True, **{k: int(getattr(p, k)) for k in SAMPLE_FIELDS}}
    elif last:
        rec["sample"] = {**last, "active": False}
    return rec


def settling(record: dict[str, Any] | None) -> dict[str, Any]:
    """``record`` once MigrateVM answered: the job is over, the move is being completed
    on the target or undone."""
    return {**(record or {}), "settling": True}


def phase_of(state: str, record: dict[str, Any] | None) -> MigrationPhase:
    """The rule for ``migration.phase`` (api/states.py MigrationPhase)."""
    rec = record or {}
    if state == MigrationState.PREPARING:
        return MigrationPhase.PREPARING
    s = rec.get("sample")
    if rec.get("settling") or (s and not s.get("active")):
        return MigrationPhase.SETTLING
    if not s:
        return MigrationPhase.STARTING
    return MigrationPhase.DISKS if s.get("disk_remaining_bytes") else MigrationPhase.MEMORY


def last_record(*, source: str, target: str, result: MigrationResult, reason: str, record: dict[str, Any] | None,
                finished: float, job_ms: int = 0, downtime_ms: int = 0, data_bytes: int = 0) -> dict[str, Any]:
    """The row's record of a move that ended. A failed move's job time is its last
    sample's (libvirt keeps no record of a cancelled job), its downtime 0 (the guest
    never switched over)."""
    rec = record or {}
    started = float(rec.get("started") or 0.0)
    if not job_ms:
        job_ms = int((rec.get("sample") or {}).get("elapsed_ms", 0))
    return {"from_host": source, "to_host": target, "result": str(result), "reason": reason, "started": started,
            "finished": finished, "total_s": round(finished - started, 3) if started else None,
            "job_ms": int(job_ms), "downtime_ms": int(downtime_ms), "data_bytes": int(data_bytes)}


def migration_json(vm: Vm, now: float) -> dict[str, Any] | None:
    """``migration`` on a VM (schemas/vms.py MigrationOut): the move under way, None when
    none runs."""
    if not vm.migration_state:
        return None
    rec = vm.migration_progress or {}
    s = rec.get("sample")
    progress = None if not s else {
        "sampled_at": s["at"], "age_s": round(max(0.0, now - s["at"]), 3), "active": bool(s.get("active")),
        **{k: int(s.get(k, 0)) for k in SAMPLE_FIELDS}}
    return {"target_host": vm.migration_host or "", "state": vm.migration_state, "since": vm.migration_at,
            "started": float(rec.get("started") or 0.0), "phase": str(phase_of(vm.migration_state, rec)),
            "progress": progress}


def last_migration_json(vm: Vm) -> dict[str, Any] | None:
    """``last_migration`` on a VM (schemas/vms.py LastMigrationOut): the last move's end."""
    return dict(vm.last_migration) if vm.last_migration else None
