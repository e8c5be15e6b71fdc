"""The remote carve (GetHostInfo, PlanCarve, Carve, Uncarve) on a real daemon: the
`hostd serve` wiring in-process on a copy of a recorded host tree (treehost.py), so
"nothing changed" is checked byte for byte over the whole tree. The command line's
carve, beside such a daemon: test_carve_cli.py."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from tools.dev.hostd_inproc import dev_certs
from treehost import (
    CONFIGURED,
    POLICY,
    REPO,
    SHRINK,
    UPGRADE,
    Host,
    carve,
    changed,
    create_vm,
    digest,
    refused,
    snapshot,
    uncarve,
)

import hostd
from api import hostd_pb2 as pb
from api.layout import Layout
from hostd.apply.carve_state import STATE_NAME
from hostd.cli import main as hostd_cli
from hostd.errors import ConfigError


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    return dev_certs(tmp_path_factory.mktemp("ca"), clients=("oss-2",))


@pytest.fixture
def host(tmp_path: Path, certs: Path) -> Iterator[Host]:
    h = Host(tmp_path, certs).start()
    try:
        yield h
    finally:
        h.stop()


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
        e = refused(lambda: host.stub().Carve(pb.CarveRequest(policy_toml=UPGRADE, policy_digest=given,
                                                              expected_digest="", operation_id="t/1"), timeout=30))
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.details().startswith("hyb.policy.digest_mismatch [policy_digest]: ")
    assert snapshot(host.root) == before


# ---------------------------------------------------------------- compare-and-set


def test_a_carve_over_a_carve_it_did_not_expect_is_refused_naming_who_made_it(host: Host) -> None:
    """Two rollouts read the host uncarved; the first carves; the second's carve, which
    expects "" (uncarved), is refused, names the first's digest and operation, and
    changes nothing. The first's retry (the same operation) is a no-op, not a conflict."""
    stub = host.stub()
    first = carve(stub, UPGRADE, expected="", operation="rollout/a/oss-1/carve")
    assert first.changed
    info = stub.GetHostInfo(pb.GetHostInfoRequest(), timeout=10)
    assert (info.carve_operation, info.carved_by) == ("rollout/a/oss-1/carve", "fleet-rollout")
    assert 0 < time.time() - info.carved_unix < 60
    before = snapshot(host.root)
    for text in (CONFIGURED, UPGRADE):
        e = refused(lambda: carve(stub, text, expected="", operation="rollout/b/oss-1/carve"))
        assert e.code() == grpc.StatusCode.ABORTED
        assert e.details().startswith("hyb.carve.conflict [expected_digest]: the host is carved with "
                                      f"{digest(UPGRADE)} by fleet-rollout (operation rollout/a/oss-1/carve)")
        assert "not uncarved as this request expects; nothing was changed" in e.details()
    e = refused(lambda: uncarve(stub, expected=digest(CONFIGURED), operation="rollout/b/oss-1/rollback"))
    assert e.code() == grpc.StatusCode.ABORTED and "carved with " + digest(UPGRADE) in e.details()
    assert snapshot(host.root) == before
    # a controller that died after its carve asks again with what it expected then
    assert not carve(stub, UPGRADE, expected="", operation="rollout/a/oss-1/carve").changed
    assert stub.GetHostInfo(pb.GetHostInfoRequest(), timeout=10).carve_operation == "rollout/a/oss-1/carve"
    # the owner's expectation holds: its uncarve goes through; an uncarve of an uncarved host is a no-op
    assert uncarve(stub, expected=digest(UPGRADE), operation="rollout/a/oss-1/rollback").steps
    assert list(uncarve(stub, expected=digest(UPGRADE), operation="rollout/b/oss-1/rollback").steps) == []
    info = stub.GetHostInfo(pb.GetHostInfoRequest(), timeout=10)
    assert info.carved_policy_digest == info.carve_operation == info.carved_by == ""


def test_a_carve_must_say_what_it_replaces_and_who_asks(host: Host) -> None:
    stub = host.stub()
    before = snapshot(host.root)
    cases = {
        "expected_digest": pb.CarveRequest(policy_toml=UPGRADE, policy_digest=digest(UPGRADE), operation_id="t/1"),
        "operation_id": pb.CarveRequest(policy_toml=UPGRADE, policy_digest=digest(UPGRADE), expected_digest=""),
    }
    for field, req in cases.items():
        e = refused(lambda: stub.Carve(req, timeout=30))
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.details().startswith(f"hyb.carve.request_invalid [{field}]: required"), e.details()
    bad = pb.CarveRequest(policy_toml=UPGRADE, policy_digest=digest(UPGRADE), expected_digest="abc",
                          operation_id="t/1")
    assert refused(lambda: stub.Carve(bad, timeout=30)).details().startswith(
        "hyb.carve.request_invalid [expected_digest]: 'abc' is not a sha256")
    spaced = pb.UncarveRequest(expected_digest="", operation_id="two words")
    assert refused(lambda: stub.Uncarve(spaced, timeout=30)).details().startswith(
        "hyb.carve.request_invalid [operation_id]: ")
    assert refused(lambda: stub.Uncarve(pb.UncarveRequest(operation_id="t/1"), timeout=30)).details().startswith(
        "hyb.carve.request_invalid [expected_digest]: ")
    assert snapshot(host.root) == before


def test_carve_refuses_a_layout_that_would_not_hold_the_vms(host: Host) -> None:
    stub = host.stub()
    carve(stub, CONFIGURED)
    vm = create_vm(stub)
    assert list(vm.vcpu_pins) == [2]  # CPU 2 is the IO service's in SHRINK
    before = snapshot(host.root)
    p = stub.PlanCarve(pb.PlanCarveRequest(policy_toml=SHRINK), timeout=30)
    assert len(p.vm_conflicts) == 1 and p.vm_conflicts[0].startswith(f"rc-1 ({vm.vm_id}, running): vCPUs on CPUs 2")
    e = refused(lambda: carve(stub, SHRINK))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert e.details().startswith("hyb.carve.vms_would_not_fit [vm_conflicts]: rc-1 (")
    assert snapshot(host.root) == before
    assert host.stub().GetHostInfo(pb.GetHostInfoRequest(), timeout=10).carved_policy_digest == digest(CONFIGURED)
    # a layout that holds it is carved with the VM running
    assert carve(stub, UPGRADE).changed


def test_a_vm_on_a_host_not_carved_for_it_is_refused_as_such(host: Host) -> None:
    """The tree has no hugetlbfs mount until a carve records one: libvirt could not back
    the VM's memory. CreateVM says so (FAILED_PRECONDITION, hyb.host.not_carved), before
    anything is claimed or defined; once carved, the same request is served."""
    stub = host.stub("scheduler")
    before = snapshot(host.root)
    e = refused(lambda: create_vm(stub))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert e.details().startswith("hyb.host.not_carved [hugepage_size_kb]: no hugetlbfs mount with 2048 kB pages")
    assert list(stub.ListVMs(pb.ListVMsRequest(), timeout=10).vms) == []
    assert snapshot(host.root) == before
    carve(host.stub(), CONFIGURED)
    assert create_vm(stub).state == pb.VM_STATE_RUNNING


# ---------------------------------------------------------------- Uncarve


def test_uncarve_restores_the_tree_exactly(host: Host) -> None:
    stub = host.stub()
    before = snapshot(host.root)
    c = carve(stub, UPGRADE)
    u = uncarve(stub, drained=False)
    assert len(u.steps) == len(c.steps) and u.steps[0] == c.steps[-1]  # newest first
    assert changed(before, snapshot(host.root)) == []
    assert not (host.state / STATE_NAME).exists()
    info = stub.GetHostInfo(pb.GetHostInfoRequest(), timeout=10)
    assert info.carved_policy_digest == "" and info.journal_steps == 0 and info.carved_policy_toml == "" and list(info.reboot_pending) == []
    assert info.policy_digest == digest(CONFIGURED)  # back to the policy file's layout
    assert stub.GetInventory(pb.GetInventoryRequest(), timeout=10).nodes[0].hugepages[0].total == 64
    assert list(uncarve(stub, drained=False).steps) == []  # idempotent
    assert changed(before, snapshot(host.root)) == []


def test_uncarve_is_refused_while_vms_run_and_until_drained(host: Host) -> None:
    stub = host.stub()
    carve(stub, UPGRADE)
    vm = create_vm(stub)
    carved = snapshot(host.root)
    e = refused(lambda: uncarve(stub, drained=True))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert e.details() == (f"hyb.carve.vms_running [vms]: VMs are running: rc-1 ({vm.vm_id}, running); "
                           "drain the host first")
    stub.StopVM(pb.StopVMRequest(vm_id=vm.vm_id), timeout=10)
    e = refused(lambda: uncarve(stub, drained=False))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert e.details().startswith(f"hyb.carve.not_drained [drained]: VMs exist (rc-1 ({vm.vm_id}, stopped))")
    assert snapshot(host.root) == carved
    assert stub.GetHostInfo(pb.GetHostInfoRequest(), timeout=10).carved_policy_digest == digest(UPGRADE)
    assert uncarve(stub, drained=True).steps
    assert stub.GetHostInfo(pb.GetHostInfoRequest(), timeout=10).carved_policy_digest == ""


@pytest.mark.parametrize("state", ["incoming", "migrating"])
def test_uncarve_is_refused_while_a_vm_moves_though_drained_is_said(host: Host, state: str) -> None:
    """A live migration's target (its QEMU receiving) and its source (the job running) hold
    the carve's CPUs and pages as a running VM does: an uncarve told the host is drained is
    refused all the same (the list used to name running, creating and deleting only)."""
    stub = host.stub()
    carve(stub, UPGRADE)
    vm = create_vm(stub)
    assert host.d is not None
    host.d.manager.ledger.set_state(vm.vm_id, state, "a move in progress (set by the test)")
    carved = snapshot(host.root)
    e = refused(lambda: uncarve(stub, drained=True))
    assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert e.details() == (f"hyb.carve.vms_running [vms]: VMs are running: rc-1 ({vm.vm_id}, {state}); "
                           "drain the host first")
    assert snapshot(host.root) == carved
    assert stub.GetHostInfo(pb.GetHostInfoRequest(), timeout=10).carved_policy_digest == digest(UPGRADE)


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
