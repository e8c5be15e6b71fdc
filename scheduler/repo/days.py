"""Host-day history queries (``host_days``). Keyword-only, take the session, never commit."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from scheduler.db.models import Host, HostDay
from scheduler.schemas.fleet import HostDayIn

_UPDATED = [c.name for c in HostDay.__table__.columns if c.name not in ("day", "host")]


NO_HOUR = 255


def pack_hours(hours: Sequence[int | None]) -> bytes:
    """24 percents, a byte each (255: no samples that hour)."""
    return bytes(NO_HOUR if h is None else h for h in hours)


def unpack_hours(raw: bytes) -> list[int | None]:
    return [None if b == NO_HOUR else b for b in raw]


def pack_hist(counts: Sequence[int]) -> bytes:
    """20 bins as per mille of the day's samples, two bytes each."""
    total = sum(counts) or 1
    return struct.pack("<20H", *(round(1000 * n / total) for n in counts))


def unpack_hist(raw: bytes) -> list[int]:
    return list(struct.unpack("<20H", raw))


def _minutes(hhmm: str) -> int:
    h, m = hhmm.split(":")
    return int(h) * 60 + int(m)


def row_of(host: str, d: HostDayIn) -> dict[str, Any]:
    return {"host": host, "day": d.day.isoformat(), "utc_offset_min": d.utc_offset_min, "cpus": d.cpus,
            "samples": d.samples, "peak_start": _minutes(d.peak.start), "peak_end": _minutes(d.peak.end),
            "peak_samples": d.peak.samples,
            "peak_io": d.peak.io, "peak_vms": d.peak.vms, "peak_other": d.peak.other,
            "hours": pack_hours(d.hours), "hist": pack_hist(d.hist), "probe_p99_ms_max": d.probe_p99_ms_max,
            "psi_some_avg10_max": d.psi_some_avg10_max, "foreign_cpu_s": d.foreign_cpu_s,
            "probe_failed": d.probe_failed}


def upsert_many(*, session: Session, rows: Sequence[dict[str, Any]]) -> None:
    """Insert or replace (the latest of a day replaces the earlier), one statement."""
    if not rows:
        return
    dialect = postgresql if session.bind.dialect.name == "postgresql" else sqlite  # type: ignore[union-attr]
    stmt = dialect.insert(HostDay)
    stmt = stmt.on_conflict_do_update(index_elements=["day", "host"],
                                      set_={c: getattr(stmt.excluded, c) for c in _UPDATED})
    session.execute(stmt, list(rows))


def for_day(*, session: Session, day: str) -> Sequence[Any]:
    """Every registered host with its row for ``day`` (the day's columns None when it
    sent none): host, rack, admin_state, last_heartbeat, carved_policy, HostDay | None."""
    q = (select(Host.name, Host.rack, Host.admin_state, Host.last_heartbeat, Host.carved_policy, HostDay)
         .outerjoin(HostDay, (HostDay.host == Host.name) & (HostDay.day == day)).order_by(Host.name))
    return session.execute(q).all()


def expire(*, session: Session, before_day: str) -> int:
    return session.execute(delete(HostDay).where(HostDay.day < before_day)).rowcount


def count(*, session: Session) -> int:
    return session.execute(select(func.count()).select_from(HostDay)).scalar_one()
