"""`hostd carve` / `hostd uncarve` beside a running `hostd serve`: the command line (its
own process) calls the carve service the Carve and Uncarve RPCs call, so it refuses what
they refuse, with the same code and message, changing nothing; and it takes the same
lock, waiting for the daemon's carve (or refusing once its wait is over), as the
daemon's carves and VM changes wait for its. The daemon is the in-process one of
treehost.py (libvirt's test driver, a real ledger, a recorded host tree)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from tools.dev.hostd_inproc import dev_certs
from treehost import CONFIGURED, REPO, SHRINK, UPGRADE, Host, carve, create_vm, digest, refused, snapshot, uncarve

from api import hostd_pb2 as pb
from hostd.apply.carve_state import STATE_NAME
from hostd.apply.hostlock import HostLock


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    return dev_certs(tmp_path_factory.mktemp("ca"))


@pytest.fixture
def host(tmp_path: Path, certs: Path) -> Iterator[Host]:
    """Carved with UPGRADE by the daemon, with one VM running on CPU 2 (an IO CPU in SHRINK)."""
    h = Host(tmp_path, certs).start()
    try:
        carve(h.stub(), UPGRADE)
        h.vm = create_vm(h.stub("scheduler"))  # type: ignore[attr-defined]
        assert list(h.vm.vcpu_pins) == [2]  # type: ignore[attr-defined]
        (tmp_path / "hostd.toml").write_text(
            f'root = "{h.root}"\nstate_dir = "{h.state}"\npolicy = "{tmp_path / "policy.toml"}"\n'
            'virt_type = "qemu"\n')
        for name, text in (("shrink", SHRINK), ("upgrade", UPGRADE), ("configured", CONFIGURED)):
            (tmp_path / f"{name}.toml").write_text(text)
        yield h
    finally:
        h.stop()


def cli(h: Host, *args: str) -> subprocess.CompletedProcess:
    """`hostd` in a process of its own, as an operator runs it beside the daemon."""
    return subprocess.run([sys.executable, "-m", "hostd.cli", "--config", str(h.tmp / "hostd.toml"), *args],
                          cwd=REPO, env={**os.environ, "COLUMNS": "1000"}, capture_output=True, text=True,
                          timeout=120, check=False)


def error_line(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("error ")
    return line.removeprefix("error ")


def carved_digest(h: Host) -> str:
    return json.loads((h.state / STATE_NAME).read_text())["digest"]


def test_carve_refuses_to_strand_a_running_vm_as_the_rpc_does(host: Host) -> None:
    before = snapshot(host.root)
    rpc = refused(lambda: carve(host.stub(), SHRINK))
    assert rpc.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert rpc.details().startswith(f"hyb.carve.vms_would_not_fit [vm_conflicts]: rc-1 ({host.vm.vm_id}, running)")
    assert error_line(cli(host, "carve", "--policy", str(host.tmp / "shrink.toml"))) == rpc.details()
    assert snapshot(host.root) == before and carved_digest(host) == digest(UPGRADE)
    # the dry run says the same, and what holds the VM is carved beside it
    r = cli(host, "carve", "--policy", str(host.tmp / "shrink.toml"), "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    assert [c.split(":")[0] for c in json.loads(r.stdout)["vm_conflicts"]] == [f"rc-1 ({host.vm.vm_id}, running)"]
    r = cli(host, "carve", "--policy", str(host.tmp / "upgrade.toml"))
    assert r.returncode == 0 and "nothing to change" in r.stdout, r.stderr
    assert snapshot(host.root) == before


def test_the_command_line_compares_and_records_as_the_rpc_does(host: Host) -> None:
    """`--expect` is the RPC's compare-and-set, refused in the same words; the carve it
    makes is recorded as the command line's, and the RPC's next carve must expect it."""
    before = snapshot(host.root)
    r = cli(host, "carve", "--policy", str(host.tmp / "configured.toml"), "--expect", "")
    line = error_line(r)
    assert line.startswith(f"hyb.carve.conflict [expected_digest]: the host is carved with {digest(UPGRADE)} "
                           "by fleet-rollout (operation test/carve)"), line
    assert snapshot(host.root) == before
    r = cli(host, "carve", "--policy", str(host.tmp / "upgrade.toml"), "--expect", digest(UPGRADE),
            "--operation", "ticket-4711")
    assert r.returncode == 0, r.stderr
    info = host.stub().GetHostInfo(pb.GetHostInfoRequest(), timeout=10)
    assert info.carve_operation == "ticket-4711" and info.carved_by.startswith("hostd-cli:")
    rpc = refused(lambda: carve(host.stub(), UPGRADE, expected="", operation="rollout/x/h/carve"))
    assert "(operation ticket-4711)" in rpc.details()


def test_uncarve_refuses_under_running_and_undrained_vms_as_the_rpc_does(host: Host) -> None:
    before = snapshot(host.root)
    for drained in (False, True):
        rpc = refused(lambda: uncarve(host.stub(), drained=drained))
        assert rpc.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert rpc.details() == (f"hyb.carve.vms_running [vms]: VMs are running: rc-1 ({host.vm.vm_id}, running); "
                                 "drain the host first")
        assert error_line(cli(host, "uncarve", *(["--drained"] if drained else []))) == rpc.details()
    assert error_line(cli(host, "uncarve", "--dry-run")) == rpc.details()
    host.stub().StopVM(pb.StopVMRequest(vm_id=host.vm.vm_id), timeout=10)
    rpc = refused(lambda: uncarve(host.stub(), drained=False))
    assert rpc.details().startswith("hyb.carve.not_drained [drained]: ")
    assert error_line(cli(host, "uncarve")) == rpc.details()
    assert snapshot(host.root) == before and carved_digest(host) == digest(UPGRADE)
    # drained, the command line uncarves the daemon's host; the daemon sees it
    r = cli(host, "uncarve", "--drained")
    assert r.returncode == 0 and "undid:" in r.stdout, r.stderr
    assert not (host.state / STATE_NAME).exists()
    assert host.stub().GetHostInfo(pb.GetHostInfoRequest(), timeout=10).carved_policy_digest == ""


def test_the_command_line_waits_for_the_daemons_carve_and_refuses_past_its_wait(host: Host) -> None:
    """The daemon's Carve holds the carve lock while it waits for the VM manager's lock
    (held here): the command line's carve waits for it, then refuses naming the holder."""
    assert host.d is not None
    release = threading.Event()
    held = threading.Event()

    def hold_manager() -> None:
        with host.d.manager.held():
            held.set()
            release.wait(60)
    threading.Thread(target=hold_manager).start()
    held.wait(10)
    rpc_done: list[object] = []
    rpc = threading.Thread(target=lambda: rpc_done.append(carve(host.stub(), UPGRADE)))
    rpc.start()
    try:
        deadline = time.monotonic() + 10
        while not HostLock(host.state).holder() and time.monotonic() < deadline:
            time.sleep(0.05)
        before = snapshot(host.root)
        t0 = time.monotonic()
        line = error_line(cli(host, "carve", "--policy", str(host.tmp / "configured.toml"), "--wait", "1"))
        assert time.monotonic() - t0 >= 1
        assert line.startswith("hyb.carve.busy [carve.lock]: carve: the host's carve lock ")
        assert f"(pid {os.getpid()}: carve)" in line  # the daemon is this process
        assert snapshot(host.root) == before and not rpc_done
    finally:
        release.set()
        rpc.join(30)
    assert rpc_done and not rpc_done[0].changed  # type: ignore[attr-defined]


def test_the_command_line_waits_for_the_lock_and_the_daemons_vm_changes_wait_for_it(host: Host) -> None:
    """An operator's carve (the lock held as `hostd carve` holds it) holds the daemon's VM
    changes; the command line run meanwhile waits its turn and carves once it is free."""
    lock = HostLock(host.state)
    created: list[pb.VM] = []
    cli_run: list[subprocess.CompletedProcess] = []
    with lock.exclusive("hostd carve (another operator)", wait_s=1):
        t = threading.Thread(target=lambda: created.append(create_vm(host.stub("scheduler"), "rc-2")))
        t.start()
        c = threading.Thread(target=lambda: cli_run.append(
            cli(host, "-v", "carve", "--policy", str(host.tmp / "upgrade.toml"), "--wait", "60")))
        c.start()
        time.sleep(3)
        assert not created  # CreateVM waits for the carve
        released = time.monotonic()
    t.join(30)
    c.join(60)
    assert created and created[0].state == pb.VM_STATE_RUNNING
    assert cli_run and cli_run[0].returncode == 0, cli_run[0].stderr if cli_run else ""
    assert "waiting for the carve lock what='carve' holder='pid " in cli_run[0].stderr  # so did the command line
    assert "another operator" in cli_run[0].stderr and time.monotonic() > released
    assert lock.holder() == ""
