"""`hostd serve`: discover + plan this host, open the ledger and libvirt,
reconcile, then answer gRPC (mTLS unless plaintext is configured) until SIGTERM.

Threads: gRPC workers; libvirt's default event loop (domain lifecycle events);
a watchdog that checks the libvirt connection every ``watchdog_s`` seconds and,
after a reconnect, re-registers events and reconciles (libvirtd restarts are
survived; VMs keep running under QEMU meanwhile), and reconciles every
``reconcile_s`` besides (a lifecycle event lost is corrected then).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import grpc
from prometheus_client import start_http_server

from api import hostd_pb2_grpc as pb_grpc
from api.layout import Layout
from hostd.apply.carve_service import CarveService, Served, Where, disk_probe, served_policy
from hostd.apply.carve_state import missing_pool_mount
from hostd.apply.cgroups import cpu_controller_cgroup, find_cpuset_fs
from hostd.apply.diskhold import DiskHold
from hostd.apply.migration import Migrations, peer_uri
from hostd.apply.hostlock import HostLock
from hostd.apply.images import ImageStore
from hostd.apply.layout_steps import IO_CGROUP
from hostd.apply.ledger import Ledger, VmState
from hostd.apply.libvirt_host import LibvirtHost, start_event_loop
from hostd.apply.overlays import Overlays
from hostd.apply.vms import VmManager
from hostd.config import HostdConfig
from hostd.discover.fs import HostFs
from hostd.discover.model import Topology
from hostd.domain.designer import HostFacts
from hostd.domain.guest_profiles import Profile, load_profiles
from hostd.domain.metadata import NS
from hostd.domain.renderer import DomainRenderer
from hostd.errors import ConfigError, HostdError
from hostd.health.probe import Probe, ProbeSpecError
from hostd.health.readers import cgroup_threads
from hostd.health.sampler import Sampler
from hostd.health.sampler import Where as SampleWhere
from hostd.metrics import Metrics
from hostd.rpc.callers import CallerCheck
from hostd.rpc.health import HealthCheck
from hostd.rpc.register import Registrar, metrics_url, registration
from hostd.rpc.servicer import HostdService

log = logging.getLogger(__name__)


@dataclass
class Daemon:
    cfg: HostdConfig
    topo: Topology
    layout: Layout
    manager: VmManager
    libvirt: LibvirtHost
    server: grpc.Server
    port: int
    stop_event: threading.Event
    registrar: Registrar | None = None
    sampler: Sampler | None = None
    watchdog: threading.Thread | None = None

    def served(self, s: Served) -> None:
        """A carve (or uncarve) changed the layout VMs are served with (the manager has it
        already): VF addresses, the IO-health signal's io_cpus and cgroups, and the
        scheduler's registration follow."""
        self.topo, self.layout = s.topo, s.layout
        # One dict each, shared with the domain renderer: VFs the carve made get their PCI
        # addresses (the carve service holds the manager's lock while it calls this).
        self.manager.vf_pci.clear()
        self.manager.vf_pci.update({(n.name, v.index): v.pci for n in s.topo.nics for v in n.vfs})
        self.manager.pf_drivers.update({n.name: n.driver for n in s.topo.nics})
        if self.sampler:
            self.sampler.io_cpus, self.sampler.where = s.layout.io_cpus, _sampler_where(self.cfg, s.layout)
        if self.registrar:
            self.registrar.update(_registration(self.cfg, s, self.manager, self.port))

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop serving, then stop everything that writes to the ledger (the watchdog,
        libvirt's domain events and the calls they started), then close it."""
        self.stop_event.set()
        if self.sampler:
            self.sampler.stop()
        if self.registrar:
            self.registrar.stop()
        self.server.stop(grace_s).wait()
        _close(self.libvirt, self.manager, self.watchdog)


def _close(lv: LibvirtHost, manager: VmManager, watchdog: threading.Thread | None) -> None:
    if watchdog is not None:
        watchdog.join()
    lv.close()  # no domain event reaches the manager after this
    manager.ledger.close()


def _where(cfg: HostdConfig) -> Where:
    return Where(root=cfg.root, state_dir=cfg.state_dir, policy_file=cfg.policy, virt_type=cfg.virt_type)


def hostd_version(release_file: Path | None = None) -> str:
    """hostd.__version__ (hostd/__init__.py): the installed distribution's version (read
    here, not imported: the package root has no layer of its own to import from), with
    the release id of the bundle it came from when ``release_file`` holds one."""
    try:
        v = version("hybrid-kvm")
    except PackageNotFoundError:
        v = "0+unknown"
    try:
        rid = release_file.read_text().strip()[:12] if release_file else ""
    except OSError:
        rid = ""
    return f"{v}+{rid}" if rid and "+" not in v else v


def _profiles(cfg: HostdConfig) -> dict[str, Profile]:
    return load_profiles(cfg.profiles_dir) if cfg.profiles_dir.is_dir() else {}


def _credentials(cfg: HostdConfig) -> grpc.ServerCredentials | None:
    if cfg.plaintext:
        log.warning("gRPC without TLS (plaintext = true): local development only")
        return None
    if not (cfg.tls_cert and cfg.tls_key and cfg.tls_ca):
        raise ConfigError("mTLS needs tls_cert, tls_key and tls_ca (or plaintext = true for "
                          "local development)", field="tls_cert")
    try:
        key, cert, ca = cfg.tls_key.read_bytes(), cfg.tls_cert.read_bytes(), cfg.tls_ca.read_bytes()
    except OSError as e:
        raise ConfigError(f"{e.filename}: {e.strerror}", field="tls") from None
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=True)


def start(cfg: HostdConfig) -> Daemon:
    """Serve with the carved policy if the host was carved (carve-state.json), else the
    policy file."""
    served = served_policy(_where(cfg))
    policy, topo, layout = served.policy, served.topo, served.layout
    metrics = Metrics()
    start_event_loop()
    lv = LibvirtHost(cfg.libvirt_uri, NS)
    vf_rates = None
    if layout.pfs and cfg.root == Path("/"):
        from hostd.apply.netlink import NetlinkVfRates  # pyroute2: only where there are PFs

        vf_rates = NetlinkVfRates()
    siblings = {c.id: c.siblings for c in topo.cpus}
    vf_pci = {(n.name, v.index): v.pci for n in topo.nics for v in n.vfs}
    profiles = _profiles(cfg)
    facts = HostFacts(virt_type=cfg.virt_type, lock_memory=cfg.lock_guest_memory,
                      console_dir=cfg.state_dir / "vms", root=cfg.root, siblings=siblings, vf_pci=vf_pci,
                      failover_bridge=cfg.failover_bridge)
    manager = VmManager(
        layout=layout, siblings=siblings, ledger=Ledger(cfg.state_dir / "ledger.db"), libvirt=lv,
        images=ImageStore(cfg.image_dir), render=DomainRenderer(facts, profiles),
        disk_check=disk_probe(policy, _where(cfg)), vf_rates=vf_rates,
        pf_drivers={n.name: n.driver for n in topo.nics}, vf_pci=vf_pci, profiles=frozenset(profiles),
        overlays=Overlays(cfg.state_dir / "vms"), metrics=metrics,
        disk_hold=DiskHold(cfg.root / "dev", missing_ok=cfg.root != Path("/")),
        host_lock=HostLock(cfg.state_dir), carved_for=lambda size_kb: missing_pool_mount(cfg.root, size_kb))
    lv.subscribe(manager)
    lv.conn()
    manager.reconcile_logged()  # before the first request is served
    stop_event = threading.Event()

    def watchdog() -> None:
        last_reconcile = time.monotonic()
        while not stop_event.wait(min(cfg.watchdog_s, cfg.reconcile_s or cfg.watchdog_s)):
            try:
                lv.conn()
                if cfg.reconcile_s and time.monotonic() - last_reconcile >= cfg.reconcile_s:
                    manager.reconcile_logged(periodic=True)
                    last_reconcile = time.monotonic()
                _refresh_metrics(metrics, lv, manager)
            except HostdError as e:
                log.error("libvirt watchdog: %s", e)
    watchdog_thread = threading.Thread(target=watchdog, name="libvirt-watchdog", daemon=True)
    watchdog_thread.start()

    sampler = _sampler(cfg, layout, metrics)
    health = HealthCheck(libvirt=lv, manager=manager, virt_type=cfg.virt_type, state_dir=cfg.state_dir,
                         host_warnings=topo.host.warnings, sampler=sampler)
    creds = _credentials(cfg)
    callers = CallerCheck(frozenset(cfg.rpc_mutating_callers) if creds else None)
    # no SO_REUSEPORT: a second hostd on a taken port must fail, not share its connections
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="grpc"),
                         options=[("grpc.so_reuseport", 0)])
    after: list[Callable[[Served], None]] = []  # the registrar's, once it exists

    def on_served(s: Served) -> None:
        manager.set_layout(s.layout, disk_probe(s.policy, _where(cfg)))
        for fn in after:
            fn(s)
    carver = CarveService(_where(cfg), manager, served=served, on_served=on_served)
    pb_grpc.add_HostdServicer_to_server(
        HostdService(manager, host=topo.host.hostname or socket.gethostname(),
                     layout_json=layout.to_json(None), health=health, metrics=metrics, callers=callers,
                     sampler=sampler, carver=carver, version=hostd_version(cfg.release_file),
                     migrations=Migrations(manager, migration_address=cfg.migration_address,
                                           target_uri=peer_uri(cfg), client_pki=cfg.migration_client_pki)),
        server)
    try:
        port = server.add_secure_port(cfg.listen, creds) if creds else server.add_insecure_port(cfg.listen)
    except RuntimeError:  # newer grpcio raises where older ones answered 0
        port = 0
    if port == 0:
        # what started so far stops again: a failed start leaves no thread or file open
        stop_event.set()
        if sampler:
            sampler.stop()
        _close(lv, manager, watchdog_thread)
        raise ConfigError(f"cannot listen on {cfg.listen} (in use, or not an address here)", field="listen")
    server.start()
    _refresh_metrics(metrics, lv, manager)
    if cfg.metrics_listen:
        host, _, mport = cfg.metrics_listen.rpartition(":")
        start_http_server(int(mport), addr=host.strip("[]") or "0.0.0.0", registry=metrics.registry)
    log.info("hostd serving listen=%s port=%d tls=%s virt_type=%s vms=%d", cfg.listen, port,
             creds is not None, cfg.virt_type, len(manager.list()))
    registrar = _registrar(cfg, served, manager, port, sampler)
    d = Daemon(cfg, topo, layout, manager, lv, server, port, stop_event, registrar, sampler, watchdog_thread)
    after.append(d.served)
    return d


def _refresh_metrics(metrics: Metrics, lv: LibvirtHost, manager: VmManager) -> None:
    metrics.libvirt_reconnects.set(lv.reconnects)
    states: dict[str, int] = {}
    for r in manager.list():
        states[r.state] = states.get(r.state, 0) + 1
    for st in VmState:
        if st is not VmState.DELETED:  # a row's state, never a gone VM's
            metrics.vms.labels(st).set(states.get(st, 0))
    inv = manager.inventory()
    for n in inv["nodes"]:
        metrics.free_cpus.labels(str(n["node"])).set(len(n["vm_cpus"]) - len(n["used_cpus"]))
        for h in n["hugepages"]:
            metrics.free_pages.labels(str(n["node"]), str(h["size_kb"])).set(h["total"] - h["used"])


def _sampler(cfg: HostdConfig, layout: Layout, metrics: Metrics) -> Sampler | None:
    """The IO-health signal on the IO service's and the VMs' cpuset cgroups (where the
    carve put them); off with io_health_interval_s = 0."""
    if cfg.io_health_interval_s <= 0:
        return None
    try:
        probe = Probe.parse(cfg.io_probe, cfg.io_probe_timeout_s)
    except ProbeSpecError as e:
        raise ConfigError(str(e), field="io_probe") from None
    s = Sampler(cfg.root, layout.io_cpus, _sampler_where(cfg, layout),
                interval_s=cfg.io_health_interval_s, probe=probe, probe_interval_s=cfg.io_probe_interval_s,
                metrics=metrics)
    s.start()
    log.info("io-health signal interval=%.1fs io_cpus=%s probe=%s", s.interval_s, list(layout.io_cpus),
             cfg.io_probe or "none")
    return s


def _sampler_where(cfg: HostdConfig, layout: Layout) -> SampleWhere:
    fs = find_cpuset_fs(cfg.root)
    io_dir = vm_dir = throttle = None
    psi = "proc/pressure/cpu"
    if fs is not None:
        rel = fs.mount.relative_to(cfg.root)
        io_dir = str(rel / IO_CGROUP)
        vm_dir = str(rel / layout.vm_cgroup.strip("/"))
        if fs.version == 2 and (cfg.root / io_dir / "cpu.pressure").exists():
            psi = f"{io_dir}/cpu.pressure"
        first = next(iter(sorted(cgroup_threads(HostFs(cfg.root), io_dir))), None)
        cpu_dir = cpu_controller_cgroup(cfg.root, first) if first else None
        throttle = str(cpu_dir.relative_to(cfg.root)) if cpu_dir else None
    return SampleWhere(io_dir, vm_dir, psi=psi, throttle_cgroup=throttle)


def _registration(cfg: HostdConfig, served: Served, manager: VmManager, port: int) -> dict:
    topo, layout = served.topo, served.layout
    name = cfg.host_name or topo.host.hostname or socket.gethostname()
    address = cfg.advertise_address or f"{name}:{port}"
    metrics = (cfg.metrics_url or metrics_url(metrics_listen=cfg.metrics_listen,
                                              advertise_host=address.rpartition(":")[0].strip("[]"))
               ) if cfg.metrics_listen else ""
    return registration(topo, layout, name=name, address=address, rack=cfg.rack, labels=dict(cfg.labels),
                        min_rate={p.name: manager.min_rate_supported(p.name) for p in layout.pfs},
                        metrics_url=metrics, hostd_version=hostd_version(cfg.release_file),
                        carved_policy=served.digest if served.carved else "")


def _registrar(cfg: HostdConfig, served: Served, manager: VmManager,
               port: int, sampler: Sampler | None) -> Registrar | None:
    if not cfg.scheduler_url:
        return None
    if cfg.scheduler_token_file is None:
        raise ConfigError("registration needs a token with the host scope", field="scheduler_token_file")
    try:
        token = cfg.scheduler_token_file.read_text().strip()
    except OSError as e:
        raise ConfigError(f"{e.filename}: {e.strerror}", field="scheduler_token_file") from None
    body = _registration(cfg, served, manager, port)
    r = Registrar(cfg.scheduler_url, token, body, interval_s=cfg.heartbeat_s, ca=cfg.scheduler_ca, stats=sampler,
                  days_s=cfg.days_s, peak_window=cfg.peak_window, days_file=cfg.state_dir / "days.json",
                  beat_stats=cfg.heartbeat_stats)
    r.start()
    return r


def serve(cfg: HostdConfig, *, ready_file: Path | None = None) -> int:
    d = start(cfg)
    if ready_file:
        ready_file.write_text(f"{os.getpid()} {d.port}\n")
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    log.info("hostd stopping")
    d.stop()
    return 0
