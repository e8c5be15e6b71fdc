"""hostd's one config file (TOML), every key documented in hostd/hostd.example.toml.
Environment variables HOSTD_<KEY> override the file (HOSTD_VIRT_TYPE=qemu)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from api.bounds import check_host_labels, check_host_name, check_rack
from api.scrape import check_metrics_url
from hostd.errors import ConfigError
from hostd.health.daily import parse_window
from hostd.health.probe import Probe, ProbeSpecError

DEFAULT_CONFIG = Path("/etc/hostd/hostd.toml")


class HostdConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="HOSTD_", extra="forbid", frozen=True)

    # "kvm" on hosts with VMX/SVM; "qemu" (TCG) where /dev/kvm cannot boot a full guest.
    virt_type: Literal["kvm", "qemu"] = "kvm"
    # The carve policy (TOML): reserved CPUs, hugepages, VFs, disk allow-list.
    policy: Path = Path("/etc/hostd/policy.toml")
    # Where hostd keeps its carve journal and VM ledger.
    state_dir: Path = Path("/var/lib/hostd")
    # Prefix for /sys, /proc, /dev reads (tests point it at a recorded host tree).
    root: Path = Path("/")
    # gRPC listen address of `hostd serve`.
    listen: str = "[::]:7443"
    # mTLS: hostd's certificate and key, and the CA that signs scheduler clients.
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None
    # Plaintext gRPC, for local development only; must be said explicitly.
    plaintext: bool = False
    # Client certificate names (SAN DNS/URI or CN) that may call the RPCs that change
    # VMs or the host (CreateVM, DeleteVM, StartVM, StopVM, UpdateIOLimits, Carve,
    # Uncarve). Any certificate the CA signed may call the read-only ones (Health,
    # GetVM, GetHostInfo, PlanCarve, ...).
    rpc_mutating_callers: list[str] = ["scheduler", "fleet-rollout"]
    libvirt_uri: str = "qemu:///system"
    # Live migration: the address (host or IP) where other hosts' QEMU reaches this
    # host's for a migration's memory and disk streams; PrepareMigration answers
    # tcp://<it>. Empty: libvirt's choice (qemu.conf migration_host, else the hostname).
    migration_address: str = ""
    # The libvirt URI other hosts' libvirtd dial to reach this host's for a migration's
    # control connection (peer to peer); PrepareMigration answers it as target_uri, the
    # source's MigrateVM dials it. Empty: qemu+tls://<migration_address>/system when
    # migration_address is set, else libvirt_uri (right only on one machine: dev pairs).
    migration_libvirt_uri: str = ""
    # A directory with cacert.pem, clientcert.pem and clientkey.pem (this host's hostd
    # certificate, laid out by the bootstrap role) that this host's libvirtd presents when
    # it dials a peer's qemu+tls URI as a migration's source (libvirt's ``pkipath``).
    # Empty: libvirt's own files (/etc/pki/libvirt, /etc/pki/CA).
    migration_client_pki: str = ""
    # The host bridge (already up, outside hostd) a VF's virtio-net standby joins when the
    # VM asks for failover (VfRequest.migration FAILOVER: QEMU's failover pair, the VF as
    # primary). Empty: this host offers no failover pair; such a VM is refused naming
    # vfs[i].migration (CreateVM, PrepareMigration).
    failover_bridge: str = ""
    # Guest images a VM may name (hostd/apply/images.py).
    image_dir: Path = Path("/var/lib/hostd/images")
    # Guest tuning profiles a VM may name (guestimages/profiles/*.toml).
    profiles_dir: Path = Path(__file__).resolve().parents[1] / "guestimages" / "profiles"
    # <memoryBacking><locked/>: keep guest RAM unswappable. Needs RLIMIT_MEMLOCK
    # for QEMU under libvirtd; off where the host cannot grant it (docs/design-notes.md).
    lock_guest_memory: bool = True
    # Seconds between libvirt liveness checks (reconnect + resync on loss).
    watchdog_s: float = 2.0
    # Seconds between reconciles while libvirt stays up (0 = only at start and after a
    # reconnect): the backstop for a lifecycle event hostd missed (its handler failed,
    # or it came while hostd was busy elsewhere), as Nova's power-state sync is.
    reconcile_s: float = Field(300.0, ge=0, le=86400)
    # Prometheus text endpoint (host:port); empty = off.
    metrics_listen: str = "127.0.0.1:9743"
    # The URL Prometheus scrapes, registered with the scheduler, which lists it for
    # Prometheus's service discovery (GET /v1/prometheus/targets): "http(s)://host:port/path".
    # Default: metrics_listen's host (advertise_address's host when metrics_listen listens on
    # every address) and port, path /metrics. Ignored when metrics_listen is empty.
    metrics_url: str = ""
    # The scheduler this host registers with (empty = standalone, no registration).
    scheduler_url: str = ""
    # File holding the bearer token with the scheduler's "host" scope.
    scheduler_token_file: Path | None = None
    # CA for the scheduler's HTTPS certificate (default: the system store).
    scheduler_ca: Path | None = None
    # host:port the scheduler dials for gRPC (default: this hostname and listen's port).
    advertise_address: str = ""
    # Name in the scheduler (default: hostname), rack and labels for placement.
    host_name: str = ""
    rack: str = ""
    labels: dict[str, str] = {}
    heartbeat_s: float = 10.0
    # The host's days, folded from its IO-health samples (hostd/health/daily.py), are sent
    # to the scheduler every days_s seconds (0 = not sent) for the fleet's utilisation
    # view; peak_window is the host-local window whose CPU use is kept by class.
    days_s: float = Field(300.0, ge=0, le=86400)
    # Heartbeats carry no stats by default (the days above are what the scheduler keeps);
    # true: each beat also carries the IO-health summary since the last one, which the
    # scheduler folds into 5-minute buckets (GET /v1/hosts/{name}/stats).
    heartbeat_stats: bool = False
    peak_window: str = "21:00-22:00"
    # The IO-health signal (hostd/health/): seconds between samples (0 = off).
    io_health_interval_s: float = Field(1.0, ge=0, le=60)
    # An active probe of the IO service: "" (none), "tcp:HOST:PORT", "http://HOST:PORT/PATH"
    # or "command:ARGV..."; its latency histogram is hostd_io_probe_seconds.
    io_probe: str = ""
    io_probe_timeout_s: float = Field(1.0, gt=0, le=30)
    io_probe_interval_s: float = Field(1.0, gt=0, le=300)
    # The release this hostd was installed from (deploy/ansible writes the bundle's id
    # there): GetHostInfo's hostd_version is "<package version>+<release id>" when it
    # exists, so a rollout of a new build is told apart from the old one.
    release_file: Path = Path("/opt/hybrid-kvm/.release-id")


def load_config(path: Path | None) -> HostdConfig:
    """Read the config file (missing default file = all defaults) and apply env overrides."""
    data: dict = {}
    if path is not None or DEFAULT_CONFIG.exists():
        p = path or DEFAULT_CONFIG
        try:
            data = tomllib.loads(p.read_text())
        except OSError as e:
            raise ConfigError(f"cannot read {p}: {e.strerror}", field=str(p)) from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{p} is not valid TOML: {e}", field=str(p)) from None
    try:
        # Init kwargs win over env in pydantic-settings; env must win over the file.
        cfg = _with_env_over_file(data)
    except ValidationError as e:
        err = e.errors()[0]
        raise ConfigError(err["msg"], field=".".join(map(str, err["loc"]))) from None
    try:
        Probe.parse(cfg.io_probe, cfg.io_probe_timeout_s)
    except ProbeSpecError as e:
        raise ConfigError(str(e), field="io_probe") from None
    if cfg.metrics_url:
        try:
            check_metrics_url(cfg.metrics_url)  # the scheduler's rule: what it would refuse, hostd does not start with
        except ValueError as e:
            raise ConfigError(f"{cfg.metrics_url!r}: {e}", field="metrics_url") from None
    for key, check in (("host_name", lambda: cfg.host_name and check_host_name(cfg.host_name)),
                       ("rack", lambda: check_rack(cfg.rack)), ("labels", lambda: check_host_labels(cfg.labels))):
        try:
            check()  # what the scheduler's registration refuses, likewise
        except ValueError as e:
            raise ConfigError(str(e), field=key) from None
    try:
        parse_window(cfg.peak_window)
    except (ValueError, IndexError) as e:
        raise ConfigError(f"{cfg.peak_window!r}: HH:MM-HH:MM within a day, the end after the start ({e})",
                          field="peak_window") from None
    tls = [cfg.tls_cert, cfg.tls_key, cfg.tls_ca]
    if any(tls) and not all(tls):
        raise ConfigError("give tls_cert, tls_key and tls_ca together", field="tls_cert")
    return cfg


def _with_env_over_file(data: dict) -> HostdConfig:
    env_only = HostdConfig()
    merged = {**data, **{k: getattr(env_only, k) for k in env_only.model_fields_set}}
    return HostdConfig(**merged)
