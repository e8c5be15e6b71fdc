"""The replicas' shared liveness rows (``HostBeat``) and the hosts' ``beat_id``.
Keyword-only, take the session, never commit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Sequence as DbSequence
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from scheduler.db.models import Host, HostBeat
from scheduler.repo import lite

BEAT_IDS = DbSequence("host_beat_ids")  # PostgreSQL (migration 0017); SQLite: max + 1 under its writer lock


def next_beat_id(*, session: Session) -> int:
    """A new host's ``beat_id``: PostgreSQL's sequence (two replicas registering at once
    never collide); SQLite serialises writers, so the largest plus one."""
    if lite.serves(session):
        return int(session.execute(select(func.coalesce(func.max(Host.beat_id), 0))).scalar_one()) + 1
    return int(session.execute(select(BEAT_IDS.next_value())).scalar_one())


class BeatIdSource:
    """New hosts' ``beat_id``s for one write transaction (a registration batch): on SQLite
    the largest plus one once, then counted on in memory (its writer lock is held to the
    commit); on PostgreSQL, ``reserve(n)`` takes n from the sequence in one statement
    (unused ones are skipped ids, as after any rolled-back insert)."""

    def __init__(self, session: Session):
        self.session = session
        self.sqlite = lite.serves(session)
        self._next: list[int] = []
        self._last = 0

    def reserve(self, n: int) -> None:
        if n > 0 and not self.sqlite:
            self._next += [int(i) for i in self.session.execute(
                select(BEAT_IDS.next_value()).select_from(func.generate_series(1, n))).scalars()]

    def __call__(self) -> int:
        if self._next:
            return self._next.pop(0)
        if self.sqlite:
            self._last = self._last + 1 if self._last else next_beat_id(session=self.session)
            return self._last
        return next_beat_id(session=self.session)


def beat_ids(*, session: Session) -> dict[str, int]:
    """name -> beat_id of every host that has one (one narrow query)."""
    return {n: i for n, i in session.execute(select(Host.name, Host.beat_id).where(Host.beat_id.is_not(None)))}


def write_period(*, session: Session, replica: str, start: float, end: float, hosts: bytes,
                 lag: str | None = None) -> None:
    session.add(HostBeat(replica=replica, period_start=start, period_end=end, hosts=hosts,
                         lag=None if lag is None else lag[:200]))
    session.flush()


def periods_since(*, session: Session, after: float) -> Sequence[Any]:
    """(replica, period_start, period_end, hosts, lag) of every row written for a period
    that ended after ``after``, oldest first (indexed on period_end)."""
    return session.execute(select(HostBeat.replica, HostBeat.period_start, HostBeat.period_end, HostBeat.hosts,
                                  HostBeat.lag)
                           .where(HostBeat.period_end > after).order_by(HostBeat.period_end)).all()


def expire_periods(*, session: Session, before: float) -> int:
    """Rows of periods that ended before ``before`` go (a dead replica's too)."""
    return session.execute(delete(HostBeat).where(HostBeat.period_end < before)).rowcount
