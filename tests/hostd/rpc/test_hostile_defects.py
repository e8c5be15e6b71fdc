"""hostd under hostile input (issue #37): one test per defect found, each a call that
must be refused with INVALID_ARGUMENT and a ``hyb.*`` code naming the field, and change
nothing: no domain, no ledger row, no directory under ``<state_dir>/vms``.

A real `hostd serve` on a simulated host: the daemon's wiring in-process on a recorded
host tree (treehost.py) with its real domain designer on libvirt's test driver, so a
VM's console directory is made as on a real host; D1 runs `hostd serve` as its own
process, whose memory is measured. The bounds themselves: tests/api/test_bounds.py.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import libvirt
import pytest
from tools.dev.hostd_inproc import dev_certs, start_hostd
from tools.dev.procs import Hostd, write_hostd_config
from tools.dev.procstat import cpu_s, stat_fields
from treehost import CONFIGURED, PREFIX, Host, carve, host_tree, refused

from api import hostd_pb2 as pb
from api import hostd_pb2_grpc as pb_grpc
from hostd.rpc import daemon


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    return dev_certs(tmp_path_factory.mktemp("ca"), clients=("oss-2",))


class DesignerHost(Host):
    """treehost's Host with hostd's own domain designer (which makes each VM's console
    directory), not the test module's minimal domain."""

    def start(self) -> DesignerHost:
        if self.hypervisor is None:
            self.hypervisor = libvirt.open("test:///default")
        self.d = daemon.start(self.cfg)
        return self


@pytest.fixture
def host(tmp_path: Path, certs: Path) -> Iterator[DesignerHost]:
    h = DesignerHost(tmp_path, certs).start()
    try:
        carve(h.stub(), CONFIGURED)  # the hugetlbfs mount a VM's memory needs
        yield h
    finally:
        h.stop()


def vm_request(name: str = f"{PREFIX}hx", rid: str = "req-hx", **kw) -> pb.CreateVMRequest:
    return pb.CreateVMRequest(request_id=rid, name=name, vcpus=1, memory_mib=128, image="smoke", **kw)


def nothing_changed(h: DesignerHost) -> None:
    """No VM in the ledger, no domain of ours, nothing under state/vms."""
    assert h.d is not None and h.hypervisor is not None
    assert h.d.manager.ledger.list() == []
    assert [d.name() for d in h.hypervisor.listAllDomains() if d.name() != "test"] == []
    vms = h.state / "vms"
    assert not vms.exists() or sorted(os.listdir(vms)) == []


def invalid(e: grpc.RpcError, code: str, field: str) -> None:
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e.details()
    assert e.details().startswith(f"{code} [{field}]: "), e.details()


# ---------------------------------------------------------------- D1: memory through a read-only RPC


def vm_hwm_kb(pid: int) -> int:
    """The process's peak resident set (VmHWM), in kB."""
    line = next(ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ln.startswith("VmHWM:"))
    return int(line.split()[1])


def proc_cpu_s(pid: int) -> float:
    fields = stat_fields(f"/proc/{pid}/stat")
    assert fields is not None, f"hostd (PID {pid}) is gone"
    return cpu_s(fields)


SERVED = """
[io_service]
cgroup = "oss.slice"
cpus = "0"

[[hugepages.pools]]
size = "2M"
count_per_node = 64

[hugepages]
io_floor_percent = 5
"""


def test_d1_plan_carve_with_a_huge_cpu_range_is_refused_fast_in_bounded_memory(tmp_path: Path,
                                                                                 certs: Path) -> None:
    """PlanCarve is read-only and open to every fleet certificate: a CPU range to 2**32
    once grew hostd to 17 GB. Now it is refused before the range is expanded. The
    daemon runs under a 4 GB address-space limit, so a regression fails here instead
    of taking the machine's memory."""
    root = host_tree(tmp_path / "host")
    (tmp_path / "policy.toml").write_text(SERVED)
    cfg = write_hostd_config(tmp_path / "hostd.toml", policy=tmp_path / "policy.toml", state=tmp_path / "state",
                             images=tmp_path / "images", certs=certs, libvirt_uri="test:///default",
                             root=str(root), io_health_interval_s=0, watchdog_s=60,
                             release_file=str(tmp_path / "release-id"))
    d = Hostd(cfg, dict(os.environ), tmp_path / "hostd.log")
    d.argv = ["prlimit", f"--as={4 << 30}", "--", *d.argv]
    d.start()
    assert d.proc is not None
    creds = grpc.ssl_channel_credentials((certs / "ca.crt").read_bytes(), (certs / "oss-2.key").read_bytes(),
                                         (certs / "oss-2.crt").read_bytes())
    ch = grpc.secure_channel(f"localhost:{d.port}", creds)
    try:
        stub = pb_grpc.HostdStub(ch)
        assert stub.PlanCarve(pb.PlanCarveRequest(), timeout=30).policy_digest  # warm: the served policy
        # hostd's CPU (all its threads), not the wall clock the machine's other work stretches
        before, cpu0 = vm_hwm_kb(d.proc.pid), proc_cpu_s(d.proc.pid)
        e = refused(lambda: stub.PlanCarve(pb.PlanCarveRequest(
            policy_toml=SERVED.replace('cpus = "0"', 'cpus = "0-4294967296"')), timeout=60))
        took = proc_cpu_s(d.proc.pid) - cpu0
        grew_kb = vm_hwm_kb(d.proc.pid) - before
        invalid(e, "hyb.policy.invalid", "io_service.cpus")
        assert "8192" in e.details()
        assert took < 2 and grew_kb < 64 * 1024, (took, grew_kb)
        assert stub.GetHostInfo(pb.GetHostInfoRequest(), timeout=10).host  # still answering
    finally:
        ch.close()
        d.stop()


# ---------------------------------------------------------------- D2: a policy nested 5,000 deep


@pytest.mark.parametrize("text, words", [
    ("a=" + "[" * 5000 + "]" * 5000, "nests 5000 deep"),  # tomllib recursed: RecursionError, INTERNAL
    ("a=" + "9" * 5000, "not a policy"),  # int() refused 5,000 digits: ValueError, INTERNAL
    ("a." * 30000 + "b=1", "dotted key"),  # tomllib's time grows with the square of a dotted key
    ("#" + "x" * (64 * 1024), "larger than 65536 bytes"),
], ids=["nested", "long-integer", "dotted-key", "large"])
def test_d2_a_policy_out_of_bounds_is_policy_invalid(host: DesignerHost, text: str, words: str) -> None:
    t0 = time.process_time()  # hostd serves in this process: its CPU, not the machine's wall clock
    e = refused(lambda: host.stub("oss-2").PlanCarve(pb.PlanCarveRequest(policy_toml=text), timeout=60))
    invalid(e, "hyb.policy.invalid", "policy_toml")
    assert words in e.details() and time.process_time() - t0 < 2


# ---------------------------------------------------------------- D3, D4: names that are paths


@pytest.mark.parametrize("name", ["nl-x\n", ".", "..", "a/b", "x" * 65, ""],
                         ids=["newline", "dot", "dotdot", "slash", "long", "empty"])
def test_d3_d4_a_name_that_is_not_a_vm_name_is_refused_and_leaves_nothing(host: DesignerHost, name: str) -> None:
    e = refused(lambda: host.stub("scheduler").CreateVM(vm_request(name), timeout=10))
    invalid(e, "hyb.spec.invalid", "name")
    nothing_changed(host)


# ---------------------------------------------------------------- D5: request ids


@pytest.mark.parametrize("rid", ["r\x00x", "r x", "r\n", "r" * 129], ids=["nul", "space", "newline", "long"])
def test_d5_a_request_id_out_of_bounds_is_invalid_not_retryable(host: DesignerHost, rid: str) -> None:
    e = refused(lambda: host.stub("scheduler").CreateVM(vm_request(rid=rid), timeout=10))
    invalid(e, "hyb.spec.invalid", "request_id")
    nothing_changed(host)


# ---------------------------------------------------------------- D6: one disk under two names


@pytest.fixture
def inproc(tmp_path: Path, certs: Path) -> Iterator[pb_grpc.HostdStub]:
    """The in-process API server (tools/dev/hostd_inproc.py): its layout has an
    assignable disk, nvme0n1, whose stable id is nvme-eui.01."""
    h = start_hostd(tmp_path, certs, "h1")
    creds = grpc.ssl_channel_credentials((certs / "ca.crt").read_bytes(), (certs / "scheduler.key").read_bytes(),
                                         (certs / "scheduler.crt").read_bytes())
    ch = grpc.secure_channel(f"localhost:{h.port}", creds)
    try:
        yield pb_grpc.HostdStub(ch)
    finally:
        ch.close()
        h.stop("hx")


def test_d6_one_disk_by_name_and_by_id_is_refused_on_the_device(inproc: pb_grpc.HostdStub) -> None:
    tune = pb.IoTune(total_bytes_sec=10**6, total_iops_sec=10)
    twice = [pb.DiskRequest(disk="nvme0n1", iotune=tune), pb.DiskRequest(disk="nvme-eui.01", iotune=tune)]
    e = refused(lambda: inproc.CreateVM(vm_request("hx-d6", disks=twice), timeout=10))
    invalid(e, "hyb.spec.invalid", "disks[1].disk")
    assert "nvme0n1" in e.details()
    assert list(inproc.ListVMs(pb.ListVMsRequest(), timeout=10).vms) == []


# ---------------------------------------------------------------- D7: labels


@pytest.mark.parametrize("labels, words", [
    ({"big": "x" * (3 << 20)}, "at most 255"),  # two of these made ListVMs 6.3 MB for every client
    ({f"k{i}": "v" for i in range(49)}, "49 labels; at most 48"),
    ({f"k{i:02d}": "v" * 100 for i in range(40)}, "at most 4096"),
    ({"bad key": "v"}, "label key"),
    ({"k": "line\nbreak"}, "printable"),
], ids=["3MiB-value", "49-labels", "4000-bytes", "bad-key", "control-char"])
def test_d7_labels_out_of_bounds_are_refused(host: DesignerHost, labels: dict[str, str], words: str) -> None:
    e = refused(lambda: host.stub("scheduler").CreateVM(vm_request(labels=labels), timeout=30))
    invalid(e, "hyb.spec.invalid", "labels")
    assert words in e.details()
    nothing_changed(host)


@pytest.mark.parametrize("kw, field_, words", [
    ({"hugepage_size_kb": 1048576}, "memory_mib", "multiple of the 1048576 kB page size"),
    ({"vfs": [pb.VfRequest(pf="enp1s0f0np0", mac="52:54:00:zz:00:01")]}, "vfs[0].mac", "lower-case MAC"),
    ({"vfs": [pb.VfRequest(pf="enp1s0f0np0", vlan=4095)]}, "vfs[0].vlan", "0 (untagged) to 4094"),
    ({"vfs": [pb.VfRequest(pf="enp1s0f0np0", max_tx_rate_mbps=10, min_tx_rate_mbps=20)]},
     "vfs[0].min_tx_rate_mbps", "exceeds max_tx_rate_mbps"),
], ids=["page-multiple", "mac", "vlan", "rates"])
def test_a_request_wrong_on_any_host_is_invalid_not_refused_here(host: DesignerHost, kw: dict, field_: str,
                                                                 words: str) -> None:
    """The request's own shape is the caller's to fix, whichever host it goes to:
    INVALID_ARGUMENT (``hyb.spec.invalid``), not FAILED_PRECONDITION (``hyb.vm.refused``,
    "not on this host"), found before the manager's lock and the claim."""
    e = refused(lambda: host.stub("scheduler").CreateVM(vm_request(**kw), timeout=10))
    invalid(e, "hyb.spec.invalid", field_)
    assert words in e.details(), e.details()
    nothing_changed(host)


# ---------------------------------------------------------------- smaller ones


def test_an_empty_update_io_limits_writes_nothing(inproc: pb_grpc.HostdStub) -> None:
    vm = inproc.CreateVM(vm_request("hx-io"), timeout=10)
    generation = inproc.GetInventory(pb.GetInventoryRequest(), timeout=10).generation
    again = inproc.UpdateIOLimits(pb.UpdateIOLimitsRequest(vm_id=vm.vm_id), timeout=10)
    assert again == inproc.GetVM(pb.GetVMRequest(vm_id=vm.vm_id), timeout=10)
    assert inproc.GetInventory(pb.GetInventoryRequest(), timeout=10).generation == generation
    inproc.DeleteVM(pb.DeleteVMRequest(vm_id=vm.vm_id), timeout=10)




def test_an_unknown_profile_is_the_readme_s_guest_profile_unknown(host: DesignerHost) -> None:
    e = refused(lambda: host.stub("scheduler").CreateVM(vm_request(profile="turbo"), timeout=10))
    invalid(e, "hyb.guest_profile.unknown", "profile")
    nothing_changed(host)


def test_delete_vm_removes_the_vm_s_directory(host: DesignerHost) -> None:
    stub = host.stub("scheduler")
    vm = stub.CreateVM(vm_request(), timeout=10)
    own = host.state / "vms" / f"{PREFIX}hx"
    assert own.is_dir()  # the designer made it for the console log
    stub.DeleteVM(pb.DeleteVMRequest(vm_id=vm.vm_id), timeout=10)
    assert not own.exists()
    nothing_changed(host)


def test_a_vm_id_out_of_bounds_is_refused_without_echoing_it(host: DesignerHost) -> None:
    stub = host.stub("scheduler")
    for call in (lambda v: stub.GetVM(pb.GetVMRequest(vm_id=v), timeout=10),
                 lambda v: stub.DeleteVM(pb.DeleteVMRequest(vm_id=v), timeout=10)):
        e = refused(lambda: call("x" * 100_000))
        invalid(e, "hyb.spec.invalid", "vm_id")
        assert len(e.details()) <= 1024


def test_a_grace_period_out_of_bounds_is_refused(host: DesignerHost) -> None:
    """StopVM holds the VM manager's lock while the guest powers off: 2**32 s of grace
    would stop every VM change on the host."""
    stub = host.stub("scheduler")
    vm = stub.CreateVM(vm_request(), timeout=10)
    e = refused(lambda: stub.StopVM(pb.StopVMRequest(vm_id=vm.vm_id, grace_seconds=2**32 - 1), timeout=10))
    invalid(e, "hyb.spec.invalid", "grace_seconds")
    assert stub.GetVM(pb.GetVMRequest(vm_id=vm.vm_id), timeout=10).state == pb.VM_STATE_RUNNING


def test_the_bounds_do_not_refuse_what_hostd_s_own_tests_send(host: DesignerHost) -> None:
    """A request at every bound is served: the limits refuse only what is past them."""
    name = f"{PREFIX}" + "n" * (64 - len(PREFIX))
    labels = {f"k{i:02d}": "v" * 80 for i in range(48)}  # 48 labels, 4,000 bytes
    vm = host.stub("scheduler").CreateVM(vm_request(name, "r" * 128, labels=labels), timeout=10)
    assert vm.name == name and dict(vm.labels) == labels

