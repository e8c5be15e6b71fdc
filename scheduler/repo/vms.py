"""VM queries. Keyword-only, take the session, never commit."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from functools import cache

from sqlalchemy import bindparam, func, insert, or_, select, update
from sqlalchemy.orm import Session

from scheduler.db.models import LIVE, Host, Vm
from scheduler.errors import VmNotFound
from scheduler.repo import batch, lite, pg


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
    deferred = batch.deferred(session=session, table="vms")
    if deferred is not None:
        deferred.append(row)
    else:
        session.connection().execute(_insert_vm(), row)
    return vm


@cache
def _insert_vm():  # type: ignore[no-untyped-def]
    return insert(Vm)


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


def drain_rows(*, session: Session, hosts: Collection[str]) -> tuple[list[Vm], list[Vm]]:
    """What a drain of ``hosts`` plans over: (their VMs, not the replacements on them;
    every other VM of those VMs' disruption groups anywhere, and the replacements of
    those VMs)."""
    on = list(session.scalars(select(Vm).where(Vm.host.in_(list(hosts)), Vm.replaces.is_(None))).all()) \
        if hosts else []
    groups = {v.disruption_group for v in on if v.disruption_group}
    ids = [v.id for v in on]
    seen = set(ids)
    more: list[Vm] = []
    if groups or ids:
        for v in session.scalars(select(Vm).where(or_(Vm.disruption_group.in_(groups), Vm.replaces.in_(ids)))).all():
            if v.id not in seen:
                seen.add(v.id)
                more.append(v)
    return on, more


def set_status(*, session: Session, vm_id: str, expect: Collection[str], status: str, reason: str,
               now: float) -> bool:
    """``status`` and ``reason`` iff the VM's status is one of ``expect`` (one conditional
    UPDATE: two replicas cannot both move it); False when it was not."""
    hit = session.execute(update(Vm).where(Vm.id == vm_id, Vm.status.in_(list(expect)))
                          .values(status=status, reason=reason, updated=now))
    return hit.rowcount == 1


def set_note(*, session: Session, vm_id: str, note: str, prefix: str) -> bool:
    """Set (or clear, with "") a note in the VM's reason, over an empty reason or a note of
    the same kind (one that starts with ``prefix``) only: another reason (a host's silence
    flag) stays. False when nothing was written (the same note, or another reason)."""
    hit = session.execute(update(Vm).where(Vm.id == vm_id, Vm.reason != note,
                                           or_(Vm.reason == "", Vm.reason.startswith(prefix)))
                          .values(reason=note))
    return hit.rowcount == 1


def clear_replaces(*, session: Session, vm_id: str, old: str) -> None:
    """``vm_id`` no longer names ``old`` as the VM it replaces (that one is gone)."""
    session.execute(update(Vm).where(Vm.id == vm_id, Vm.replaces == old).values(replaces=None))


def live_on_host(*, session: Session, host: str) -> Sequence[Vm]:
    return session.scalars(select(Vm).where(Vm.host == host, Vm.status.in_(LIVE))).all()


def count_live_by_host(*, session: Session) -> dict[str, int]:
    rows = session.execute(select(Vm.host, func.count()).where(Vm.status.in_(LIVE), Vm.host.is_not(None))
                           .group_by(Vm.host))
    return {h: n for h, n in rows}


def count_by_status(*, session: Session) -> dict[str, int]:
    return {st: n for st, n in session.execute(select(Vm.status, func.count()).group_by(Vm.status))}


def group_members(*, session: Session, group: str, ignore: str = "") -> tuple[frozenset[str], frozenset[str]]:
    """Hosts and racks holding live members of anti-affinity ``group``, and the targets
    of members moving live (they will be there); ``ignore``: a VM not counted (the one
    moving, not against itself)."""
    if not group:
        return frozenset(), frozenset()
    rows = list(session.execute(select(Vm.host, Host.rack).join(Host, Host.name == Vm.host)
                                .where(Vm.affinity_group == group, Vm.status.in_(LIVE), Vm.id != ignore)).all())
    rows += session.execute(select(Vm.migration_host, Host.rack).join(Host, Host.name == Vm.migration_host)
                            .where(Vm.affinity_group == group, Vm.id != ignore)).all()
    return frozenset(h for h, _ in rows), frozenset(r for _, r in rows if r)


def incoming_on_host(*, session: Session, host: str) -> Sequence[Vm]:
    """VMs moving live to ``host``: they hold their target claim there."""
    return session.scalars(select(Vm).where(Vm.migration_host == host)).all()


def moving(*, session: Session) -> Sequence[Vm]:
    """Every VM with a live move under way (or left by a scheduler that stopped)."""
    return session.scalars(select(Vm).where(Vm.migration_state != "").order_by(Vm.id)).all()


def moving_at(*, session: Session, host: str, tenant: str | None = None) -> Sequence[Vm]:
    """The VMs moving live from or to ``host`` (of ``tenant`` only, when given)."""
    q = select(Vm).where(Vm.migration_state != "", or_(Vm.host == host, Vm.migration_host == host))
    if tenant is not None:
        q = q.where(Vm.tenant == tenant)
    return session.scalars(q.order_by(Vm.id)).all()


def renew_migrations(*, session: Session, vm_ids: Collection[str], owner: str, now: float) -> None:
    """The lease of ``owner`` on the moves of ``vm_ids`` it still owns, renewed."""
    session.execute(update(Vm).where(Vm.id.in_(list(vm_ids)), Vm.migration_owner == owner,
                                     Vm.migration_state != "").values(migration_at=now))


def set_migration_progress(*, session: Session, vm_id: str, target: str, record: dict) -> bool:
    """The move's progress record (scheduler/migration_view.py), iff the VM still moves to
    ``target`` (one conditional UPDATE: a move settled meanwhile keeps its end)."""
    hit = session.execute(update(Vm).where(Vm.id == vm_id, Vm.migration_host == target, Vm.migration_state != "")
                          .values(migration_progress=record))
    return hit.rowcount == 1


def take_migration(*, session: Session, vm_id: str, owner: str, seen_owner: str, seen_at: float,
                   now: float) -> bool:
    """This process drives the VM's move from now on, iff nobody took it since it was read
    (one conditional UPDATE: two replicas cannot both resume it)."""
    hit = session.execute(update(Vm).where(Vm.id == vm_id, Vm.migration_owner == seen_owner,
                                           Vm.migration_at == seen_at, Vm.migration_state != "")
                          .values(migration_owner=owner, migration_at=now))
    return hit.rowcount == 1
