"""A `hostd serve` on each host of tools/dev/libvirt_pair.py, and hostd's live migration
between them: for tests/hostd/migrate/test_hostd_migrate.py and bench/migration.py.

Each side is one hostd process (tools/dev/procs.py ``Hostd``: stopped by its PID) with
``libvirt_uri`` = its pair host's socket, ``virt_type = "qemu"``, its own state dir under
/var/tmp (QEMU writes the guest's console log there), its own dev CA, image store (the
smoke guest with its ticker, ``smoke-tick``) and carve policy: the IO service on one CPU,
VMs on the other, a 2 MiB pool for one guest, and its own loop device as the only
allow-listed raw disk.

    a = HostdSide(tmp / "a", pair.a, loop_a, io_cpu=0, smoke_guest=...).start()
    b = HostdSide(tmp / "b", pair.b, loop_b, io_cpu=1, smoke_guest=..., migration_address=pair.b.addr).start()
    moved, wall = migrate(a, b, vm_id, iotune=..., bandwidth_mib_s=64, tls=True)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TextIO

import grpc

from api import hostd_pb2 as pb
from tools.dev.libvirt_pair import Host
from tools.dev.procs import Hostd, grpc_stub, hostd_workdir, write_hostd_config

TICK = re.compile(r"^HYB-TICK (\S+) (\d+)\r?$", re.MULTILINE)
IMAGE = "smoke-tick"
# The guest the live-migration tests move (tests/hostd/migrate/, tests/e2e/test_e2e_migrate.py)
MEMORY_MIB = 128
GUEST_PAGES = MEMORY_MIB // 2
POOL_PAGES = GUEST_PAGES + 8  # each host's carve: room for the guest
MARK_OFFSET = 2**20  # where a test writes its marker on the guest's raw disk
BOOT_S = 400  # a TCG boot to the first tick on a loaded 2-CPU machine


class HostdSide:
    """One host: its libvirtd (of the pair), its hostd, its disk and state dir. ``cfg``:
    more hostd config keys (``migration_address``); ``migration_libvirt_uri`` is the pair
    host's socket URI (what PrepareMigration answers as ``target_uri``)."""

    def __init__(self, tmp: Path, host: Host, disk: Path, *, io_cpu: int, smoke_guest: dict, pool_pages: int,
                 name: str, certs: Path | None = None, **cfg: object):
        """``certs``: a dev CA's directory both sides share (a scheduler calls both); by
        default each side has its own. ``name``: hostd's name of the VM the test watches."""
        tmp.mkdir(parents=True)
        self.host, self.disk, self.name = host, disk, name
        own = hostd_workdir(tmp, smoke_guest, pages=pool_pages, disk=disk.name, host_cpus_per_node=0,
                            io_cpus=str(io_cpu))
        self.certs = certs or own
        from hostd.apply.images import ImageStore
        ImageStore(tmp / "images").add(IMAGE, "1", "kernel",
                                       {"kernel": smoke_guest["kernel"], "initrd": smoke_guest["initrd"]},
                                       cmdline="console=ttyS0 panic=-1 hyb.tick=1")
        self.state = Path(tempfile.mkdtemp(prefix="hyb-test-mig-", dir="/var/tmp"))
        self.state.chmod(0o755)
        write_hostd_config(tmp / "hostd.toml", policy=tmp / "policy.toml", state=self.state,
                           images=tmp / "images", certs=self.certs, libvirt_uri=host.uri,
                           **({"migration_libvirt_uri": host.uri} | cfg))
        env = {k: v for k, v in os.environ.items() if not k.startswith("HOSTD_")}
        self.hostd = Hostd(tmp / "hostd.toml", env, tmp / "hostd.log")
        self.channels: list[grpc.Channel] = []
        self.held: list[TextIO] = []  # hold_console's files, closed by stop() if a test did not

    def start(self, **env: str) -> "HostdSide":
        """``env``: more environment (HOSTD_TEST_FAULTS, HOSTD_CRASH_AT)."""
        for ch in self.channels:
            ch.close()
        self.channels.clear()
        self.hostd.start(**env)
        self.stub, ch = grpc_stub(self.hostd.port, self.certs)
        self.channels.append(ch)
        return self

    def stop(self) -> None:
        for ch in self.channels:
            ch.close()
        for f in self.held:  # a test that failed before it closed them: not left to the GC of a later test
            f.close()
        self.hostd.stop()
        shutil.rmtree(self.state, ignore_errors=True)

    @property
    def console(self) -> Path:
        return self.state / "vms" / self.name / "console.log"

    def ticks(self) -> list[tuple[str, int]]:
        """(boot id, n) of each whole tick line in the guest's console log here."""
        return parse_ticks(self.console.read_text(errors="replace") if self.console.exists() else "")

    def hold_console(self) -> "TextIO":
        """The console log open: hostd removes the file with the VM's directory when the VM
        leaves (a migration's source), and what QEMU wrote until then stays readable here."""
        f = open(self.console, errors="replace")  # noqa: SIM115 - closed by the test, else by stop()
        self.held.append(f)
        return f

    def wait_ticks(self, *, after: int, timeout: float) -> list[tuple[str, int]]:
        deadline = time.monotonic() + timeout
        while True:
            t = self.ticks()
            if t and t[-1][1] > after:
                return t
            if time.monotonic() > deadline:
                tail = self.console.read_text(errors="replace")[-2000:] if self.console.exists() else "(none)"
                raise TimeoutError(f"{self.host.name}: no tick past {after} within {timeout} s; console tail:\n{tail}")
            time.sleep(0.3)

    def domains(self) -> list[str]:
        return sorted(self.host.virsh("list", "--all", "--name").stdout.split())

    def inventory(self) -> pb.Inventory:
        return self.stub.GetInventory(pb.GetInventoryRequest(), timeout=10)

    def vms(self) -> list[tuple[str, int]]:
        return [(v.name, v.state) for v in self.stub.ListVMs(pb.ListVMsRequest(), timeout=10).vms]


def claimed(inv: pb.Inventory) -> tuple:
    """What a host's inventory says is held: CPUs, pages, disks' owners and budgets used."""
    return (list(inv.nodes[0].used_cpus), inv.nodes[0].hugepages[0].used,
            [(d.name, d.vm_id, d.bytes_sec_used, d.iops_used) for d in inv.disks])


def write_marker(dev: Path, tag: str, offset: int = MARK_OFFSET) -> bytes:
    """A random marker written (and synced) at ``offset`` of a guest's raw disk, which the
    smoke guest never writes: read back on the other host after a move. Returns it."""
    marker = f"{tag} {os.urandom(8).hex()}".encode()
    with open(dev, "r+b") as f:
        f.seek(offset)
        f.write(marker)
        os.fsync(f.fileno())
    return marker


def read_marker(dev: Path, marker: bytes, offset: int = MARK_OFFSET) -> bytes:
    """What ``dev`` holds where ``write_marker`` put ``marker``."""
    with open(dev, "rb") as f:
        f.seek(offset)
        return f.read(len(marker))


def disk_free(dev: Path) -> bool:
    """Nothing holds the device exclusively (hostd's hold, a mount, ...)."""
    try:
        os.close(os.open(dev, os.O_RDONLY | os.O_EXCL))
    except OSError:
        return False
    return True


def parse_ticks(text: str) -> list[tuple[str, int]]:
    """(boot id, n) of each whole ``HYB-TICK`` line (the last line may be half-written)."""
    return [(m[1], int(m[2])) for m in TICK.finditer(text[:text.rfind("\n") + 1])]


def size_of(dev: Path) -> int:
    return int(subprocess.run(["blockdev", "--getsize64", str(dev)], check=True, capture_output=True,
                              text=True).stdout)


def prepare_request(vm: pb.VM, src: HostdSide, *, request_id: str, iotune: pb.IoTune) -> pb.PrepareMigrationRequest:
    """PrepareMigration for the VM as the source reports it (GetVM), with the target's
    throttles ``iotune`` on every disk."""
    return pb.PrepareMigrationRequest(
        request_id=request_id, vm_id=vm.vm_id, source_host=src.host.name,
        vm=pb.CreateVMRequest(request_id=vm.request_id, name=vm.name, vcpus=len(vm.vcpu_pins),
                              memory_mib=vm.memory_mib, hugepage_size_kb=vm.hugepage_size_kb, image=vm.image,
                              labels=dict(vm.labels),
                              disks=[pb.DiskRequest(disk=d.disk, iotune=iotune) for d in vm.disks]),
        source_disks=[pb.SourceDisk(disk=d.disk, size_bytes=size_of(Path(d.device)), serial=d.serial)
                      for d in vm.disks])


def migrate(src: HostdSide, dst: HostdSide, vm_id: str, *, iotune: pb.IoTune, request_id: str,
            bandwidth_mib_s: int = 0, tls: bool = True, timeout_s: int = 300) -> tuple[pb.MigrateVMResponse, float]:
    """The whole move through hostd: PrepareMigration on ``dst``, MigrateVM on ``src``,
    CompleteMigration on ``dst`` (AbortMigration there if the move failed). Returns the
    job's figures as the target recorded them (CompleteMigration's) and the wall time of
    the three calls."""
    vm = src.stub.GetVM(pb.GetVMRequest(vm_id=vm_id), timeout=10)
    t0 = time.monotonic()
    ready = dst.stub.PrepareMigration(prepare_request(vm, src, request_id=request_id, iotune=iotune), timeout=120)
    try:
        moved = src.stub.MigrateVM(pb.MigrateVMRequest(
            name=vm.name, target_uri=dst.host.uri, migrate_uri=ready.migrate_uri, domain_xml=ready.domain_xml,
            migrate_disks=[d.target for d in ready.disks], bandwidth_mib_s=bandwidth_mib_s, timeout_s=timeout_s,
            on_timeout=pb.ON_TIMEOUT_ABORT, tls=tls), timeout=timeout_s + 120)
    except grpc.RpcError:
        dst.stub.AbortMigration(pb.MigrationRef(name=vm.name), timeout=60)
        raise
    done = dst.stub.CompleteMigration(pb.MigrationRef(name=vm.name), timeout=60)
    wall = time.monotonic() - t0
    return (done.job if done.job.completed_record else moved), wall
