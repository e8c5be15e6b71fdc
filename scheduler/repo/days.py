"""Host-day history queries (``host_days``). Keyword-only, take the session, never commit."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from sqlalchemy import BigInteger, case, cast, delete, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from scheduler.db.models import Host, HostDay
from scheduler.schemas.fleet import HostDayIn
from scheduler.utilization import MILLI, milli

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
            "peak_io_mcpu": milli(d.peak.io), "peak_vms_mcpu": milli(d.peak.vms),
            "peak_other_mcpu": milli(d.peak.other),
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


def peak_bins(*, session: Session, first: str, last: str, bins: int) -> Sequence[Any]:
    """(day, bin, hosts) over days ``first``..``last`` of registered hosts: each host's
    peak-window share of its CPUs in use (all classes), binned in the database as
    ``utilization.value``/``bin_of`` do it in Python, in integers (milli-CPUs of the
    host's CPUs x 1000; 64-bit, PostgreSQL's INTEGER would overflow at 100 bins), so a
    share on a bin edge opens that bin and a day's counts match ``distribution``'s."""
    used = (cast(HostDay.peak_io_mcpu, BigInteger) + HostDay.peak_vms_mcpu) + HostDay.peak_other_mcpu
    total = cast(HostDay.cpus, BigInteger) * MILLI
    # min(bins - 1, used * bins // total): integer division on both stores (operands >= 0)
    b = case((used >= total, bins - 1), else_=(used * bins) // total).label("bin")
    q = (select(HostDay.day, b, func.count().label("hosts"))
         .join(Host, Host.name == HostDay.host)
         .where(HostDay.day >= first, HostDay.day <= last, HostDay.peak_samples > 0, HostDay.cpus > 0)
         .group_by(HostDay.day, b))
    return session.execute(q).all()


def hours_between(*, session: Session, first: str, last: str) -> Sequence[Any]:
    """(day, hours) of registered hosts over days ``first``..``last``: one query for a
    range of days in a host-local hours window (``peak_bins`` bins the peak in SQL)."""
    q = (select(HostDay.day, HostDay.hours).join(Host, Host.name == HostDay.host)
         .where(HostDay.day >= first, HostDay.day <= last))
    return session.execute(q).all()


def expire(*, session: Session, before_day: str) -> int:
    return session.execute(delete(HostDay).where(HostDay.day < before_day)).rowcount


def count(*, session: Session) -> int:
    return session.execute(select(func.count()).select_from(HostDay)).scalar_one()
