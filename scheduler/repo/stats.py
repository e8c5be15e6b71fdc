"""Host IO-health history queries. Keyword-only, take the session, never commit."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from scheduler.db.models import HostStat
from scheduler.schemas.hosts import HostStatsIn

SUMS = ("io_cpu_busy", "cpu_io_service", "cpu_vms", "cpu_other", "irqs_per_s")
TOTALS = ("foreign_cpu_s", "throttled_periods", "probe_ok", "probe_failed", "samples")
MAXIMA = ("io_cpu_busy_max", "foreign_threads_max", "psi_some_avg10_max", "probe_p99_ms_max")


def add(*, session: Session, host: str, stats: HostStatsIn, bucket_s: int, keep_s: float) -> None:
    """Fold one heartbeat's stats into its host's bucket; a host's first heartbeat of a
    new bucket also drops its buckets older than ``keep_s`` (retention, per host, once per
    bucket)."""
    bucket = int(stats.at // bucket_s * bucket_s)
    row = session.get(HostStat, (host, bucket))
    if row is None:
        row = HostStat(host=host, bucket=bucket, heartbeats=0, samples=0, psi_n=0,
                       **{k: 0 for k in SUMS + TOTALS if k != "samples"}, io_cpu_busy_max=0.0,
                       foreign_threads_max=0)
        session.add(row)
        session.execute(delete(HostStat).where(HostStat.host == host, HostStat.bucket < bucket - keep_s))
    row.heartbeats += 1
    for k in SUMS:
        setattr(row, k, getattr(row, k) + getattr(stats, k))
    for k in TOTALS:
        setattr(row, k, getattr(row, k) + getattr(stats, k))
    if stats.psi_stall is not None:
        row.psi_stall = (row.psi_stall or 0.0) + stats.psi_stall
        row.psi_n += 1
    for k in MAXIMA:
        new, cur = getattr(stats, k), getattr(row, k)
        if new is not None and (cur is None or new > cur):
            setattr(row, k, new)


def history(*, session: Session, host: str, since: float | None = None,
            until: float | None = None) -> Sequence[HostStat]:
    q = select(HostStat).where(HostStat.host == host).order_by(HostStat.bucket)
    if since is not None:
        q = q.where(HostStat.bucket >= since)
    if until is not None:
        q = q.where(HostStat.bucket < until)
    return session.scalars(q).all()
