"""Live migration through hostd on both ends: two `hostd serve` processes, each on one
of the two libvirtd "hosts" of tools/dev/libvirt_pair.py (own namespaces, veth link,
TLS for the migration streams), each with its own state dir, carve policy and loop
device as its allow-listed raw disk.

The smoke guest with its ticker (``hyb.tick=1``) is created on A through hostd (2 MiB
hugepages, a pinned vCPU, a throttled raw disk holding a marker); then the refusals
(B has no disk of the asked size; A migrating to an unreachable target, and to a target
that was not prepared) each leave A's VM running and both ledgers as they were; then
PrepareMigration on B, MigrateVM on A, CompleteMigration on B. Shown: the ticker went
on with the same boot id, the marker is on B's disk, B's pinning (B's carve puts VMs
on CPU 0, A's on CPU 1) and throttles, A's claim, pages, disk and domain are free, and
the downtime libvirt reports is in MigrateVM's answer. Then back from B to A, the guest's
disk serial kept over both moves, and a marker written on B's disk is on A's.
"""

from __future__ import annotations

import os
import signal
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import grpc
import httpx
import libvirt
import pytest
from tools.dev.hostd_pair import (BOOT_S, GUEST_PAGES, IMAGE, MARK_OFFSET, MEMORY_MIB, POOL_PAGES, HostdSide, claimed,
                                  disk_free, migrate, parse_ticks, prepare_request, read_marker, size_of,
                                  write_marker)
from tools.dev.libvirt_pair import LibvirtPair, job_ms, job_stats
from tools.dev.procs import free_port

from api import hostd_pb2 as pb

pytestmark = [pytest.mark.integration, pytest.mark.root, pytest.mark.slow]

NAME = "hyb-test-mig"
A_TUNE = pb.IoTune(total_bytes_sec=50 * 2**20, total_iops_sec=1000)
B_TUNE = pb.IoTune(total_bytes_sec=20 * 2**20, total_iops_sec=500)
CUT_TIMEOUT_S = 20  # the move whose link is cut: hostd cancels it after this


def scrape(listen: str) -> dict[str, float]:
    """hostd's /metrics as {"name{labels}": value} (labels as the exposition prints them)."""
    text = httpx.get(f"http://{listen}/metrics", timeout=10).text
    return {k: float(v) for line in text.splitlines() if line and not line.startswith("#")
            for k, v in [line.rsplit(" ", 1)]}


@pytest.mark.timeout(1500)
def test_hostd_migrates_a_running_vm_live_and_refuses_cleanly(
        smoke_guest: dict, hugetlbfs_2m: Path, hugepages_2m, loop_disk: Path, second_loop: Path,
        tmp_path: Path, record_property) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs: each host's carve gives VMs a different one")
    hugepages_2m(2 * GUEST_PAGES + 8)  # both ends hold the guest's memory during the copy
    marker = write_marker(loop_disk, "HYB-MARK")

    metrics_a, metrics_b = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    with LibvirtPair(tmp_path / "pair", subnet="10.78.0", tls=True) as pair:
        a = HostdSide(tmp_path / "a", pair.a, loop_disk, io_cpu=0, smoke_guest=smoke_guest, pool_pages=POOL_PAGES,
                      name=NAME, metrics_listen=metrics_a)
        b = HostdSide(tmp_path / "b", pair.b, second_loop, io_cpu=1, smoke_guest=smoke_guest,
                      pool_pages=POOL_PAGES, name=NAME, migration_address=pair.b.addr, metrics_listen=metrics_b)
        try:
            a.start()
            b.start()
            vm = a.stub.CreateVM(pb.CreateVMRequest(
                request_id="req-mig-1", name=NAME, vcpus=1, memory_mib=MEMORY_MIB, hugepage_size_kb=2048,
                image=IMAGE, labels={"tenant": "t1"},
                disks=[pb.DiskRequest(disk=loop_disk.name, iotune=A_TUNE)]), timeout=180)
            assert vm.state == pb.VM_STATE_RUNNING and list(vm.vcpu_pins) == [1]
            before = a.wait_ticks(after=5, timeout=BOOT_S)
            boot_id = before[-1][0]
            a_inv, b_inv = claimed(a.inventory()), claimed(b.inventory())
            assert a_inv[0] == [1] and a_inv[1] == GUEST_PAGES and b_inv[0] == [] and b_inv[1] == 0
            prep = pb.PrepareMigrationRequest(
                request_id="mig-1", vm_id=vm.vm_id, source_host="a",
                vm=pb.CreateVMRequest(request_id=vm.request_id, name=NAME, vcpus=1, memory_mib=MEMORY_MIB,
                                      hugepage_size_kb=2048, image=IMAGE, labels=dict(vm.labels),
                                      disks=[pb.DiskRequest(disk=loop_disk.name, iotune=B_TUNE)]),
                source_disks=[pb.SourceDisk(disk=loop_disk.name, size_bytes=size_of(loop_disk))])

            # -- B has no disk of the asked size: refused, nothing changed on B.
            too_big = pb.PrepareMigrationRequest()
            too_big.CopyFrom(prep)
            too_big.source_disks[0].size_bytes = 2 * size_of(loop_disk)
            with pytest.raises(grpc.RpcError) as e:
                b.stub.PrepareMigration(too_big, timeout=60)
            assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert e.value.details().startswith("hyb.migration.no_disk [disks[0].disk]: "), e.value.details()
            assert second_loop.name in e.value.details()
            assert b.vms() == [] and claimed(b.inventory()) == b_inv and b.domains() == []
            assert disk_free(second_loop)

            # -- MigrateVM to an unreachable target, then to one never prepared (its
            # libvirtd is there, the disk the XML names is not): the VM runs on A as it was.
            a_xml = a.host.virsh("dumpxml", "--migratable", NAME).stdout
            root = ET.fromstring(a_xml)
            root.find("./devices/disk/source").set("dev", "/dev/hyb-test-no-such-disk")
            unprepared = ET.tostring(root, encoding="unicode")
            for uri, xml in (("qemu+unix:///system?socket=/run/hyb-test-no-such-host/libvirt-sock", unprepared),
                             (b.host.uri, unprepared)):
                with pytest.raises(grpc.RpcError) as e:
                    a.stub.MigrateVM(pb.MigrateVMRequest(name=NAME, target_uri=uri, domain_xml=xml,
                                                         migrate_uri=b.host.migrate_uri, tls=True,
                                                         timeout_s=120), timeout=300)
                assert e.value.code() == grpc.StatusCode.ABORTED, e.value.details()
                assert e.value.details().startswith("hyb.migration.failed"), e.value.details()
                assert a.vms() == [(NAME, pb.VM_STATE_RUNNING)] and claimed(a.inventory()) == a_inv
                assert a.domains() == [NAME] and b.domains() == [] and b.vms() == []
                assert a.host.virsh("domstate", NAME).stdout.strip() == "running"
            n = a.ticks()[-1][1]
            assert a.wait_ticks(after=n + 3, timeout=60)[-1][0] == boot_id  # still the same boot, still ticking

            # -- The move: prepare on B, migrate on A, complete on B.
            t_prep = time.monotonic()
            ready = b.stub.PrepareMigration(prep, timeout=120)
            t_prep = time.monotonic() - t_prep
            assert ready.vm.state == pb.VM_STATE_INCOMING and list(ready.vm.vcpu_pins) == [0]
            assert ready.migrate_uri == f"tcp://{pair.b.addr}"
            assert [(d.disk, d.target) for d in ready.disks] == [(second_loop.name, "vda")]
            assert not disk_free(second_loop)  # held for the incoming VM
            assert b.domains() == []  # defines nothing yet
            again = b.stub.PrepareMigration(prep, timeout=120)  # a retry answers the same
            assert again.vm.vm_id == vm.vm_id and claimed(b.inventory())[:2] == ([0], GUEST_PAGES)
            console_a = a.hold_console()
            t0 = time.monotonic()
            call = a.stub.MigrateVM.future(pb.MigrateVMRequest(
                name=NAME, target_uri=b.host.uri, migrate_uri=ready.migrate_uri, domain_xml=ready.domain_xml,
                migrate_disks=[d.target for d in ready.disks], bandwidth_mib_s=64, max_downtime_ms=500,
                timeout_s=300, on_timeout=pb.ON_TIMEOUT_ABORT, tls=True), timeout=600)
            progress = []
            while not call.done():  # GetMigration on the source while the job runs
                try:
                    p = a.stub.GetMigration(pb.MigrationRef(name=NAME), timeout=10)
                except grpc.RpcError as e:
                    # the move ended between done() and this call (a loaded machine): the
                    # VM left A, and MigrateVM's answer is on its way
                    assert e.code() == grpc.StatusCode.NOT_FOUND, e.details()
                    assert call.result(timeout=120)
                    break
                if p.active:
                    progress.append(p)
                    vms = a.vms()
                    # the source's domain is gone only once the move is over (on a loaded
                    # machine it may end between the two calls)
                    assert vms == [(NAME, pb.VM_STATE_MIGRATING)] or (vms == [] and call.result(timeout=120)), vms
                time.sleep(0.5)
            moved = call.result()
            wall = time.monotonic() - t0
            assert progress and any(p.memory_remaining_bytes or p.disk_remaining_bytes for p in progress)
            assert progress[-1].elapsed_ms > 0
            with pytest.raises(grpc.RpcError) as e:  # A has no such VM any more
                a.stub.GetMigration(pb.MigrationRef(name=NAME), timeout=10)
            assert e.value.code() == grpc.StatusCode.NOT_FOUND
            assert not a.console.exists()  # A's files of the VM went with it
            last_a = parse_ticks(console_a.read())[-1][1]
            console_a.close()
            t_done = time.monotonic()
            done = b.stub.CompleteMigration(pb.MigrationRef(name=NAME), timeout=60)
            t_done = time.monotonic() - t_done
            assert done.vm.state == pb.VM_STATE_RUNNING and done.vm.vm_id == vm.vm_id
            assert list(done.vm.vcpu_pins) == [0]

            stats = job_stats(b.host.virsh("domjobinfo", "--completed", NAME).stdout)
            record_property("migration_wall_s", round(wall, 3))
            record_property("migration_job_ms", done.job.job_ms)
            record_property("migration_downtime_ms", done.job.downtime_ms)
            # The target's record, as libvirt keeps it; the source's answer is the same when
            # libvirt's job-completed event reached it, else the last sample of the job.
            assert done.job.completed_record
            assert (done.job.job_ms, done.job.downtime_ms) == (job_ms(stats, "Time elapsed"),
                                                               job_ms(stats, "Total downtime"))
            if moved.completed_record:
                assert moved.downtime_ms == done.job.downtime_ms
            print(f"hostd migration A->B: wall {wall:.2f} s, job {done.job.job_ms} ms, downtime "
                  f"{done.job.downtime_ms} ms, data {done.job.data_bytes} bytes (source's answer: job "
                  f"{moved.job_ms} ms, downtime {moved.downtime_ms} ms, record {moved.completed_record}); "
                  f"PrepareMigration {t_prep:.2f} s, CompleteMigration {t_done:.2f} s")
            assert 0 < done.job.downtime_ms < 10_000 and done.job.job_ms > 0 and done.job.data_bytes > 0
            # what Prometheus sees: the source counted one move done and its job time and
            # downtime (libvirt's, as answered), the target one completed arrival
            got_a, got_b = scrape(metrics_a), scrape(metrics_b)
            assert got_a['hostd_migrations_total{result="done",role="source"}'] == 1.0, got_a
            assert got_a["hostd_migration_seconds_count"] == 1.0
            assert got_a["hostd_migration_seconds_sum"] == pytest.approx(moved.job_ms / 1000)
            assert got_a["hostd_migration_downtime_seconds_sum"] == pytest.approx(moved.downtime_ms / 1000)
            assert got_a["hostd_migrations_running"] == 0.0
            assert got_b['hostd_migrations_total{result="done",role="target"}'] == 1.0, got_b

            # The guest went on: same boot, its counter continued from where A left it.
            after = b.wait_ticks(after=last_a + 10, timeout=120)
            assert {boot for boot, _ in after} == {boot_id}
            assert 0 < after[0][1] - last_a <= 3, (a.ticks()[-3:], after[:3])

            # B's pinning, B's disk and throttles.
            c = libvirt.open(b.host.uri)
            try:
                dom = c.lookupByName(NAME)
                assert dom.UUIDString() == vm.vm_id
                assert list(dom.vcpuPinInfo(0)) == [(True, False)]  # vCPU 0 on host CPU 0 only
                x = ET.fromstring(dom.XMLDesc(0))
                disk = x.find("./devices/disk")
                assert disk.find("source").get("dev") == str(second_loop)
                assert disk.findtext("serial") == loop_disk.name  # the guest's name of its disk is kept
                tune = dom.blockIoTune("vda", 0)
                assert (tune["total_bytes_sec"], tune["total_iops_sec"]) == (B_TUNE.total_bytes_sec,
                                                                           B_TUNE.total_iops_sec)
                assert dom.isPersistent()
            finally:
                c.close()
            [qemu_b] = b.host.qemu_pids()
            assert os.sched_getaffinity(qemu_b) == {0}
            assert claimed(b.inventory())[:2] == ([0], GUEST_PAGES)
            assert b.vms() == [(NAME, pb.VM_STATE_RUNNING)] and disk_free(second_loop)  # hold released: QEMU has it

            # A let go of everything.
            assert a.vms() == [] and a.domains() == []
            assert claimed(a.inventory()) == ([], 0, [(loop_disk.name, "", 0, 0)])
            deadline = time.monotonic() + 60
            while a.host.qemu_pids() and time.monotonic() < deadline:
                time.sleep(0.2)
            assert a.host.qemu_pids() == [] and disk_free(loop_disk)

            # And back: B is the source now; the guest keeps the name it knows its disk by.
            on_b = b.stub.GetVM(pb.GetVMRequest(vm_id=vm.vm_id), timeout=10)
            assert [(d.disk, d.serial) for d in on_b.disks] == [(second_loop.name, loop_disk.name)]
            marker2 = write_marker(second_loop, "HYB-MARK2", 2 * MARK_OFFSET)
            console_b = b.hold_console()
            moved2, _ = migrate(b, a, vm.vm_id, iotune=A_TUNE, request_id="mig-2", bandwidth_mib_s=64, tls=True)
            back = a.stub.GetVM(pb.GetVMRequest(vm_id=vm.vm_id), timeout=10)
            assert back.state == pb.VM_STATE_RUNNING and list(back.vcpu_pins) == [1]
            assert [(d.disk, d.serial) for d in back.disks] == [(loop_disk.name, loop_disk.name)]
            print(f"hostd migration B->A: job {moved2.job_ms} ms, downtime {moved2.downtime_ms} ms")
            assert 0 < moved2.downtime_ms < 10_000
            last_b = parse_ticks(console_b.read())[-1][1]
            console_b.close()
            home = a.wait_ticks(after=last_b + 10, timeout=120)
            assert {boot for boot, _ in home} == {boot_id} and 0 < home[0][1] - last_b <= 3
            assert b.vms() == [] and b.domains() == [] and claimed(b.inventory()) == b_inv
            c = libvirt.open(a.host.uri)
            try:
                x = ET.fromstring(c.lookupByName(NAME).XMLDesc(0))
                assert x.find("./devices/disk/source").get("dev") == str(loop_disk)
                assert x.findtext("./devices/disk/serial") == loop_disk.name
            finally:
                c.close()
            assert claimed(a.inventory()) == a_inv

            # A deletes it like any VM of its own.
            a.stub.DeleteVM(pb.DeleteVMRequest(vm_id=vm.vm_id), timeout=60)
            assert a.domains() == [] and claimed(a.inventory())[:2] == ([], 0)
        finally:
            a.stop()
            b.stop()

    # The disk came along both ways (read once nothing writes it any more).
    assert read_marker(second_loop, marker) == marker
    assert read_marker(loop_disk, marker2, 2 * MARK_OFFSET) == marker2


@pytest.mark.timeout(1500)
def test_a_hostd_killed_or_the_link_cut_mid_migration_leaves_one_running_copy(
        smoke_guest: dict, hugetlbfs_2m: Path, hugepages_2m, loop_disk: Path, second_loop: Path,
        tmp_path: Path) -> None:
    """SIGKILL the target's hostd right after it prepared (its row and disk hold made), and
    the source's once libvirt moved the VM but before it released it: each restarted hostd
    reconciles its ledger with what runs on its host, and exactly one copy runs throughout.
    Then the link between the hosts is cut while a move back copies: cancelled at its
    timeout, the VM runs on where it was."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs: each host's carve gives VMs a different one")
    hugepages_2m(2 * GUEST_PAGES + 8)
    faults = {"HOSTD_TEST_FAULTS": "1"}
    with LibvirtPair(tmp_path / "pair", subnet="10.79.0", tls=True) as pair:
        # A's migration_address: the link-cut move B->A names A in its migrate URI, which is
        # how B's hostd tells the connections to close from those of A's incoming QEMU
        a = HostdSide(tmp_path / "a", pair.a, loop_disk, io_cpu=0, smoke_guest=smoke_guest, pool_pages=POOL_PAGES,
                      name=NAME, migration_address=pair.a.addr)
        b = HostdSide(tmp_path / "b", pair.b, second_loop, io_cpu=1, smoke_guest=smoke_guest,
                      pool_pages=POOL_PAGES, name=NAME, migration_address=pair.b.addr)
        try:
            a.start()
            b.start(**faults, HOSTD_CRASH_AT="prepared")
            vm = a.stub.CreateVM(pb.CreateVMRequest(
                request_id="req-mig-k", name=NAME, vcpus=1, memory_mib=MEMORY_MIB, hugepage_size_kb=2048,
                image=IMAGE, disks=[pb.DiskRequest(disk=loop_disk.name, iotune=A_TUNE)]), timeout=180)
            boot_id = a.wait_ticks(after=5, timeout=BOOT_S)[-1][0]
            a_inv = claimed(a.inventory())

            # The target dies after recording the incoming VM: restarted, it has released it.
            with pytest.raises(grpc.RpcError) as e:
                b.stub.PrepareMigration(prepare_request(vm, a, request_id="mig-1", iotune=B_TUNE), timeout=120)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
            assert b.hostd.proc is not None and b.hostd.proc.wait(10) == -signal.SIGKILL
            b.start()
            assert "released incoming vm" in b.hostd.log.read_text()
            assert b.vms() == [] and claimed(b.inventory())[:2] == ([], 0) and disk_free(second_loop)
            assert a.vms() == [(NAME, pb.VM_STATE_RUNNING)] and claimed(a.inventory()) == a_inv

            # The source dies once libvirt moved the VM, before releasing it.
            a.hostd.stop()
            a.start(**faults, HOSTD_CRASH_AT="migrated")
            seen = a.ticks()[-1][1]
            ready = b.stub.PrepareMigration(prepare_request(vm, a, request_id="mig-2", iotune=B_TUNE), timeout=120)
            with pytest.raises(grpc.RpcError) as e:
                a.stub.MigrateVM(pb.MigrateVMRequest(
                    name=NAME, target_uri=b.host.uri, migrate_uri=ready.migrate_uri, domain_xml=ready.domain_xml,
                    bandwidth_mib_s=64, timeout_s=300, tls=True), timeout=600)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
            assert a.hostd.proc is not None and a.hostd.proc.wait(10) == -signal.SIGKILL
            assert a.domains() == [] and b.host.virsh("domstate", NAME).stdout.strip() == "running"
            # Aborting on the target now would destroy the one running copy: refused.
            with pytest.raises(grpc.RpcError) as e:
                b.stub.AbortMigration(pb.MigrationRef(name=NAME), timeout=60)
            assert e.value.details().startswith("hyb.migration.arrived"), e.value.details()
            a.start()
            assert "its domain is gone" in a.hostd.log.read_text()
            assert a.vms() == [] and claimed(a.inventory()) == ([], 0, [(loop_disk.name, "", 0, 0)])
            assert b.stub.CompleteMigration(pb.MigrationRef(name=NAME), timeout=60).vm.state == pb.VM_STATE_RUNNING
            assert {boot for boot, _ in b.wait_ticks(after=seen + 5, timeout=120)} == {boot_id}

            # The link between the hosts cut mid-move (packets dropped, no reset): the job
            # cannot finish; the source's hostd cancels it at its timeout, the VM runs on
            # where it was (same boot), and the target's incoming copy is released.
            on_b = b.stub.GetVM(pb.GetVMRequest(vm_id=vm.vm_id), timeout=10)
            ready = a.stub.PrepareMigration(prepare_request(on_b, b, request_id="mig-3", iotune=A_TUNE), timeout=120)
            t0 = time.monotonic()
            call = b.stub.MigrateVM.future(pb.MigrateVMRequest(
                name=NAME, target_uri=a.host.uri, migrate_uri=ready.migrate_uri, domain_xml=ready.domain_xml,
                migrate_disks=[d.target for d in ready.disks], bandwidth_mib_s=4, timeout_s=CUT_TIMEOUT_S,
                on_timeout=pb.ON_TIMEOUT_ABORT, tls=True), timeout=300)
            moving = lambda: (p := b.stub.GetMigration(pb.MigrationRef(name=NAME), timeout=10)).active and p  # noqa: E731
            while not (p := moving()) or p.memory_remaining_bytes + p.disk_remaining_bytes == 0:
                assert not call.done() and time.monotonic() - t0 < CUT_TIMEOUT_S, "the job never started moving data"
                time.sleep(0.2)
            pair.cut()
            try:
                with pytest.raises(grpc.RpcError) as e:
                    call.result()
                waited = time.monotonic() - t0
                assert e.value.details().startswith("hyb.migration.timeout"), e.value.details()
                a.stub.AbortMigration(pb.MigrationRef(name=NAME), timeout=60)
            finally:
                pair.mend()
            print(f"link cut mid-move: cancelled after {waited:.1f} s (timeout_s {CUT_TIMEOUT_S})")
            assert waited < CUT_TIMEOUT_S + 60  # the cancel does not wait for TCP to give up
            assert b.vms() == [(NAME, pb.VM_STATE_RUNNING)] and b.domains() == [NAME]
            assert a.vms() == [] and a.domains() == [] and claimed(a.inventory())[:2] == ([], 0)
            assert disk_free(loop_disk)
            seen = b.ticks()[-1][1]
            assert {boot for boot, _ in b.wait_ticks(after=seen + 3, timeout=120)} == {boot_id}
            b.stub.DeleteVM(pb.DeleteVMRequest(vm_id=vm.vm_id), timeout=60)
            assert b.domains() == [] and claimed(b.inventory())[:2] == ([], 0)
        finally:
            a.stop()
            b.stop()
