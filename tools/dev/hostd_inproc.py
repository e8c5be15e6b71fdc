"""A real hostd gRPC server in-process, for functional tests of the API and of the
scheduler's dispatch: mTLS with tools/dev/make-dev-ca.sh certificates, a real SQLite
ledger, libvirt's own test driver (``test:///default``, a real libvirt without a
daemon) and a recording stand-in for the VF rate driver (no SR-IOV hardware here).

``private=True``: the hostd gets a test driver of its own (``test://<tmp>/node.xml``:
its own domains, as a host has), and live migration between such hostds: hostd's own
PrepareMigration, MigrateVM, CompleteMigration and AbortMigration with their ledgers,
claims and refusals, where only libvirt's job (which the test driver lacks) is played by
``InprocMigrations``: the target's domain XML defined and started on the target's test
driver, the source's domain gone. ``fail_migrations`` makes the next jobs fail as
libvirt would (the VM stays on the source). The QEMU job itself is tested with two real
libvirtd hosts (tests/hostd/migrate/). Device hot-plug, which the test driver lacks too
(a VF unplugged for a move, plugged on the target), is played the same way: the calls
recorded, the guest's VFs as they would be."""

from __future__ import annotations

import os
import subprocess
import threading
import xml.etree.ElementTree as ET
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import libvirt

from api import hostd_pb2 as pb
from api import hostd_pb2_grpc as pb_grpc
from api.layout import DiskBudget, HugepageTarget, IoServiceTarget, Layout, NodeLayout, PfLayout, VfSlot
from hostd.apply.images import ImageStore
from hostd.apply.ledger import Ledger
from hostd.apply.libvirt_host import LibvirtHost
from hostd.apply.migration import JobFigures, MigrateRequest, Migrations
from hostd.errors import MigrationFailed
from hostd.apply.vms import VmManager
from hostd.domain.metadata import NS, VmMetadata
from hostd.rpc.callers import CallerCheck
from hostd.rpc.servicer import HostdService
from tools.dev.domains import remove_domains

REPO = Path(__file__).resolve().parents[2]
LAYOUT = Layout(
    nodes=(NodeLayout(0, (0,), (1,), (2, 3), (HugepageTarget(2048, 256),)),),
    pfs=(PfLayout("ens1f0", "0000:3b:00.0", 0, 2, 10000, (VfSlot(0, 0, 0), VfSlot(1, 0, 0))),),
    disks=(DiskBudget("nvme0n1", "nvme-eui.01", 0, 10**12, 10**9, 10**5),),
    io_service=IoServiceTarget("none", ""), vm_cgroup="machine", reboot_required=())
VF_PCI = {("ens1f0", 0): "0000:3b:02.0", ("ens1f0", 1): "0000:3b:02.1"}
# Two nodes of 2 VM CPUs and 128 x 2 MiB pages each, the PF on node 1: what a VM
# spanning nodes needs (this machine has one node, so only the test driver runs it).
TWO_NODES = Layout(
    nodes=(NodeLayout(0, (0,), (1,), (2, 3), (HugepageTarget(2048, 128),)),
           NodeLayout(1, (4,), (5,), (6, 7), (HugepageTarget(2048, 128),))),
    pfs=(PfLayout("ens1f0", "0000:3b:00.0", 1, 2, 10000, (VfSlot(0, 0, 0), VfSlot(1, 0, 0))),),
    disks=(), io_service=IoServiceTarget("none", ""), vm_cgroup="machine", reboot_required=())


class Rates:
    """Plays the PF driver's VF rate table (what netlink would set)."""

    def __init__(self) -> None:
        self.rates: dict[tuple[str, int], tuple[int, int]] = {}

    def get_rate(self, pf: str, vf: int) -> tuple[int, int]:
        return self.rates.get((pf, vf), (0, 0))

    def set_rate(self, pf: str, vf: int, mx: int, mn: int) -> None:
        self.rates[(pf, vf)] = (mx, mn)


def render(md: VmMetadata, image) -> str:  # type: ignore[no-untyped-def]
    """A minimal test-driver domain carrying hostd's metadata (the real designer's XML
    is tested with libvirtd + QEMU elsewhere)."""
    return (f"<domain type='test'><name>{md.spec.name}</name><uuid>{md.vm_id}</uuid>"
            f"<metadata>{md.to_xml()}</metadata><memory unit='MiB'>{md.spec.memory_mib}</memory>"
            f"<vcpu>{md.spec.vcpus}</vcpu><os><type arch='x86_64'>hvm</type></os></domain>")


def dev_certs(d: Path, clients: tuple[str, ...] = ()) -> Path:
    """The dev CA's certificates, plus a client certificate for each name in ``clients``."""
    subprocess.run(["bash", str(REPO / "tools/dev/make-dev-ca.sh"), str(d)], check=True, capture_output=True,
                   env={**os.environ, "DEV_CA_CLIENTS": " ".join(clients)})
    return d


# the private test drivers of this process by URI: where InprocMigrations finds a target
_PRIVATE: dict[str, LibvirtHost] = {}
# held for each switch-over: a test that looks at every host under it sees each move
# before or after, as one instant (a look host by host could straddle one)
SWITCH = threading.Lock()


class InprocMigrations(Migrations):
    """hostd's migration, with libvirt's job played on private test drivers: the
    target's domain XML (PrepareMigration's rendering) defined and started on the target
    URI's driver once the source's is paused, then the source's destroyed and undefined, as
    ``virsh migrate --persistent --undefinesource`` leaves them. ``fail``: reasons the
    next jobs fail with (the VM stays on the source), one per job. ``gate``: when set, a
    job waits until it is open (a move that takes its time), then goes on."""

    def __init__(self, manager: VmManager, *, target_uri: str):
        super().__init__(manager, target_uri=target_uri)
        self.fail: list[str] = []
        self.moved: list[str] = []  # names of the VMs this host sent away
        self.gate: threading.Event | None = None
        self.waiting = threading.Event()  # a job waits at the gate
        # libvirt's job statistics while a job waits at the gate (GetMigration answers
        # them, as hostd's sampler leaves them for a real job); None: no sample
        self.stats: dict[str, int] | None = None
        # device hot-plug played: (op, vm_id, device XML, flags) per call, and what the
        # guest then has beside its defined devices (aliases out, aliases plugged in)
        self.calls: list[tuple[str, str, str, int]] = []
        self.out: dict[str, set[str]] = {}
        self.plugged_in: dict[str, set[str]] = {}
        self.guest_keeps = False  # the guest ignores an unplug request (no ACPI hotplug, busy driver)

    def _attach(self, vm_id: str, xml: str, flags: int) -> None:
        self._domain(vm_id)  # the domain must be there, as libvirt's would
        self.calls.append(("attach", vm_id, xml, flags))
        alias = _alias(xml)
        self.out.setdefault(vm_id, set()).discard(alias)
        self.plugged_in.setdefault(vm_id, set()).add(alias)

    def _request_unplug(self, vm_id: str, xml: str) -> None:
        """The unplug asked; the guest releases the device unless ``guest_keeps``
        (hostd's own wait, ``Migrations._detach``, then sees it stay)."""
        self._domain(vm_id)
        self.calls.append(("detach", vm_id, xml, libvirt.VIR_DOMAIN_AFFECT_LIVE))
        if not self.guest_keeps:
            self.out.setdefault(vm_id, set()).add(_alias(xml))

    def _plugged(self, vm_id: str) -> set[str]:
        return (super()._plugged(vm_id) | self.plugged_in.get(vm_id, set())) - self.out.get(vm_id, set())

    def _run(self, rec, req: MigrateRequest) -> JobFigures:  # type: ignore[no-untyped-def]
        if self.gate is not None:
            if self.stats is not None:
                self._last[req.name] = dict(self.stats)
            self.waiting.set()
            self.gate.wait(60)
        if self.fail:
            raise MigrationFailed(self.fail.pop(0), field="target_uri")
        target = _PRIVATE.get(req.target_uri)
        if target is None:
            raise MigrationFailed(f"unable to connect to {req.target_uri}: no such host", field="target_uri")
        with SWITCH:  # as QEMU switches over: the source paused, the target resumed, the source gone
            self.m.libvirt.conn().lookupByUUIDString(rec.vm_id).suspend()
            target.conn().defineXML(req.domain_xml).create()
            self.m.libvirt.destroy_and_undefine(rec.vm_id)
        self.moved.append(req.name)
        return JobFigures(job_ms=12, downtime_ms=3, data_bytes=4096, memory_bytes=4096, completed_record=True)


def _alias(device_xml: str) -> str:
    a = ET.fromstring(device_xml).find("alias")
    return "" if a is None else a.get("name", "")


@dataclass
class InprocHostd:
    server: grpc.Server
    port: int
    manager: VmManager
    libvirt: LibvirtHost
    migrations: InprocMigrations | None = None

    def stop(self, domain_prefix: str) -> None:
        """Stop serving; remove the test driver's domains whose name has the prefix."""
        self.server.stop(0).wait()
        remove_domains(self.libvirt.conn(), domain_prefix)
        self.manager.ledger.close()
        _PRIVATE.pop(self.libvirt.uri, None)
        self.libvirt.close()


def start_hostd(tmp: Path, certs: Path, name: str, *, with_image: bool = True, workers: int = 8,
                layout: Layout = LAYOUT, mutating_callers: tuple[str, ...] = ("scheduler",),
                sampler=None, private: bool = False) -> InprocHostd:  # type: ignore[no-untyped-def]
    (tmp / "vmlinuz").write_bytes(b"k")
    images = ImageStore(tmp / "images")
    if with_image:
        images.add("smoke", "1", "kernel", {"kernel": tmp / "vmlinuz"})
    if private:
        (tmp / "node.xml").write_text("<node></node>")
    lv = LibvirtHost(f"test://{tmp / 'node.xml'}" if private else "test:///default", NS)
    m = VmManager(layout=layout, siblings={}, ledger=Ledger(tmp / "ledger.db"), libvirt=lv, images=images,
                  render=render, disk_check=lambda n: [], vf_rates=Rates(), pf_drivers={"ens1f0": "ice"},
                  vf_pci=VF_PCI)
    server = grpc.server(futures.ThreadPoolExecutor(workers))
    migrations = InprocMigrations(m, target_uri=lv.uri) if private else None
    if private:
        _PRIVATE[lv.uri] = lv
    pb_grpc.add_HostdServicer_to_server(HostdService(m, host=name, layout_json=layout.to_json(None),
                                                     health=lambda: pb.HealthResponse(ok=True),
                                                     callers=CallerCheck(frozenset(mutating_callers)),
                                                     sampler=sampler, migrations=migrations), server)
    creds = grpc.ssl_server_credentials([((certs / "hostd.key").read_bytes(), (certs / "hostd.crt").read_bytes())],
                                        root_certificates=(certs / "ca.crt").read_bytes(),
                                        require_client_auth=True)
    port = server.add_secure_port("127.0.0.1:0", creds)
    server.start()
    return InprocHostd(server, port, m, lv, migrations)
