"""Rollout queries. Keyword-only, take the session, never commit. The JSON columns are
text: encoded and decoded here, so the layers above see Python objects."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import JSON, cast, func, insert, select, text, type_coerce
from sqlalchemy.orm import Session

from api.states import RolloutHostState, RolloutState
from scheduler.db.models import Rollout, RolloutHost, RolloutLease, RolloutTransition
from scheduler.errors import RolloutHostNotFound, RolloutNotFound
from scheduler.repo import lite, pg

TERMINAL = (RolloutState.DONE, RolloutState.ABORTED, RolloutState.ROLLED_BACK)  # a rollout in these holds no host
ROLLOUT = "-"  # the host column of a rollout-level transition
# Rollout creation (and reactivation) on PostgreSQL: a transaction-level advisory lock,
# so that the overlap check and the insert are one step against a concurrent create.
# Its key is not the claim lock's (pg.CLAIM_LOCK_KEY) and outside the int4 range of the
# anti-affinity group locks.
CREATE_LOCK_KEY = int.from_bytes(b"HYBROLLO", "big")


def dumps(v: Any) -> str:
    return json.dumps(v, separators=(",", ":"))


def lock_creation(*, session: Session) -> None:
    """Hold the rollout creation lock until this transaction ends (PostgreSQL; SQLite's
    write transactions take the writer lock up front, which already serialises them).
    Taken before the overlap check, so that the check sees every rollout the previous
    holder committed (READ COMMITTED takes a snapshot per statement)."""
    if pg.serves(session):
        session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": CREATE_LOCK_KEY})


def find_rollout(*, session: Session, name: str) -> Rollout | None:
    return session.get(Rollout, name)


def rollout_fields(r: Rollout) -> dict[str, Any]:
    """The rollout's columns, its JSON ones decoded."""
    return {"name": r.name, "kind": r.kind, "policy_digest": r.policy_digest, "spec": json.loads(r.spec),
            "state": r.state, "reason": r.reason, "wave": r.wave, "waves": r.waves,
            "skipped": json.loads(r.skipped), "created": r.created, "updated": r.updated,
            "created_by": r.created_by}


def get_rollout(*, session: Session, name: str, lock: str | None = None) -> Rollout:
    """``lock`` (PostgreSQL; SQLite's writer lock is the lock): "update" for a change of the
    rollout or its lease, "share" for a host's step, which must not pass a lease change."""
    q = select(Rollout).where(Rollout.name == name)
    if lock is not None:
        q = q.with_for_update(read=lock == "share")
    r = session.scalars(q).one_or_none()
    if r is None:
        raise RolloutNotFound(f"no rollout {name!r}", field="name")
    return r


def list_rollouts(*, session: Session) -> Sequence[Rollout]:
    return session.scalars(select(Rollout).order_by(Rollout.created, Rollout.name)).all()


def add_rollout(*, session: Session, name: str, kind: str, policy_digest: str, spec: dict[str, Any],
                waves: Sequence[Sequence[Any]], skipped: list[dict[str, str]], now: float, created_by: str
                ) -> Rollout:
    """The rollout, "running" at wave 0, and its hosts ("pending", numbered in wave order);
    ``waves``: lists of hosts with name, address, rack and host."""
    r = Rollout(name=name, kind=kind, policy_digest=policy_digest, spec=dumps(spec), state=RolloutState.RUNNING,
                reason="", wave=0, waves=len(waves), skipped=dumps(skipped), created=now, updated=now,
                created_by=created_by)
    session.add(r)
    session.flush()
    in_order = ((w, h) for w, hosts in enumerate(waves) for h in hosts)
    rows = [{"rollout": name, "name": h.name, "wave": w, "seq": seq, "rack": h.rack, "address": h.address,
             "host": dumps(h.host), "state": RolloutHostState.PENDING, "data": "{}", "updated": now}
            for seq, (w, h) in enumerate(in_order)]
    session.execute(insert(RolloutHost), rows)
    return r


def overlaps(*, session: Session, hosts: Sequence[str], besides: str) -> list[tuple[str, str, str]]:
    """(rollout, its state, host) for each of ``hosts`` that another active rollout than
    ``besides`` holds (a host it skipped it does not hold), by rollout name and host order."""
    out: list[tuple[str, str, str, int]] = []
    for i in range(0, len(hosts), 500):
        out += session.execute(
            select(Rollout.name, Rollout.state, RolloutHost.name, RolloutHost.seq)
            .join(RolloutHost, RolloutHost.rollout == Rollout.name)
            .where(RolloutHost.name.in_(hosts[i:i + 500]), RolloutHost.state != RolloutHostState.SKIPPED,
                   Rollout.state.not_in(TERMINAL), Rollout.name != besides)).all()
    return [(r, st, h) for r, st, h, _ in sorted(out, key=lambda x: (x[0], x[3]))]


def held_hosts(*, session: Session, rollout: str) -> list[str]:
    """The hosts ``rollout`` holds while active: all but those it skipped."""
    return list(session.scalars(select(RolloutHost.name).where(RolloutHost.rollout == rollout,
                                                               RolloutHost.state != RolloutHostState.SKIPPED)))


def set_rollout(*, session: Session, r: Rollout, state: str, reason: str, wave: int, now: float) -> None:
    r.state, r.reason, r.wave, r.updated = state, reason, wave, now
    session.flush()


def counts(*, session: Session, names: Iterable[str] | None = None) -> dict[str, dict[int, dict[str, int]]]:
    """Per rollout (all, or ``names``), per wave, the hosts in each state: one grouped
    read of the (rollout, wave, state) index."""
    q = select(RolloutHost.rollout, RolloutHost.wave, RolloutHost.state, func.count()) \
        .group_by(RolloutHost.rollout, RolloutHost.wave, RolloutHost.state)
    if names is not None:
        q = q.where(RolloutHost.rollout.in_(list(names)))
    out: dict[str, dict[int, dict[str, int]]] = {}
    for rollout, wave, state, n in session.execute(q):
        out.setdefault(rollout, {}).setdefault(wave, {})[state] = n
    return out


def host_out(h: RolloutHost) -> dict[str, Any]:
    return {"name": h.name, "wave": h.wave, "seq": h.seq, "rack": h.rack, "address": h.address,
            "host": json.loads(h.host), "state": h.state, "data": json.loads(h.data), "updated": h.updated}


def get_host(*, session: Session, rollout: str, name: str, lock: bool = False) -> RolloutHost:
    q = select(RolloutHost).where(RolloutHost.rollout == rollout, RolloutHost.name == name)
    if lock:
        q = q.with_for_update()
    h = session.scalars(q).one_or_none()
    if h is None:
        raise RolloutHostNotFound(f"rollout {rollout} has no host {name!r}", field="host")
    return h


def active_host_states(*, session: Session) -> dict[str, str]:
    """Host name -> its state in the active rollout that holds it (one at most: the
    overlap check), for every rollout not in ``TERMINAL`` (done, aborted, rolled back)."""
    q = select(RolloutHost.name, RolloutHost.state).join(Rollout, Rollout.name == RolloutHost.rollout) \
        .where(Rollout.state.not_in(TERMINAL))
    return {n: st for n, st in session.execute(q)}


def hosts(*, session: Session, rollout: str, wave: int | None = None) -> list[dict[str, Any]]:
    q = select(RolloutHost).where(RolloutHost.rollout == rollout).order_by(RolloutHost.seq)
    if wave is not None:
        q = q.where(RolloutHost.wave == wave)
    return [host_out(h) for h in session.scalars(q)]


def brief_hosts(*, session: Session, rollout: str, wave: int | None = None) -> list[dict[str, Any]]:
    """The hosts without their record or data (baselines are large), for a controller's
    polling: ``data`` holds only ``rollback_failed`` when it is set and true. The value is
    taken out of the JSON text by the database (SQLite >= 3.38's ``->`` keeps its JSON
    type, where ``json_extract`` would turn true into 1), so the data never leaves it."""
    if lite.serves(session):
        failed = type_coerce(RolloutHost.data.op("->")("$.rollback_failed"), JSON)
    else:
        failed = type_coerce(cast(RolloutHost.data, JSON).op("->")("rollback_failed"), JSON)
    q = select(RolloutHost.name, RolloutHost.wave, RolloutHost.seq, RolloutHost.rack, RolloutHost.address,
               RolloutHost.state, failed, RolloutHost.updated).where(RolloutHost.rollout == rollout) \
        .order_by(RolloutHost.seq)
    if wave is not None:
        q = q.where(RolloutHost.wave == wave)
    return [{"name": n, "wave": w, "seq": seq, "rack": rack, "address": addr, "host": None, "state": st,
             "data": {"rollback_failed": f} if f else {}, "updated": upd}
            for n, w, seq, rack, addr, st, f, upd in session.execute(q)]


def move_host(*, session: Session, h: RolloutHost, to: str, data: dict[str, Any], now: float) -> None:
    """The host's new state; ``data`` merged into its data, key by key."""
    h.state = to
    if data:
        h.data = dumps({**json.loads(h.data), **data})
    h.updated = now
    session.flush()


def record(*, session: Session, rollout: str, host: str, frm: str, to: str, at: float, holder: str,
           principal: str, detail: dict[str, Any], fence: int | None = None) -> None:
    """One transition's row, inside the caller's transaction: who (the controller's name
    or the operator's verb, the principal, the fence of a controller's write), when, and
    the numbers."""
    session.execute(insert(RolloutTransition).values(rollout=rollout, host=host, from_state=frm, to_state=to, at=at,
                                                     holder=holder, principal=principal, fence=fence,
                                                     detail=dumps(detail)))


def last_transition(*, session: Session, rollout: str, host: str) -> RolloutTransition | None:
    """The latest record of the host (``ROLLOUT``: of the rollout itself): who set the
    state a writer did not expect."""
    return session.scalars(select(RolloutTransition)
                           .where(RolloutTransition.rollout == rollout, RolloutTransition.host == host)
                           .order_by(RolloutTransition.id.desc()).limit(1)).first()


def transitions(*, session: Session, rollout: str, host: str | None = None) -> list[dict[str, Any]]:
    q = select(RolloutTransition).where(RolloutTransition.rollout == rollout).order_by(RolloutTransition.id)
    if host is not None:
        q = q.where(RolloutTransition.host == host)
    return [{"id": t.id, "host": t.host, "from_": t.from_state, "to": t.to_state, "at": t.at, "holder": t.holder,
             "principal": t.principal, "fence": t.fence, "detail": json.loads(t.detail)} for t in session.scalars(q)]


def lease(*, session: Session, rollout: str) -> RolloutLease | None:
    """The rollout's lease row, live, lapsed or released (it keeps the latest fence)."""
    return session.get(RolloutLease, rollout)


def leases(*, session: Session) -> dict[str, RolloutLease]:
    return {x.rollout: x for x in session.scalars(select(RolloutLease))}


def take_lease(*, session: Session, rollout: str, holder: str, principal: str, now: float,
               expires: float) -> RolloutLease:
    """The lease for ``principal``'s controller ``holder``, with the next fence (the
    caller holds the rollout's row lock: no other writer is between its read of the
    lease and this, so no two takes get one fence)."""
    x = session.get(RolloutLease, rollout)
    if x is None:
        x = RolloutLease(rollout=rollout, fence=0)
        session.add(x)
    x.holder, x.principal, x.taken, x.expires, x.fence = holder, principal, now, expires, x.fence + 1
    session.flush()
    return x


def extend_lease(*, session: Session, x: RolloutLease, expires: float) -> None:
    x.expires = expires
    session.flush()


def end_lease(*, session: Session, x: RolloutLease, now: float) -> None:
    """Released: lapsed from now, its fence kept (the next take hands out the one after)."""
    x.expires = now
    session.flush()
