"""SQLAlchemy 2 models. Schema changes go through Alembic (scheduler/migrations)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (JSON, REAL, BigInteger, Float, ForeignKey, Index, Integer, LargeBinary, SmallInteger, String,
                        Text, UniqueConstraint)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from api.states import AdminState, VmStatus


class Base(DeclarativeBase):
    pass


class Host(Base):
    __tablename__ = "hosts"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    address: Mapped[str] = mapped_column(String(255))
    rack: Mapped[str] = mapped_column(String(64), default="")
    labels: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    layout: Mapped[dict[str, Any]] = mapped_column(JSON)
    siblings: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    pf_min_rate: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    disk_classes: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    layout_rev: Mapped[int] = mapped_column(Integer, default=1)  # bumps when the resources change
    usage: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # sum of live allocations
    generation: Mapped[int] = mapped_column(Integer, default=1)  # bumps on every claim/release
    admin_state: Mapped[str] = mapped_column(String(16), default=AdminState.ACTIVE)
    # Who took the host out of "active", why, and since when (cordon/drain): only that
    # owner may change the admin state again without ``force``. "", "", NULL while active,
    # and for a host cordoned before owners were recorded (anyone may change it).
    admin_owner: Mapped[str] = mapped_column(String(128), default="", server_default="")
    admin_reason: Mapped[str] = mapped_column(String(256), default="", server_default="")
    admin_since: Mapped[float | None] = mapped_column(Float, nullable=True)
    # The principal that registered it ("" until the next registration claims it): no
    # other host principal may re-register or heartbeat it (admins may).
    owner: Mapped[str] = mapped_column(String(64), default="", server_default="")
    last_heartbeat: Mapped[float] = mapped_column(Float, default=0.0, index=True)  # the index's quiet-hosts query
    # When a liveness check marked it down (silent past the timeout; its VMs flagged);
    # NULL while up. Set once (a conditional update), cleared when it beats again.
    down_since: Mapped[float | None] = mapped_column(Float, nullable=True)
    # A small integer of its own, given at registration: the replicas' shared liveness
    # rows (``HostBeat``) name the hosts heard from as a set over these.
    beat_id: Mapped[int | None] = mapped_column(Integer, nullable=True, unique=True, index=True)
    # Fleet-wide change feed: stamped from one counter on every change the placement index
    # must see (usage, layout, admin state, back from down); readers ask "seq > last seen".
    seq: Mapped[int] = mapped_column(BigInteger, default=0, index=True)
    # What hostd registered for Prometheus (``GET /v1/prometheus/targets``); NULL for a
    # host registered by a hostd older than these columns: not a scrape target.
    metrics_url: Mapped[str | None] = mapped_column(String(300), nullable=True)  # http(s)://host:port/path
    hostd_version: Mapped[str | None] = mapped_column(String(64), nullable=True)
    carved_policy: Mapped[str | None] = mapped_column(String(64), nullable=True)  # sha256; "" = not carved
    created: Mapped[float] = mapped_column(Float)
    updated: Mapped[float] = mapped_column(Float)


class HostBeat(Base):
    """One replica's liveness for one period (``scheduler.service.pulse``): the hosts it
    heard from between ``period_start`` and ``period_end``, as a set over their
    ``beat_id`` (``scheduler.liveness_rule.encode_ids``). One row per replica and period,
    whatever the beat rate; rows older than the heartbeat timeout are deleted. ``lag``:
    why the replica could not vouch for the period (it lagged), or NULL."""
    __tablename__ = "host_beats"

    replica: Mapped[str] = mapped_column(String(64), primary_key=True)
    period_start: Mapped[float] = mapped_column(Float, primary_key=True)
    period_end: Mapped[float] = mapped_column(Float, index=True)
    hosts: Mapped[bytes] = mapped_column(LargeBinary)
    lag: Mapped[str | None] = mapped_column(String(200), nullable=True)


class Fleet(Base):
    """One row: the change counter on SQLite (writers are serialised there, so it is
    gapless and in commit order). PostgreSQL stamps with transaction ids instead."""

    __tablename__ = "fleet"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, default=0)


class Vm(Base):
    __tablename__ = "vms"
    __table_args__ = (UniqueConstraint("tenant", "idempotency_key", name="uq_vms_tenant_key"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64), index=True)
    name: Mapped[str] = mapped_column(String(64))
    idempotency_key: Mapped[str] = mapped_column(String(128))
    request_hash: Mapped[str] = mapped_column(String(64))
    request: Mapped[dict[str, Any]] = mapped_column(JSON)
    host: Mapped[str | None] = mapped_column(ForeignKey("hosts.name"), index=True, nullable=True)
    allocation: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    status: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    hostd_vm_id: Mapped[str] = mapped_column(String(64), default="")
    affinity_group: Mapped[str] = mapped_column(String(64), default="", index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # A drain's replacement names the VM it replaces (the drain deletes that one once
    # this one runs); the disruption budget's group, for the drain's fleet-wide count.
    replaces: Mapped[str | None] = mapped_column(String(36), nullable=True, index=True)
    disruption_group: Mapped[str] = mapped_column(String(64), default="", server_default="", index=True)
    # A live move under way (scheduler/service/migrations.py): the target and the claim
    # held there until the VM runs on it (the source claim stays in ``allocation`` until
    # then), where the move stands (api/states.py MigrationState, "" when none), and which
    # scheduler process drives it since when (another resumes or undoes it after that).
    migration_host: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    migration_allocation: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    migration_state: Mapped[str] = mapped_column(String(16), default="", server_default="")
    migration_owner: Mapped[str] = mapped_column(String(64), default="", server_default="")
    migration_at: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    # What operators see of it (migration 0019): while it runs, when it started and the
    # source hostd's last progress sample (GetMigration, taken by the driving scheduler);
    # afterwards the last move's end (result, reason, times). JSON, shapes in
    # scheduler/service/migrations.py (progress_record, last_record).
    migration_progress: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    last_migration: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    created: Mapped[float] = mapped_column(Float)
    updated: Mapped[float] = mapped_column(Float)


class Audit(Base):
    __tablename__ = "audit"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Float)
    principal: Mapped[str] = mapped_column(String(64))
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(128))
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


LIVE = (VmStatus.PENDING, VmStatus.CREATING, VmStatus.RUNNING)  # statuses whose allocation counts as used


class ApiToken(Base):
    """A bearer token kept in the database (``scheduler token create``): several may be
    active per principal (rotation without downtime), each may expire, and a revocation
    reaches every replica within ``auth.refresh_s`` (they read changes since their last
    look). Only the token's sha256 is stored."""

    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(String(16), primary_key=True)  # shown by `token list`; not secret
    name: Mapped[str] = mapped_column(String(64), index=True)  # the principal
    sha256: Mapped[str] = mapped_column(String(64), unique=True)
    scopes: Mapped[list[str]] = mapped_column(JSON)
    created: Mapped[float] = mapped_column(Float)
    expires: Mapped[float | None] = mapped_column(Float, nullable=True)  # None: never
    revoked: Mapped[float | None] = mapped_column(Float, nullable=True)
    changed: Mapped[float] = mapped_column(Float, index=True)  # created or revoked: what replicas poll
    note: Mapped[str] = mapped_column(String(200), default="")


class HostStat(Base):
    """A host's IO-health history, downsampled: one row per host and ``stats.bucket_s``
    window, summed from the heartbeats in it (means are sums / heartbeats), kept for
    ``stats.retention_days``."""

    __tablename__ = "host_stats"

    host: Mapped[str] = mapped_column(String(64), primary_key=True)
    bucket: Mapped[int] = mapped_column(BigInteger, primary_key=True, index=True)  # unix time of the window's start
    heartbeats: Mapped[int] = mapped_column(Integer, default=0)
    samples: Mapped[int] = mapped_column(Integer, default=0)
    io_cpu_busy: Mapped[float] = mapped_column(Float, default=0.0)  # sums
    cpu_io_service: Mapped[float] = mapped_column(Float, default=0.0)
    cpu_vms: Mapped[float] = mapped_column(Float, default=0.0)
    cpu_other: Mapped[float] = mapped_column(Float, default=0.0)
    irqs_per_s: Mapped[float] = mapped_column(Float, default=0.0)
    psi_stall: Mapped[float | None] = mapped_column(Float, nullable=True)
    psi_n: Mapped[int] = mapped_column(Integer, default=0)
    foreign_cpu_s: Mapped[float] = mapped_column(Float, default=0.0)  # totals
    throttled_periods: Mapped[int] = mapped_column(Integer, default=0)
    probe_ok: Mapped[int] = mapped_column(Integer, default=0)
    probe_failed: Mapped[int] = mapped_column(Integer, default=0)
    io_cpu_busy_max: Mapped[float] = mapped_column(Float, default=0.0)  # maxima
    foreign_threads_max: Mapped[int] = mapped_column(Integer, default=0)
    psi_some_avg10_max: Mapped[float | None] = mapped_column(Float, nullable=True)
    probe_p99_ms_max: Mapped[float | None] = mapped_column(Float, nullable=True)


class HostDay(Base):
    """One host-local day of a host (``POST /v1/hosts/{name}/days``, folded by its hostd):
    the fleet's utilisation view reads these, by day (the key's first column). Under 256
    bytes a row with its key, on SQLite and PostgreSQL: ``hours`` is 24 bytes (percent,
    255 for an hour without samples), ``hist`` 20 little-endian uint16 (per mille of the
    day's samples); ``repo.days`` packs them. The peak in milli-CPUs, the other figures in
    single precision (REAL)."""

    __tablename__ = "host_days"

    day: Mapped[str] = mapped_column(String(10), primary_key=True)  # YYYY-MM-DD, host-local
    host: Mapped[str] = mapped_column(String(64), primary_key=True)
    utc_offset_min: Mapped[int] = mapped_column(SmallInteger)
    cpus: Mapped[int] = mapped_column(Integer)
    samples: Mapped[int] = mapped_column(Integer)
    peak_start: Mapped[int] = mapped_column(SmallInteger)  # minutes of the host-local day
    peak_end: Mapped[int] = mapped_column(SmallInteger)
    peak_samples: Mapped[int] = mapped_column(Integer)
    # mean CPUs in use over the peak window, in milli-CPUs (utilization.milli): integers,
    # so the share of the host's CPUs is binned exactly, in Python and in SQL alike
    peak_io_mcpu: Mapped[int] = mapped_column(Integer)
    peak_vms_mcpu: Mapped[int] = mapped_column(Integer)
    peak_other_mcpu: Mapped[int] = mapped_column(Integer)
    hours: Mapped[bytes] = mapped_column(LargeBinary(24))
    hist: Mapped[bytes] = mapped_column(LargeBinary(40))
    probe_p99_ms_max: Mapped[float | None] = mapped_column(REAL, nullable=True)
    psi_some_avg10_max: Mapped[float | None] = mapped_column(REAL, nullable=True)
    foreign_cpu_s: Mapped[float] = mapped_column(REAL)
    probe_failed: Mapped[int] = mapped_column(Integer)


class ConsoleSession(Base):
    """A web console login (``scheduler/service/sessions.py``): the cookie's secret is
    never stored, only its sha256; the token it was opened with is kept as its sha256
    too, so a revoked or expired token ends the session. Logout deletes the row."""

    __tablename__ = "console_sessions"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # sha256 of the cookie's value
    token_sha256: Mapped[str] = mapped_column(String(64))
    csrf: Mapped[str] = mapped_column(String(64))
    created: Mapped[float] = mapped_column(Float)
    expires: Mapped[float] = mapped_column(Float, index=True)


class Rollout(Base):
    """A fleet rollout (``fleet-rollout``) whose durable state the scheduler keeps, so that
    every operator's rollouts see each other: a host belongs to at most one active
    rollout. The JSON columns are text the scheduler stores and returns as given."""

    __tablename__ = "rollouts"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    policy_digest: Mapped[str] = mapped_column(String(64), default="")
    spec: Mapped[str] = mapped_column(Text)  # a JSON object, opaque to the scheduler
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text, default="", server_default="")
    wave: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    waves: Mapped[int] = mapped_column(Integer)
    skipped: Mapped[str] = mapped_column(Text)  # a JSON list of {"host", "reason"}
    created: Mapped[float] = mapped_column(Float)
    updated: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(String(128))


class RolloutHost(Base):
    __tablename__ = "rollout_hosts"
    __table_args__ = (Index("ix_rollout_hosts_wave_state", "rollout", "wave", "state"),
                      Index("ix_rollout_hosts_name", "name"))  # the overlap check looks hosts up by name

    rollout: Mapped[str] = mapped_column(ForeignKey("rollouts.name"), primary_key=True)
    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    wave: Mapped[int] = mapped_column(Integer)
    seq: Mapped[int] = mapped_column(Integer)  # the host's place in the rollout, in wave order
    rack: Mapped[str] = mapped_column(String(64))
    address: Mapped[str] = mapped_column(String(255))
    host: Mapped[str] = mapped_column(Text)  # a JSON object, opaque
    state: Mapped[str] = mapped_column(String(16))
    data: Mapped[str] = mapped_column(Text, default="{}", server_default="{}")  # a JSON object, merged per step
    updated: Mapped[float] = mapped_column(Float)


class RolloutTransition(Base):
    """One recorded step: a host's (or, with host "-", the rollout's) state change or
    note, who made it and the numbers it was decided on."""

    __tablename__ = "rollout_transitions"
    __table_args__ = (Index("ix_rollout_transitions_host", "rollout", "host", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    rollout: Mapped[str] = mapped_column(String(64))
    host: Mapped[str] = mapped_column(String(255))
    from_state: Mapped[str] = mapped_column(String(16))
    to_state: Mapped[str] = mapped_column(String(16))
    at: Mapped[float] = mapped_column(Float)
    holder: Mapped[str] = mapped_column(String(255))  # the controller's name, or "<verb> by <principal>"
    principal: Mapped[str] = mapped_column(String(128), default="", server_default="")  # whose token wrote it
    fence: Mapped[int | None] = mapped_column(Integer, nullable=True)  # a controller's write: its lease's fence
    detail: Mapped[str] = mapped_column(Text)  # a JSON object


class RolloutLease(Base):
    """Who runs the rollout, until when, and its fence: the number every controller write
    carries. Each take hands out the next fence, so fences only grow; the row outlives a
    release (``expires`` set to then), so the counter never starts again."""

    __tablename__ = "rollout_leases"

    rollout: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(255))  # the controller's name for itself (a label)
    expires: Mapped[float] = mapped_column(Float)
    fence: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    principal: Mapped[str] = mapped_column(String(128), default="", server_default="")  # who took it
    taken: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
