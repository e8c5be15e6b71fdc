"""The remote carve (GetHostInfo, PlanCarve, Carve, Uncarve) on a real daemon: the
`hostd serve` wiring in-process (hostd.rpc.daemon.start) over mTLS with dev-CA
certificates, libvirt's test driver (test:///default), a real SQLite ledger, acting on
a copy of a recorded host tree (tests/data/hosts/1s-8c-nosmt-1pf-8vf: 8 CPUs, one node,
cgroup v2) instead of this machine. Every write lands in the tree, so "nothing
changed" is checked byte for byte over the whole tree."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import libvirt
import pytest
from tools.dev.hostd_inproc import dev_certs, render

import hostd
from api import hostd_pb2 as pb
from api import hostd_pb2_grpc as pb_grpc
from api.layout import Layout
from hostd.apply.images import ImageStore
from hostd.cli import main as hostd_cli
from hostd.config import HostdConfig
from hostd.errors import ConfigError
from hostd.rpc import daemon
from hostd.rpc.carving import STATE_NAME

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


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    return dev_certs(tmp_path_factory.mktemp("ca"), clients=("oss-2",))


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

    def start(self) -> Host:
        self.d = daemon.start(self.cfg)
        self.d.manager.render = render  # a test-driver domain (the real designer's XML: test_serve_live)
        return self

    def stop(self) -> None:
        for c in self.channels:
            c.close()
        self.channels.clear()
        if self.d is not None:
            # LibvirtHost.close does not deregister its lifecycle callback, and the test
            # driver is one per process: without this, the next test's domain events reach
            # this daemon's closed ledger. (A real hostd is one per process.)
            self.d.libvirt._listeners.clear()
            self.d.stop(0)
            self.d = None
        conn = libvirt.open("test:///default")  # one driver state per process, shared
        try:
            for dom in conn.listAllDomains():
                if dom.name().startswith(PREFIX):
                    if dom.isActive():
                        dom.destroy()
                    dom.undefine()
        finally:
            conn.close()

    def stub(self, who: str = "fleet-rollout") -> pb_grpc.HostdStub:
        assert self.d is not None
        creds = grpc.ssl_channel_credentials((self.certs / "ca.crt").read_bytes(),
                                             private_key=(self.certs / f"{who}.key").read_bytes(),
                                             certificate_chain=(self.certs / f"{who}.crt").read_bytes())
        self.channels.append(grpc.secure_channel(f"localhost:{self.d.port}", creds))
        return pb_grpc.HostdStub(self.channels[-1])


@pytest.fixture
def host(tmp_path: Path, certs: Path) -> Iterator[Host]:
    h = Host(tmp_path, certs).start()
    try:
        yield h
    finally:
        h.stop()


def carve(stub: pb_grpc.HostdStub, text: str) -> pb.CarveResponse:
    return stub.Carve(pb.CarveRequest(policy_toml=text, policy_digest=digest(text)), timeout=30)


def refused(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value


def create_vm(stub: pb_grpc.HostdStub, name: str = "rc-1") -> pb.VM:
    return stub.CreateVM(pb.CreateVMRequest(request_id=f"req-{name}", name=name, vcpus=1, memory_mib=128,
                                            image="smoke"), timeout=10)


# ---------------------------------------------------------------- PlanCarve


def test_plan_carve_says_what_carve_would_do_and_changes_nothing(host: Host) -> None:
    before = snapshot(host.root)
    p = host.stub().PlanCarve(pb.PlanCarveRequest(policy_toml=UPGRADE), timeout=30)
    assert p.policy_digest == digest(UPGRADE) and not p.HasField("nofit") and not p.already_carved
    layout = Layout.from_json(p.layout_json)
    assert layout.io_cpus == (0, 1) and layout.vm_cpus == (2, 3, 4, 5, 6, 7)
    assert [(t.size_kb, t.count) for t in layout.nodes[0].hugepages] == [(2048, 128)]
    cg = host.root / "sys/fs/cgroup"
    assert f"write {cg}/oss.slice/cpuset.cpus: '' -> '0-1'" in p.steps
    assert f"create {cg}/machine" in p.steps
    assert f"mount hugetlbfs pagesize=2048kB at {host.root}/dev/hugepages-2M" in p.steps
    assert "isolcpus=managed_irq,domain,2-7" in p.reboot_required
    assert list(p.vm_conflicts) == []
    assert snapshot(host.root) == before and not (host.state / STATE_NAME).exists()
    # "" plans the policy hostd serves with: its policy file here
    served = host.stub("oss-2").PlanCarve(pb.PlanCarveRequest(), timeout=30)
    assert served.policy_digest == digest(CONFIGURED)


def test_plan_carve_of_a_policy_that_does_not_fit_names_the_key(host: Host) -> None:
    p = host.stub().PlanCarve(pb.PlanCarveRequest(policy_toml=POLICY.format(io=9, pages=64)), timeout=30)
    assert p.HasField("nofit") and p.nofit.field.startswith("io_service.")
    assert "CPU" in p.nofit.reason
    assert p.layout_json == "" and list(p.steps) == []
    e = refused(lambda: carve(host.stub(), POLICY.format(io=9, pages=64)))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert e.details().startswith(f"hyb.carve.nofit [{p.nofit.field}]: ")


def test_a_bad_policy_names_the_field(host: Host) -> None:
    bad = CONFIGURED.replace("io_floor_percent = 5", "io_floor_percent = 500")
    for call in (lambda: host.stub().PlanCarve(pb.PlanCarveRequest(policy_toml=bad), timeout=30),
                 lambda: carve(host.stub(), bad)):
        e = refused(call)
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.details().startswith("hyb.policy.invalid [hugepages.io_floor_percent]: "), e.details()
    e = refused(lambda: carve(host.stub(), "[io_service\ncpus = 1"))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.details().startswith("hyb.policy.invalid [policy_toml]: not valid TOML")


# ---------------------------------------------------------------- Carve


def test_carve_changes_the_tree_and_a_second_carve_changes_nothing(host: Host) -> None:
    stub = host.stub()
    before = snapshot(host.root)
    c = carve(stub, UPGRADE)
    assert c.changed and c.policy_digest == digest(UPGRADE) and c.steps
    cg = host.root / "sys/fs/cgroup"
    assert (cg / "oss.slice/cpuset.cpus").read_text() == "0-1"
    assert (cg / "machine/cpuset.cpus").read_text() == "2-7"
    assert (host.root / "sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages").read_text() == "128"
    assert "hugetlbfs /dev/hugepages-2M hugetlbfs" in (host.root / "proc/mounts").read_text()
    assert (host.root / "dev/hugepages-2M").is_dir()
    assert len(changed(before, snapshot(host.root))) >= 6

    info = stub.GetHostInfo(pb.GetHostInfoRequest(), timeout=10)
    assert info.carved_policy_digest == info.policy_digest == digest(UPGRADE)
    assert info.carved_policy_toml == UPGRADE  # what a rollout records to carve it again on rollback
    assert info.journal_steps == len(c.steps)
    assert "isolcpus=managed_irq,domain,2-7" in info.reboot_pending
    # after a reboot with them on the kernel command line, nothing is pending
    (host.root / "proc/cmdline").write_text("BOOT_IMAGE=/vmlinuz ro " + " ".join(info.reboot_pending) + "\n")
    assert list(stub.GetHostInfo(pb.GetHostInfoRequest(), timeout=10).reboot_pending) == []
    state = json.loads((host.state / STATE_NAME).read_text())
    assert state["digest"] == digest(UPGRADE) and state["policy_toml"] == UPGRADE
    # the daemon serves VMs with the new layout now
    inv = stub.GetInventory(pb.GetInventoryRequest(), timeout=10)
    assert inv.nodes[0].hugepages[0].total == 128
    assert Layout.from_json(inv.layout_json) == Layout.from_json(state["layout_json"])

    after = snapshot(host.root)
    again = carve(stub, UPGRADE)
    assert not again.changed and list(again.steps) == []
    assert snapshot(host.root) == after
    assert stub.PlanCarve(pb.PlanCarveRequest(policy_toml=UPGRADE), timeout=30).already_carved


def test_a_failing_step_rolls_the_whole_carve_back(host: Host) -> None:
    """The hugetlbfs mount point is a file: the mount, after the cgroup and hugepage
    writes, fails; every step before it is undone and the tree is byte-identical."""
    (host.root / "dev/hugepages-2M").write_bytes(b"in the way")
    before = snapshot(host.root)
    e = refused(lambda: carve(host.stub(), UPGRADE))
    assert e.code() == grpc.StatusCode.ABORTED
    assert e.details().startswith("hyb.carve.failed [")
    assert "not a directory" in e.details() and "every step of this carve was undone" in e.details()
    assert changed(before, snapshot(host.root)) == []
    info = host.stub().GetHostInfo(pb.GetHostInfoRequest(), timeout=10)
    assert info.carved_policy_digest == "" and info.journal_steps == 0 and info.carved_policy_toml == ""
    assert info.policy_digest == digest(CONFIGURED)
    assert host.stub().GetInventory(pb.GetInventoryRequest(), timeout=10).nodes[0].hugepages[0].total == 64


def test_the_digest_must_be_the_texts(host: Host) -> None:
    before = snapshot(host.root)
    for given in (digest(CONFIGURED), ""):
        e = refused(lambda: host.stub().Carve(pb.CarveRequest(policy_toml=UPGRADE, policy_digest=given),
                                              timeout=30))
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.details().startswith("hyb.policy.digest_mismatch [policy_digest]: ")
    assert snapshot(host.root) == before


def test_carve_refuses_a_layout_that_would_not_hold_the_vms(host: Host) -> None:
    stub = host.stub()
    vm = create_vm(stub)
    assert list(vm.vcpu_pins) == [2]  # CPU 2 is the IO service's in SHRINK
    before = snapshot(host.root)
    p = stub.PlanCarve(pb.PlanCarveRequest(policy_toml=SHRINK), timeout=30)
    assert len(p.vm_conflicts) == 1 and p.vm_conflicts[0].startswith(f"rc-1 ({vm.vm_id}, running): vCPUs on CPUs 2")
    e = refused(lambda: carve(stub, SHRINK))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert e.details().startswith("hyb.carve.vms_would_not_fit [vm_conflicts]: rc-1 (")
    assert snapshot(host.root) == before
    assert host.stub().GetHostInfo(pb.GetHostInfoRequest(), timeout=10).carved_policy_digest == ""
    # a layout that holds it is carved with the VM running
    assert carve(stub, UPGRADE).changed


# ---------------------------------------------------------------- Uncarve


def test_uncarve_restores_the_tree_exactly(host: Host) -> None:
    stub = host.stub()
    before = snapshot(host.root)
    c = carve(stub, UPGRADE)
    u = stub.Uncarve(pb.UncarveRequest(), timeout=30)
    assert len(u.steps) == len(c.steps) and u.steps[0] == c.steps[-1]  # newest first
    assert changed(before, snapshot(host.root)) == []
    assert not (host.state / STATE_NAME).exists()
    info = stub.GetHostInfo(pb.GetHostInfoRequest(), timeout=10)
    assert info.carved_policy_digest == "" and info.journal_steps == 0 and info.carved_policy_toml == "" and list(info.reboot_pending) == []
    assert info.policy_digest == digest(CONFIGURED)  # back to the policy file's layout
    assert stub.GetInventory(pb.GetInventoryRequest(), timeout=10).nodes[0].hugepages[0].total == 64
    assert list(stub.Uncarve(pb.UncarveRequest(), timeout=30).steps) == []  # idempotent
    assert changed(before, snapshot(host.root)) == []


def test_uncarve_is_refused_while_vms_run_and_until_drained(host: Host) -> None:
    stub = host.stub()
    carve(stub, UPGRADE)
    vm = create_vm(stub)
    carved = snapshot(host.root)
    e = refused(lambda: stub.Uncarve(pb.UncarveRequest(drained=True), timeout=30))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert e.details() == (f"hyb.carve.vms_running [vms]: VMs are running: rc-1 ({vm.vm_id}, running); "
                           "drain the host first")
    stub.StopVM(pb.StopVMRequest(vm_id=vm.vm_id), timeout=10)
    e = refused(lambda: stub.Uncarve(pb.UncarveRequest(drained=False), timeout=30))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert e.details().startswith(f"hyb.carve.not_drained [drained]: VMs exist (rc-1 ({vm.vm_id}, stopped))")
    assert snapshot(host.root) == carved
    assert stub.GetHostInfo(pb.GetHostInfoRequest(), timeout=10).carved_policy_digest == digest(UPGRADE)
    assert stub.Uncarve(pb.UncarveRequest(drained=True), timeout=30).steps
    assert stub.GetHostInfo(pb.GetHostInfoRequest(), timeout=10).carved_policy_digest == ""


# ---------------------------------------------------------------- who, and across restarts


def test_another_hosts_certificate_plans_but_cannot_carve(host: Host) -> None:
    intruder = host.stub("oss-2")
    before = snapshot(host.root)
    for method, call in (("Carve", lambda: carve(intruder, UPGRADE)),
                         ("Uncarve", lambda: intruder.Uncarve(pb.UncarveRequest(drained=True), timeout=10))):
        e = refused(call)
        assert e.code() == grpc.StatusCode.PERMISSION_DENIED
        assert e.details().startswith(f"hyb.rpc.forbidden [caller]: caller oss-2 may not call {method}")
    assert intruder.GetHostInfo(pb.GetHostInfoRequest(), timeout=10).policy_digest == digest(CONFIGURED)
    assert intruder.PlanCarve(pb.PlanCarveRequest(policy_toml=UPGRADE), timeout=30).steps
    assert snapshot(host.root) == before
    assert carve(host.stub("scheduler"), UPGRADE).changed  # the default mutating callers


def test_host_info_names_this_hostd(host: Host) -> None:
    info = host.stub().GetHostInfo(pb.GetHostInfoRequest(), timeout=10)
    setup = (REPO / "setup.cfg").read_text()
    assert info.hostd_version == hostd.__version__ and f"version = {info.hostd_version}\n" in setup
    assert info.host and info.vms == 0 and info.vms_running == 0 and info.started_unix > 0


def test_host_info_names_the_release_it_was_installed_from(tmp_path: Path, certs: Path) -> None:
    """deploy/ansible writes the bundle's id to release_file: a new build under the same
    package version still reports a new version, which a hostd rollout checks."""
    h = Host(tmp_path, certs)
    (tmp_path / "release-id").write_text("4f2a9c0e1b7d55aa0000\n")
    try:
        info = h.start().stub().GetHostInfo(pb.GetHostInfoRequest(), timeout=10)
    finally:
        h.stop()
    assert info.hostd_version == f"{hostd.__version__}+4f2a9c0e1b7d"


def test_a_restarted_hostd_serves_the_carved_policy(host: Host) -> None:
    stub = host.stub()
    first = stub.GetHostInfo(pb.GetHostInfoRequest(), timeout=10)
    carve(stub, UPGRADE)
    vm = create_vm(stub)
    host.d.libvirt._listeners.clear()  # as in Host.stop
    host.d.stop(0)  # hostd stops; the domain keeps running
    host.d = None
    host.start()
    stub = host.stub()
    info = stub.GetHostInfo(pb.GetHostInfoRequest(), timeout=10)
    assert info.policy_digest == info.carved_policy_digest == digest(UPGRADE)  # not the policy file's
    assert info.started_unix > first.started_unix and info.vms_running == 1
    inv = stub.GetInventory(pb.GetInventoryRequest(), timeout=10)
    assert inv.nodes[0].hugepages[0].total == 128 and inv.nodes[0].hugepages[0].used == 64
    assert not carve(stub, UPGRADE).changed
    stub.DeleteVM(pb.DeleteVMRequest(vm_id=vm.vm_id), timeout=10)


def test_the_cli_carve_records_its_digest_for_hostd(tmp_path: Path, certs: Path) -> None:
    h = Host(tmp_path, certs)
    cfg = tmp_path / "hostd.toml"
    cfg.write_text(f'root = "{h.root}"\nstate_dir = "{h.state}"\npolicy = "{tmp_path / "policy.toml"}"\n'
                   'virt_type = "qemu"\n')
    (tmp_path / "upgrade.toml").write_text(UPGRADE)
    before = snapshot(h.root)
    assert hostd_cli(["--config", str(cfg), "carve", "--policy", str(tmp_path / "upgrade.toml")]) == 0
    assert json.loads((h.state / STATE_NAME).read_text())["digest"] == digest(UPGRADE)
    h.start()
    try:
        info = h.stub().GetHostInfo(pb.GetHostInfoRequest(), timeout=10)
        assert info.carved_policy_digest == info.policy_digest == digest(UPGRADE)
        assert not carve(h.stub(), UPGRADE).changed  # the RPC sees the CLI's carve as its own
    finally:
        h.stop()
    assert hostd_cli(["--config", str(cfg), "uncarve"]) == 0
    assert not (h.state / STATE_NAME).exists()
    assert changed(before, snapshot(h.root)) == []


def test_a_second_hostd_on_a_taken_port_fails_instead_of_sharing_it(tmp_path: Path, certs: Path) -> None:
    """gRPC binds with SO_REUSEPORT by default: a second hostd on the same port would
    silently take half of the first one's connections (tools/dev/fleetsim saw two simulated
    hosts answer for each other). hostd turns it off, so the second one fails to start."""
    first = Host(tmp_path / "a", certs).start()
    try:
        second = Host(tmp_path / "b", certs)
        second.cfg = second.cfg.model_copy(update={"listen": f"127.0.0.1:{first.d.port}"})
        with pytest.raises(ConfigError) as e:
            second.start()
        assert e.value.field == "listen"
    finally:
        first.stop()
