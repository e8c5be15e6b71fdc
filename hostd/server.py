"""`hostd serve`: discover + plan this host, open the ledger and libvirt,
reconcile, then answer gRPC (mTLS unless plaintext is configured) until SIGTERM.

Threads: gRPC workers; libvirt's default event loop (domain lifecycle events);
a watchdog that checks the libvirt connection every ``watchdog_s`` seconds and,
after a reconnect, re-registers events and reconciles (libvirtd restarts are
survived; VMs keep running under QEMU meanwhile).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import stat
import subprocess
import threading
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import libvirt
from prometheus_client import start_http_server

from api import hostd_pb2 as pb
from api import hostd_pb2_grpc as pb_grpc
from hostd.carve.layout import Layout, NoFit
from hostd.carve.plan import plan_host
from hostd.carve.policy import Policy, PolicyError, load_policy
from hostd.config import ConfigError, HostdConfig
from hostd.discover.model import Topology
from hostd.errors import HostdError
from hostd.images import BadImage, Image, ImageStore
from hostd.ledger import Ledger
from hostd.metadata import NS, VmMetadata
from hostd.metrics import Metrics
from hostd.register import Registrar, registration
from hostd.runtime import LibvirtHost
from hostd.service import HostdService
from hostd.vms import VmManager

log = logging.getLogger(__name__)

_EVENT_STATES = {
    libvirt.VIR_DOMAIN_EVENT_STARTED: "running",
    libvirt.VIR_DOMAIN_EVENT_RESUMED: "running",
    libvirt.VIR_DOMAIN_EVENT_STOPPED: "stopped",
    libvirt.VIR_DOMAIN_EVENT_SHUTDOWN: "stopped",
    libvirt.VIR_DOMAIN_EVENT_CRASHED: "failed",
}
_event_loop_started = False


class StartupError(HostdError):
    code = "hyb.hostd.startup"


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

    def stop(self, grace_s: float = 5.0) -> None:
        self.stop_event.set()
        if self.registrar:
            self.registrar.stop()
        self.server.stop(grace_s).wait()
        self.libvirt.close()
        self.manager.ledger.close()


def _start_event_loop() -> None:
    """libvirt's default event implementation, run on one daemon thread. Must be
    registered before the first connection is opened."""
    global _event_loop_started
    if _event_loop_started:
        return
    libvirt.virEventRegisterDefaultImpl()

    def run() -> None:
        while True:
            libvirt.virEventRunDefaultImpl()
    threading.Thread(target=run, name="libvirt-events", daemon=True).start()
    _event_loop_started = True


def _load_layout(cfg: HostdConfig) -> tuple[Policy, Topology, Layout]:
    from hostd.discover import discover_host

    try:
        policy = load_policy(cfg.policy)
    except PolicyError as e:
        raise StartupError(e.reason, field=f"policy {e.field}") from None
    topo = discover_host(cfg.root, allow=tuple(policy.disks.allow), virt_type=cfg.virt_type,
                         probe_versions=cfg.root == Path("/"))
    layout = plan_host(topo, policy)
    if isinstance(layout, NoFit):
        raise StartupError(f"the policy does not fit this host: {layout}", field=layout.field)
    return policy, topo, layout


def _disk_check(cfg: HostdConfig, policy: Policy):
    """Re-read one disk's state from the live host right before a VM gets it."""
    from hostd.discover import discover_host

    def check(name: str) -> list[str]:
        topo = discover_host(cfg.root, allow=tuple(policy.disks.allow), virt_type=cfg.virt_type,
                             probe_versions=False)
        disk = next((d for d in topo.disks if d.name == name), None)
        if disk is None:
            return [f"{name} is gone from the host"]
        return list(disk.reasons)
    return check


def _renderer(cfg: HostdConfig, topo: Topology):
    from hostd.domain.designer import HostFacts, design_domain
    from hostd.guest_profiles import cmdline_for_vm

    facts = HostFacts(virt_type=cfg.virt_type, lock_memory=cfg.lock_guest_memory,
                      console_dir=cfg.state_dir / "vms", root=cfg.root,
                      siblings={c.id: c.siblings for c in topo.cpus},
                      vf_pci={(n.name, v.index): v.pci for n in topo.nics for v in n.vfs})

    profiles = _profiles(cfg)

    def render(md: VmMetadata, image: Image) -> str:
        if "disk" in image.files:
            overlay = root_overlay(cfg, md.spec.name, image)
            image = dataclasses.replace(image, files=image.files | {"disk": str(overlay)}, format="qcow2")
        if md.spec.profile and "kernel" in image.files:
            manifest = {"name": image.name, "cmdline": image.cmdline,
                        "profiles": list(image.profiles) or None, "capabilities": image.capabilities}
            image = dataclasses.replace(image, cmdline=cmdline_for_vm(
                profiles, manifest, md.spec.profile, vcpus=md.spec.vcpus))
        return design_domain(md, image, facts).to_xml()
    return render


def root_overlay(cfg: HostdConfig, name: str, image: Image) -> Path:
    """A per-VM qcow2 overlay on the image's root disk: VMs never share a writable
    root, and the image stays pristine. Removed with the VM (release_files)."""
    d = cfg.state_dir / "vms" / name
    d.mkdir(parents=True, exist_ok=True)
    blocked = unreachable_for_qemu(d)
    if blocked is not None:
        raise BadImage(f"QEMU cannot reach {d}: {blocked} is not traversable by other users "
                       "(chmod o+x, or move state_dir)", field="state_dir")
    overlay = d / "root.qcow2"
    overlay.unlink(missing_ok=True)  # a leftover of a create that died: start clean
    r = subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", image.files["disk"],
                        "-F", image.format, str(overlay)], capture_output=True, text=True)
    if r.returncode != 0:
        raise BadImage(f"{image.name}: qemu-img could not make the root overlay: {r.stderr.strip()}",
                       field="image")
    return overlay


def unreachable_for_qemu(path: Path) -> Path | None:
    """The first ancestor of ``path`` that QEMU (an unprivileged user under libvirt)
    cannot traverse, or None. libvirt chowns a disk file to the QEMU user but never
    its directories, so a root overlay under a 0700 directory cannot be opened."""
    p = path.resolve()
    for d in [p, *p.parents]:
        try:
            if not d.stat().st_mode & stat.S_IXOTH:
                return d
        except FileNotFoundError:
            continue
    return None


def _release_files(cfg: HostdConfig):
    def release(name: str) -> None:
        (cfg.state_dir / "vms" / name / "root.qcow2").unlink(missing_ok=True)
    return release


def _profiles(cfg: HostdConfig) -> dict:
    from hostd.guest_profiles import load_profiles

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
    policy, topo, layout = _load_layout(cfg)
    metrics = Metrics()
    _start_event_loop()
    lv = LibvirtHost(cfg.libvirt_uri, NS)
    vf_rates = None
    if layout.pfs and cfg.root == Path("/"):
        from hostd.apply.netlink import NetlinkVfRates

        vf_rates = NetlinkVfRates()
    manager = VmManager(
        layout=layout, siblings={c.id: c.siblings for c in topo.cpus},
        ledger=Ledger(cfg.state_dir / "ledger.db"), libvirt=lv, images=ImageStore(cfg.image_dir),
        render=_renderer(cfg, topo), disk_check=_disk_check(cfg, policy), vf_rates=vf_rates,
        pf_drivers={n.name: n.driver for n in topo.nics},
        vf_pci={(n.name, v.index): v.pci for n in topo.nics for v in n.vfs},
        profiles=frozenset(_profiles(cfg)), release_files=_release_files(cfg))

    def on_connect(conn: libvirt.virConnect) -> None:
        def lifecycle(_conn, dom, event, detail, _opaque):
            state = _EVENT_STATES.get(event)
            if state:
                threading.Thread(target=manager.on_domain_event,
                                 args=(dom.UUIDString(), state, f"libvirt event {event}/{detail}"),
                                 daemon=True).start()
        conn.domainEventRegisterAny(None, libvirt.VIR_DOMAIN_EVENT_ID_LIFECYCLE, lifecycle, None)
        conn.setKeepAlive(5, 3)
        if connected.is_set():
            # A reconnect: resync what changed while hostd was blind. On its own
            # thread: this runs under the connection lock, reconcile takes the
            # manager's lock, and a gRPC call may hold them the other way round.
            threading.Thread(target=_reconcile, args=(manager, metrics), name="reconcile",
                             daemon=True).start()
        connected.set()

    connected = threading.Event()
    lv.on_connect.append(on_connect)
    lv.conn()
    _reconcile(manager, metrics)  # before the first request is served
    stop_event = threading.Event()

    def refresh_metrics() -> None:
        metrics.libvirt_reconnects.set(lv.reconnects)
        states: dict[str, int] = {}
        for r in manager.list():
            states[r.state] = states.get(r.state, 0) + 1
        for st in ("creating", "running", "stopped", "failed", "deleting"):
            metrics.vms.labels(st).set(states.get(st, 0))
        inv = manager.inventory()
        for n in inv["nodes"]:
            metrics.free_cpus.labels(str(n["node"])).set(len(n["vm_cpus"]) - len(n["used_cpus"]))
            for h in n["hugepages"]:
                metrics.free_pages.labels(str(n["node"]), str(h["size_kb"])).set(h["total"] - h["used"])

    def watchdog() -> None:
        while not stop_event.wait(cfg.watchdog_s):
            try:
                lv.conn()
                refresh_metrics()
            except HostdError as e:
                log.error("libvirt watchdog: %s", e)
    threading.Thread(target=watchdog, name="libvirt-watchdog", daemon=True).start()

    def health() -> pb.HealthResponse:
        problems = []
        try:
            lv.conn().getLibVersion()
            lv_state = "connected"
        except Exception as e:
            lv_state = f"not connected: {e}"
            problems.append(lv_state)
        problems += [f"host: {w}" for w in topo.host.warnings]
        blocked = unreachable_for_qemu(cfg.state_dir)
        if blocked is not None:
            problems.append(f"state_dir: QEMU cannot traverse {blocked}; VMs with a root disk image will fail")
        vms = manager.list()
        failed = [r.name for r in vms if r.state == "failed"]
        if failed:
            problems.append(f"failed VMs: {', '.join(failed)}")
        return pb.HealthResponse(ok=lv_state == "connected", libvirt=lv_state, virt_type=cfg.virt_type,
                                 vms=len(vms), problems=problems)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="grpc"))
    pb_grpc.add_HostdServicer_to_server(
        HostdService(manager, host=topo.host.hostname or socket.gethostname(),
                     layout_json=layout.to_json(None), health=health, metrics=metrics), server)
    creds = _credentials(cfg)
    port = server.add_secure_port(cfg.listen, creds) if creds else server.add_insecure_port(cfg.listen)
    if port == 0:
        raise ConfigError(f"cannot listen on {cfg.listen}", field="listen")
    server.start()
    refresh_metrics()
    if cfg.metrics_listen:
        host, _, mport = cfg.metrics_listen.rpartition(":")
        start_http_server(int(mport), addr=host.strip("[]") or "0.0.0.0", registry=metrics.registry)
    log.info("hostd serving listen=%s port=%d tls=%s virt_type=%s vms=%d", cfg.listen, port,
             creds is not None, cfg.virt_type, len(manager.list()))
    registrar = _registrar(cfg, topo, layout, manager, port)
    return Daemon(cfg, topo, layout, manager, lv, server, port, stop_event, registrar)


def _registrar(cfg: HostdConfig, topo: Topology, layout: Layout, manager: VmManager,
               port: int) -> Registrar | None:
    if not cfg.scheduler_url:
        return None
    if cfg.scheduler_token_file is None:
        raise ConfigError("registration needs a token with the host scope", field="scheduler_token_file")
    try:
        token = cfg.scheduler_token_file.read_text().strip()
    except OSError as e:
        raise ConfigError(f"{e.filename}: {e.strerror}", field="scheduler_token_file") from None
    name = cfg.host_name or topo.host.hostname or socket.gethostname()
    body = registration(topo, layout, name=name, address=cfg.advertise_address or f"{name}:{port}",
                        rack=cfg.rack, labels=dict(cfg.labels),
                        min_rate={p.name: manager.min_rate_supported(p.name) for p in layout.pfs})
    r = Registrar(cfg.scheduler_url, token, body, interval_s=cfg.heartbeat_s, ca=cfg.scheduler_ca)
    r.start()
    return r


def _reconcile(manager: VmManager, metrics: Metrics) -> None:
    try:
        metrics.reconcile_actions.inc(len(manager.reconcile()))
    except Exception:
        log.exception("reconcile failed")


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
