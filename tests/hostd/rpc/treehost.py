"""A real `hostd serve` in-process on a copy of a recorded host tree, for the tests of
the carve (RPC and command line) and of the daemon's life: the daemon's own wiring
(hostd.rpc.daemon.start) over mTLS with dev-CA certificates, libvirt's test driver
(test:///default), a real SQLite ledger, acting on a copy of
tests/data/hosts/1s-8c-nosmt-1pf-8vf (8 CPUs, one node, cgroup v2) instead of this
machine. Every write lands in the tree, so "nothing changed" is checked byte for byte
over the whole tree."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import grpc
import libvirt
import pytest

from api import hostd_pb2 as pb
from api import hostd_pb2_grpc as pb_grpc
from hostd.apply.images import ImageStore
from hostd.config import HostdConfig
from hostd.rpc import daemon
from tools.dev.hostd_inproc import render
from tools.dev.domains import remove_domains

REPO = Path(__file__).resolve().parents[3]
TREE = REPO / "tests/data/hosts/1s-8c-nosmt-1pf-8vf"
PREFIX = "rc-"  # test driver domains this module makes

POLICY = """
[io_service]
cgroup = "oss.slice"
cpus_per_node = {io}

[[hugepages.pools]]
size = "2M"
count_per_node = {pages}

[hugepages]
io_floor_percent = 5
"""
CONFIGURED = POLICY.format(io=2, pages=64)  # the policy file: io_cpus 0-1, VM CPUs 2-7
UPGRADE = POLICY.format(io=2, pages=128)  # what a rollout ships: a bigger pool
SHRINK = POLICY.format(io=4, pages=64)  # io_cpus 0-3: VM CPU 2 goes to the IO service


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every directory, file (its bytes) and symlink (its target) under ``root``."""
    out: dict[str, bytes | str] = {}
    for d, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(d) / name
            rel = str(p.relative_to(root))
            out[rel] = ("-> " + os.readlink(p)) if p.is_symlink() else "<dir>" if p.is_dir() else p.read_bytes()
    return out


def changed(before: dict, after: dict) -> list[str]:
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


def host_tree(dest: Path) -> Path:
    """The recorded tree, plus what a carve of it touches: the IO service's cgroup, the
    cpuset controller already enabled for children. The attributes a carve writes hold
    no trailing newline (write_attr writes none), so an undo restores them byte for byte."""
    shutil.copytree(TREE, dest, symlinks=True)
    cg = dest / "sys/fs/cgroup"
    (cg / "cgroup.subtree_control").write_text("cpuset cpu io memory pids")
    (cg / "oss.slice").mkdir()
    (cg / "oss.slice/cpuset.cpus").write_text("")
    (cg / "oss.slice/cpuset.mems").write_text("")
    for attr in (dest / "sys").rglob("nr_hugepages"):
        attr.write_text(attr.read_text().strip())
    (dest / "dev").mkdir(exist_ok=True)
    return dest


class Host:
    """One hostd on one tree: start, restart, stubs for any dev-CA client name."""

    def __init__(self, tmp: Path, certs: Path):
        self.tmp, self.certs = tmp, certs
        self.root = host_tree(tmp / "host")
        self.state = tmp / "state"
        (tmp / "policy.toml").write_text(CONFIGURED)
        (tmp / "vmlinuz").write_bytes(b"k")
        ImageStore(tmp / "images").add("smoke", "1", "kernel", {"kernel": tmp / "vmlinuz"})
        self.cfg = HostdConfig(
            virt_type="qemu", policy=tmp / "policy.toml", state_dir=self.state, root=self.root,
            listen="127.0.0.1:0", tls_cert=certs / "hostd.crt", tls_key=certs / "hostd.key",
            tls_ca=certs / "ca.crt", libvirt_uri="test:///default", image_dir=tmp / "images",
            lock_guest_memory=False, metrics_listen="", io_health_interval_s=0, watchdog_s=60,
            release_file=tmp / "release-id")
        self.d: daemon.Daemon | None = None
        self.channels: list[grpc.Channel] = []
        # The hypervisor, which outlives a hostd restart: the test driver drops its
        # domains once its last connection closes, as a host reboot would.
        self.hypervisor: libvirt.virConnect | None = None

    def start(self) -> Host:
        if self.hypervisor is None:
            self.hypervisor = libvirt.open("test:///default")  # one driver state per process, shared
        self.d = daemon.start(self.cfg)
        self.d.manager.render = render  # a test-driver domain (the real designer's XML: test_serve_live)
        return self

    def stop(self) -> None:
        for c in self.channels:
            c.close()
        self.channels.clear()
        if self.d is not None:
            self.d.stop(0)
            self.d = None
        conn, self.hypervisor = self.hypervisor, None
        if conn is None:
            return
        try:
            remove_domains(conn, PREFIX)
        finally:
            conn.close()

    def stub(self, who: str = "fleet-rollout") -> pb_grpc.HostdStub:
        assert self.d is not None
        creds = grpc.ssl_channel_credentials((self.certs / "ca.crt").read_bytes(),
                                             private_key=(self.certs / f"{who}.key").read_bytes(),
                                             certificate_chain=(self.certs / f"{who}.crt").read_bytes())
        self.channels.append(grpc.secure_channel(f"localhost:{self.d.port}", creds))
        return pb_grpc.HostdStub(self.channels[-1])


def current(stub: pb_grpc.HostdStub) -> str:
    """The digest the host is carved with now ("" = uncarved): what a carve expects."""
    return stub.GetHostInfo(pb.GetHostInfoRequest(), timeout=30).carved_policy_digest


def carve(stub: pb_grpc.HostdStub, text: str, *, expected: str | None = None,
          operation: str = "test/carve") -> pb.CarveResponse:
    """Carve ``text`` over what the host carries (``expected``: else read first)."""
    return stub.Carve(pb.CarveRequest(policy_toml=text, policy_digest=digest(text),
                                      expected_digest=current(stub) if expected is None else expected,
                                      operation_id=operation), timeout=30)


def uncarve(stub: pb_grpc.HostdStub, *, drained: bool = False, expected: str | None = None,
            operation: str = "test/uncarve") -> pb.UncarveResponse:
    return stub.Uncarve(pb.UncarveRequest(drained=drained, operation_id=operation,
                                          expected_digest=current(stub) if expected is None else expected),
                        timeout=30)


def refused(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value


def create_vm(stub: pb_grpc.HostdStub, name: str = "rc-1") -> pb.VM:
    return stub.CreateVM(pb.CreateVMRequest(request_id=f"req-{name}", name=name, vcpus=1, memory_mib=128,
                                            image="smoke"), timeout=10)
