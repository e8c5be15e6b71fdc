"""Host IO-health history queries. Keyword-only, take the session, never commit."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from scheduler.db.models import HostStat
from scheduler.schemas.hosts import HostStatsIn

SUMS = ("io_cpu_busy", "cpu_io_service", "cpu_vms", "cpu_other", "irqs_per_s")
TOTALS = ("foreign_cpu_s", "throttled_periods", "probe_ok", "probe_failed", "samples")
MAXIMA = ("io_cpu_busy_max", "foreign_threads_max", "psi_some_avg10_max", "probe_p99_ms_max")


def history(*, session: Session, host: str, since: float | None = None,
            until: float | None = None) -> Sequence[HostStat]:
    q = select(HostStat).where(HostStat.host == host).order_by(HostStat.bucket)
    if since is not None:
        q = q.where(HostStat.bucket >= since)
    if until is not None:
        q = q.where(HostStat.bucket < until)
    return session.scalars(q).all()


def fold(rows: dict[tuple[str, int], dict], host: str, stats: HostStatsIn, bucket_s: int) -> None:
    """Add one heartbeat's stats to an in-memory (host, bucket) aggregate (``add_many``)."""
    key = (host, int(stats.at // bucket_s * bucket_s))
    r = rows.setdefault(key, {"heartbeats": 0, "samples": 0, "psi_n": 0, "psi_stall": None,
                              **{k: 0 for k in SUMS + TOTALS if k != "samples"},
                              **{k: None for k in MAXIMA}})
    r["heartbeats"] += 1
    for k in SUMS + TOTALS:
        r[k] += getattr(stats, k)
    if stats.psi_stall is not None:
        r["psi_stall"] = (r["psi_stall"] or 0.0) + stats.psi_stall
        r["psi_n"] += 1
    for k in MAXIMA:
        v = getattr(stats, k)
        if v is not None and (r[k] is None or v > r[k]):
            r[k] = v


def add_many(*, session: Session, rows: dict[tuple[str, int], dict]) -> None:
    """Upsert pre-aggregated buckets in one statement (INSERT ... ON CONFLICT DO UPDATE):
    sums and counts add, maxima take the larger."""
    if not rows:
        return
    table = HostStat.__table__
    values = [{"host": h, "bucket": b, **{**r, "io_cpu_busy_max": r["io_cpu_busy_max"] or 0.0,
                                            "foreign_threads_max": r["foreign_threads_max"] or 0}}
              for (h, b), r in rows.items()]
    pg = session.get_bind().dialect.name == "postgresql"
    if pg:
        from sqlalchemy.dialects.postgresql import insert
        bigger = func.greatest
    else:
        from sqlalchemy.dialects.sqlite import insert
        bigger = func.max
    ins = insert(table)
    ex = ins.excluded
    add = {k: table.c[k] + ex[k] for k in ("heartbeats", "samples", "psi_n") + SUMS + TOTALS}
    add["psi_stall"] = func.coalesce(table.c.psi_stall, 0) + func.coalesce(ex.psi_stall, 0)
    top = {k: func.coalesce(bigger(table.c[k], ex[k]), table.c[k], ex[k]) for k in MAXIMA}
    session.connection().execute(ins.on_conflict_do_update(index_elements=["host", "bucket"], set_=add | top),
                                 values)


def expire(*, session: Session, before: float) -> int:
    return session.execute(delete(HostStat).where(HostStat.bucket < before)).rowcount or 0
