"""Scheduler configuration: one TOML file (scheduler/scheduler.example.toml documents
every key) with environment overrides ``HYB_SCHED_<SECTION>__<KEY>`` (env wins).
Built once in ``main()`` and passed down; nothing reads it at import time."""

from __future__ import annotations

import tomllib
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from api.bounds import GRACE_SECONDS_MAX
from api.states import OnMaintenance


class ServerConfig(BaseModel):
    host: str = "127.0.0.1"
    port: int = 8700
    # HTTPS: certificate and key (PEM). Without them the API refuses to start unless
    # plaintext = true says plain HTTP is wanted (bearer tokens then cross in clear).
    tls_cert: Path | None = None
    tls_key: Path | None = None
    # mTLS: clients must present a certificate this CA signed (tokens are still checked).
    tls_client_ca: Path | None = None
    plaintext: bool = False
    # Paths answered without a token; everything else needs one before its body is read.
    # Add "/metrics", "/docs", "/redoc", "/openapi.json" to open them on a private network.
    open_endpoints: list[str] = ["/healthz", "/readyz"]
    # Largest request body read; a larger one is refused (413) before it is read.
    max_body_bytes: int = Field(1 << 20, ge=1024)
    # The same for an admin's token: a rollout over a whole fleet is ~250 bytes a host
    # (7,000 hosts: 1.7 MiB; 100,000: 25 MiB).
    max_admin_body_bytes: int = Field(64 << 20, ge=1024)
    # On SIGTERM, requests in flight get this long to finish; then their connections are
    # closed and the process exits (a client that keeps a request open cannot hold it).
    shutdown_grace_s: float = Field(10.0, ge=0, le=300)
    # Load shedding (scheduler/service/shed.py): while the event loop ran a timer later
    # than shed_loop_lag_s within the last shed_hold_s, heartbeats (still counted),
    # creates and registrations are answered 503 with Retry-After at once instead of
    # queued; creates also when more than shed_claim_queue wait for the claim thread.
    # 0 turns either signal off. Claims and registrations are told shed_retry_s.
    shed_loop_lag_s: float = Field(0.5, ge=0)
    shed_hold_s: float = Field(2.0, gt=0, le=60)
    shed_claim_queue: int = Field(4096, ge=0)
    shed_retry_s: float = Field(1.0, ge=1, le=60)
    # What survives a full collection of the cyclic GC (the placement index, the pulse's
    # maps) is frozen out of the next ones' walks (scheduler/heap.py); every gc_freeze_s
    # one collection of everything (at most a day apart) frees the cycles that died
    # frozen. 0: nothing frozen (every full collection walks it all).
    gc_freeze_s: float = Field(600.0, ge=0, le=86400)

    @field_validator("tls_cert", "tls_key", "tls_client_ca", mode="before")
    @classmethod
    def _unset(cls, v: Any) -> Any:
        return None if v == "" else v  # "" in TOML: not set


class DbConfig(BaseModel):
    url: str = "sqlite:////var/lib/hybrid-kvm/scheduler.db"
    busy_timeout_ms: int = 10000
    pool_size: int = 8
    upgrade_on_start: bool = True


class TokenConfig(BaseModel):
    name: str
    sha256: str  # hex digest of the bearer token; the token itself is never stored
    scopes: list[str]
    expires: datetime | None = None  # RFC 3339; none: never


class AuthConfig(BaseModel):
    # Bootstrap tokens. Day to day, tokens live in the database (`scheduler token create`),
    # where they expire, rotate and are revoked without a restart.
    tokens: list[TokenConfig] = Field(default_factory=list)
    # How stale a replica's view of the database tokens may be (a revocation takes effect
    # on every replica within this many seconds).
    refresh_s: float = Field(2.0, gt=0, le=60)


class PlacementConfig(BaseModel):
    default_policy: str = "pack"
    candidates: int = 3  # hosts ranked per attempt; also bounds dispatch retries to other hosts
    claim_retries: int = 16  # lost generation races before 409 hyb.concurrent_update
    claim_batch: int = 64  # most create requests claimed in one write transaction by the claim thread
    # Most host registrations written in one write transaction by the registration thread
    # (each in a savepoint: one refused rolls back alone); 0 = a transaction each, on its
    # request's thread.
    register_batch: int = Field(64, ge=0, le=1000)
    # PostgreSQL: "store" = one claim transaction at a time across replicas (advisory lock),
    # "rows" = concurrent claim batches that row-lock their hosts (SQLite is always "store")
    claim_lock: Literal["store", "rows"] = "store"
    # A host silent this long is "down" (no new VMs; marked down and its VMs flagged at
    # the next [liveness] check). A dead host is marked at most a period (its last beat in
    # a peer's row), this and a check after its last beat: 2 + 22 + 2 = 26 s with the
    # defaults. A live host may look a beat interval plus liveness_rule.silent_allowance
    # stale (10 + 2 x 2 + 1 = 15 s with hostd's 10 s beats): keep the timeout above that.
    heartbeat_timeout_s: float = 22.0
    # Each replica writes one row per this many seconds naming the hosts it heard from
    # (scheduler/service/pulse.py): the liveness every replica judges "down" by, shared
    # without a write per beat.
    heartbeat_period_s: float = Field(2.0, gt=0, le=60)
    # A host's ``last_heartbeat`` row is written when it comes back from down and else at
    # most once per this many seconds per replica: a floor under the shared liveness
    # (what tools reading the table see), not what "down" is judged by. 0: every flushed
    # beat is written.
    heartbeat_write_s: float = Field(300.0, ge=0, le=3600)
    # A host beating again sooner than this after its last beat gets 429
    # hyb.heartbeat.too_soon (nothing recorded): hostd beats every 10 s. 0 = no limit.
    heartbeat_min_interval_s: float = Field(1.0, ge=0, le=3600)
    index_refresh_ms: float = 2.0  # at most this stale w.r.t. other replicas before a placement
    index_down_check_s: float = 0.0  # ask which hosts went quiet (indexed query); 0 = min(10, timeout/4)
    index_full_refresh_s: float = 0.0  # full pass of the index (safety net, deleted rows); 0 = 300


class StatsConfig(BaseModel):
    # Heartbeats' IO-health stats are kept per host in windows of this many seconds
    # (one row per host and window) and dropped after retention_days.
    bucket_s: int = Field(300, ge=10, le=86400)
    retention_days: float = Field(14.0, gt=0, le=3650)
    # Heartbeats are written in one transaction per this many seconds (0: one each).
    heartbeat_flush_s: float = Field(1.0, ge=0, le=30)
    # Host-day summaries (POST /v1/hosts/{name}/days, the utilisation view) are kept this
    # long: a year of before/after and then some.
    history_days: float = Field(400.0, gt=0, le=3650)


class DispatchConfig(BaseModel):
    enabled: bool = True
    ca: str = "/etc/hybrid-kvm/pki/ca.crt"
    cert: str = "/etc/hybrid-kvm/pki/scheduler.crt"
    key: str = "/etc/hybrid-kvm/pki/scheduler.key"
    server_name: str = ""  # TLS name to expect from hostd certificates ("" = the address host)
    timeout_s: float = 120.0
    max_attempts: int = 3  # hosts tried per VM before it is failed


class ReconcileConfig(BaseModel):
    interval_s: float = 60.0  # 0 = off
    grace_s: float = 300.0  # a VM pending/creating this long with no hostd VM is failed


class LivenessConfig(BaseModel):
    check_s: float = Field(2.0, ge=0)  # between checks for hosts to mark down; 0 = off
    grace_s: float = Field(0.0, ge=0)  # after start, mark nothing for this long; 0 = placement.heartbeat_timeout_s
    rack_share: float = Field(0.5, gt=0, le=1)  # a rack newly silent above this share: one event, nobody marked
    fleet_share: float = Field(0.2, gt=0, le=1)  # the fleet newly silent above this share: likewise
    # hostd's beat interval (its heartbeat_s). With liveness_rule.silent_allowance, the
    # most a live host can look silent: a host silent longer missed a beat and counts
    # towards a rack's or the fleet's event before it is past the timeout.
    beat_interval_s: float = Field(10.0, gt=0, le=3600)
    min_hosts: int = Field(3, ge=1)  # a rack (or fleet) smaller than this makes no event
    # A replica whose event loop or heartbeat flush ran later than this (the worst of the
    # last beat interval and a bit: liveness_rule.lag_window, 16.5 s with the defaults)
    # marks nothing down and is not ready: the silences may be its own doing.
    lag_bound_s: float = Field(2.0, gt=0)


class DrainConfig(BaseModel):
    interval_s: float = 5.0  # between drain rounds (and at once after a drain is asked for); 0 = off
    workers: int = 4  # replacements dispatched, old VMs deleted and VMs stopped at once
    # an on_maintenance = stop VM's guest has this long to power off (hostd's bound: api/bounds.py)
    stop_grace_s: int = Field(30, ge=0, le=GRACE_SECONDS_MAX)
    # what a drain may do to a VM whose request does not say (its on_maintenance):
    # recorded in the VM's request when it is created
    on_maintenance: OnMaintenance = OnMaintenance.BLOCK


class MigrationConfig(BaseModel):
    """A live move's bounds, sent with each MigrateVM (hostd/README.md, Live migration)."""

    bandwidth_mib_s: int = Field(0, ge=0, le=100_000)  # memory and disk streams; 0 = none
    max_downtime_ms: int = Field(500, ge=0, le=60_000)  # 0 = libvirt's default
    timeout_s: int = Field(600, ge=0, le=86_400)  # the whole job, then cancelled (the VM stays); 0 = none
    tls: bool = True  # the memory and disk streams over TLS (hostd's migration certificates)
    # the process driving a move renews its lease every third of this; another (a restarted
    # scheduler, another replica) takes over a move whose lease ran out (SQLite: one
    # process, so a restart takes over at once)
    lease_s: float = Field(60.0, gt=0)
    workers: int = Field(4, ge=1, le=64)  # moves driven at once by this process
    # while the source's job runs, its progress (GetMigration) is sampled this often and
    # kept on the VM's row: what the API, the drain view and the console show
    progress_s: float = Field(2.0, ge=0.01, le=60)


class ConsoleConfig(BaseModel):
    enabled: bool = True  # the web console under /ui
    session_ttl_s: float = Field(28800.0, ge=60, le=30 * 86400)  # a login lasts this long (8 h)
    heatmap_days: int = Field(28, ge=1, le=400)  # days the fleet page's heatmap shows


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="HYB_SCHED_", env_nested_delimiter="__",
                                      extra="forbid")
    server: ServerConfig = Field(default_factory=ServerConfig)
    db: DbConfig = Field(default_factory=DbConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    placement: PlacementConfig = Field(default_factory=PlacementConfig)
    dispatch: DispatchConfig = Field(default_factory=DispatchConfig)
    reconcile: ReconcileConfig = Field(default_factory=ReconcileConfig)
    drain: DrainConfig = Field(default_factory=DrainConfig)
    migration: MigrationConfig = Field(default_factory=MigrationConfig)
    liveness: LivenessConfig = Field(default_factory=LivenessConfig)
    stats: StatsConfig = Field(default_factory=StatsConfig)
    console: ConsoleConfig = Field(default_factory=ConsoleConfig)
    log_level: str = "INFO"

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings):
        return (env_settings, init_settings)  # env overrides the file


def load_settings(path: str | Path | None, **overrides: Any) -> Settings:
    data: dict[str, Any] = {}
    if path:
        data = tomllib.loads(Path(path).read_text())
    for k, v in overrides.items():
        data.setdefault(k, {}).update(v) if isinstance(v, dict) else data.__setitem__(k, v)
    return Settings(**data)
