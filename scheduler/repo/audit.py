"""The audit trail of every resource (VMs, hosts, rollouts, tokens' denials, the
fleet's silences): who did what to which target, when. Keyword-only, take the session,
never commit."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from scheduler.db.models import Audit
from scheduler.repo import batch


@cache
def _insert():  # type: ignore[no-untyped-def]
    return insert(Audit)


def record(*, session: Session, principal: str, action: str, target: str, now: float,
           detail: dict[str, Any] | None = None) -> None:
    """One entry, in the caller's transaction (with a claim batch's rows when the batch
    collects them: ``repo.batch.defer_inserts``)."""
    row = {"at": now, "principal": principal, "action": action, "target": target, "detail": detail or {}}
    deferred = batch.deferred(session=session, table="audit")
    if deferred is not None:
        deferred.append(row)
    else:
        session.connection().execute(_insert(), row)


def insert_rows(*, session: Session, rows: Sequence[dict[str, Any]]) -> None:
    """Rows ``record`` collected (``repo.batch.defer_inserts``), in one statement."""
    if rows:
        session.connection().execute(_insert(), list(rows))


def record_many(*, session: Session, rows: Sequence[dict[str, Any]]) -> None:
    """Many entries (``record``'s keywords each) in one statement."""
    if rows:
        session.connection().execute(_insert(), [
            {"at": r["now"], "principal": r["principal"], "action": r["action"], "target": r["target"],
             "detail": r.get("detail") or {}} for r in rows])


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
