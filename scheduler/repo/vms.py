"""VM and audit queries. Keyword-only, take the session, never commit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from functools import cache

from sqlalchemy import JSON, bindparam, func, insert, select
from sqlalchemy.orm import Session

from scheduler.db.models import LIVE, Audit, Host, Vm
from scheduler.errors import VmNotFound
from scheduler.repo import lite, pg


def get_vm(*, session: Session, vm_id: str, tenant: str | None = None) -> Vm:
    vm = session.get(Vm, vm_id)
    if vm is None or (tenant is not None and vm.tenant != tenant):
        raise VmNotFound(f"no VM {vm_id!r}", field="vm_id")
    return vm


def insert_vm(*, session: Session, vm: Vm) -> Vm:
    """INSERT without the unit of work (the claim path's hot statement); ``vm`` stays
    transient, fine for building the response. The unique (tenant, key) fires here."""
    cols = Vm.__table__.columns
    row = {c.key: getattr(vm, c.key) for c in cols}
    deferred = session.info.get(DEFER)
    if deferred is not None:
        deferred["vms"].append(row)
    else:
        session.connection().execute(_insert_vm(), row)
    return vm


DEFER = "hyb_defer"


def defer_inserts(*, session: Session) -> None:
    """From now on ``insert_vm``/``audit`` collect their rows; ``repo.batch.write`` takes
    them (``take_deferred``) and writes them with the batch's host updates (a claim batch:
    same transaction, fewer statements)."""
    session.info[DEFER] = {"vms": [], "audit": []}


def take_deferred(*, session: Session) -> list[tuple[str, tuple[str, ...], frozenset[str], list[dict[str, Any]]]]:
    """The rows collected since ``defer_inserts``, per table that has any: (table, its
    columns, its JSON columns, rows); collecting stops."""
    rows = session.info.pop(DEFER, None) or {}
    return [(table, _columns(model), _json_columns(model), rows[table])
            for table, model in (("vms", Vm), ("audit", Audit)) if rows.get(table)]


@cache
def _columns(model: type) -> tuple[str, ...]:
    return tuple(c.key for c in model.__table__.columns)  # type: ignore[attr-defined]


@cache
def _json_columns(model: type) -> frozenset[str]:
    return frozenset(c.key for c in model.__table__.columns if isinstance(c.type, JSON))  # type: ignore[attr-defined]


@cache
def _insert_vm():  # type: ignore[no-untyped-def]
    return insert(Vm)


@cache
def _insert_audit():  # type: ignore[no-untyped-def]
    return insert(Audit)


@cache
def _by_key():  # type: ignore[no-untyped-def]
    return select(Vm).where(Vm.tenant == bindparam("t"), Vm.idempotency_key == bindparam("k"))


def find_by_key(*, session: Session, tenant: str, key: str) -> Vm | None:
    return session.scalars(_by_key(), {"t": tenant, "k": key}).one_or_none()


def find_by_keys(*, session: Session, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], Vm]:
    """(tenant, key) -> VM for the keys already used (one query for a claim batch). The
    keys are almost always new: the query asks for ids only, and VMs are loaded through
    the ORM only for the replays it finds (an ORM query costs a sixth of a one-VM batch)."""
    if not keys:
        return {}
    want = set(keys)
    found = (lite if lite.serves(session) else pg).ids_by_keys(session, sorted(want))
    hits = [vm_id for vm_id, tenant, key in found if (tenant, key) in want]
    if not hits:
        return {}
    rows = session.scalars(select(Vm).where(Vm.id.in_(hits))).all()
    return {(v.tenant, v.idempotency_key): v for v in rows}


def list_vms(*, session: Session, tenant: str | None = None, host: str | None = None,
             status: str | None = None, name: str | None = None, limit: int = 1000,
             after: str = "") -> Sequence[Vm]:
    q = select(Vm).order_by(Vm.id).limit(limit)
    if tenant is not None:
        q = q.where(Vm.tenant == tenant)
    if host is not None:
        q = q.where(Vm.host == host)
    if status is not None:
        q = q.where(Vm.status == status)
    if name is not None:
        q = q.where(Vm.name == name)
    if after:
        q = q.where(Vm.id > after)
    return session.scalars(q).all()


def live_on_host(*, session: Session, host: str) -> Sequence[Vm]:
    return session.scalars(select(Vm).where(Vm.host == host, Vm.status.in_(LIVE))).all()


def count_live_by_host(*, session: Session) -> dict[str, int]:
    rows = session.execute(select(Vm.host, func.count()).where(Vm.status.in_(LIVE), Vm.host.is_not(None))
                           .group_by(Vm.host))
    return {h: n for h, n in rows}


def group_members(*, session: Session, group: str) -> tuple[frozenset[str], frozenset[str]]:
    """Hosts and racks holding live members of anti-affinity ``group``."""
    if not group:
        return frozenset(), frozenset()
    rows = session.execute(select(Vm.host, Host.rack).join(Host, Host.name == Vm.host)
                           .where(Vm.affinity_group == group, Vm.status.in_(LIVE))).all()
    return frozenset(h for h, _ in rows), frozenset(r for _, r in rows if r)


def audit(*, session: Session, principal: str, action: str, target: str, now: float,
          detail: dict[str, Any] | None = None) -> None:
    row = {"at": now, "principal": principal, "action": action, "target": target, "detail": detail or {}}
    deferred = session.info.get(DEFER)
    if deferred is not None:
        deferred["audit"].append(row)
    else:
        session.connection().execute(_insert_audit(), row)


def list_audit(*, session: Session, limit: int = 100, before_id: int | None = None, since: float | None = None,
               until: float | None = None, principal: str | None = None, action: str | None = None,
               target: str | None = None, tenant: str | None = None) -> Sequence[Audit]:
    """Newest first. ``action`` ending in ``.`` or ``*`` is a prefix (``vm.``); ``tenant``:
    the rows recorded for that tenant's VMs and by that tenant's principals."""
    q = select(Audit).order_by(Audit.id.desc()).limit(limit)
    if before_id is not None:
        q = q.where(Audit.id < before_id)
    if since is not None:
        q = q.where(Audit.at >= since)
    if until is not None:
        q = q.where(Audit.at < until)
    if principal:
        q = q.where(Audit.principal == principal)
    if action:
        q = q.where(Audit.action.startswith(action.rstrip("*"))) if action.endswith((".", "*")) \
            else q.where(Audit.action == action)
    if target:
        q = q.where(Audit.target == target)
    if tenant is not None:
        q = q.where(Audit.detail["tenant"].as_string() == tenant)
    return session.scalars(q).all()
