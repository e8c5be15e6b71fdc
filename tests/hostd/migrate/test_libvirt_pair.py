"""Live migration with libvirt alone, between two libvirtd "hosts" on this machine
(tools/dev/libvirt_pair.py: each in its own mount, network and UTS namespace, linked by a
veth pair): the baseline hostd's own migration builds on and is compared with.

The smoke guest with its ticker (``hyb.tick=1``: ``HYB-TICK <boot id> <n>`` every ~100 ms)
runs on A with 2 MiB hugepages, a pinned vCPU and a throttled raw loop-device disk; ``virsh
migrate --live --p2p --copy-storage-all ... --tls`` moves it to B with a target XML that
changes the disk to B's loop device, the pinning and the throttles. Afterwards B runs it,
its ticker went on (same boot id, no reset), the throttles and pinning are B's, the disk
came along, and A has no domain and no QEMU left. Job time and downtime (libvirt's own
figures) are recorded as test properties and printed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from tools.dev.libvirt_pair import (Host, LibvirtPair, guest_xml, host_serial, job_ms, job_stats, migrate_argv,
                                    retarget_xml)

pytestmark = [pytest.mark.integration, pytest.mark.root, pytest.mark.slow]

NAME = "hyb-mig-guest"
MEMORY_MIB = 128
MARK_OFFSET = 2**20
A_TUNE = {"total_bytes_sec": 50 * 2**20, "total_iops_sec": 1000}
B_TUNE = {"total_bytes_sec": 20 * 2**20, "total_iops_sec": 500}
TICK = re.compile(r"^HYB-TICK (\S+) (\d+)\r?$", re.MULTILINE)
BOOT_S = 400  # a TCG boot to the first tick on a loaded 2-CPU machine


def ticks(h: Host) -> list[tuple[str, int]]:
    """(boot id, n) of each whole tick line in the host's serial log (the last line may
    still be being written)."""
    p = host_serial(h, NAME)
    text = p.read_text(errors="replace") if p.exists() else ""
    return [(m[1], int(m[2])) for m in TICK.finditer(text[:text.rfind("\n") + 1])]


def wait_ticks(h: Host, *, after: int, timeout: float) -> list[tuple[str, int]]:
    """The host's ticks once one numbered past ``after`` has been printed."""
    deadline = time.monotonic() + timeout
    while True:
        t = ticks(h)
        if t and t[-1][1] > after:
            return t
        if time.monotonic() > deadline:
            p = host_serial(h, NAME)
            tail = p.read_text(errors="replace")[-2000:] if p.exists() else "(no serial log)"
            pytest.fail(f"{h.name}: no tick past {after} within {timeout} s; serial tail:\n{tail}")
        time.sleep(0.3)


def affinity(pid: int) -> set[int]:
    return os.sched_getaffinity(pid)


def qmp(h: Host, cmd: str) -> object:
    return json.loads(h.virsh("qemu-monitor-command", NAME, json.dumps({"execute": cmd})).stdout)["return"]


@pytest.fixture
def second_loop(loop_disk: Path, tmp_path: Path):
    """B's disk: a loop device the size of A's."""
    img = tmp_path / "disk-b.img"
    with open(img, "wb") as f:
        f.truncate(int(subprocess.run(["blockdev", "--getsize64", str(loop_disk)], check=True,
                                      capture_output=True, text=True).stdout))
    dev = subprocess.run(["losetup", "--find", "--show", str(img)], check=True, capture_output=True,
                         text=True).stdout.strip()
    try:
        yield Path(dev)
    finally:
        subprocess.run(["losetup", "-d", dev], check=False)


@pytest.mark.timeout(1200)
@pytest.mark.skipif(os.environ.get("HYB_MIGRATION_PAIR_LIVE") != "1",
                    reason="libvirt-alone baseline, opt-in (HYB_MIGRATION_PAIR_LIVE=1): in 1 of 3 full runs "
                           "the guest was shut off on B after virsh reported success (docs/roadmap.md); "
                           "tests/hostd/migrate/test_hostd_migrate.py moves the same guest through hostd")
def test_live_migration_moves_running_guest_with_disk_pinning_and_throttles(
        smoke_guest: dict, hugepages_2m, loop_disk: Path, second_loop: Path, tmp_path: Path,
        record_property) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs: the target pins elsewhere than the source")
    # Both ends hold the guest's memory while it is copied.
    pages = 2 * MEMORY_MIB // 2 + 8
    hugepages_2m(pages)
    marker = f"HYB-MARK {os.urandom(8).hex()}".encode()
    with open(loop_disk, "r+b") as f:
        f.seek(MARK_OFFSET)
        f.write(marker)
        os.fsync(f.fileno())

    with LibvirtPair(tmp_path / "pair", tls=True) as pair:
        a, b = pair.a, pair.b
        # Each host sees only its own domains; the machine sees none of theirs.
        for h in pair.hosts:
            assert h.virsh("list", "--all", "--name").stdout.strip() == "", h.name
        mounts = Path("/proc/self/mounts").read_text()
        assert str(tmp_path / "pair") not in mounts, "a host's bind mount leaked into the machine's namespace"

        xml = tmp_path / "a.xml"
        xml.write_text(guest_xml(name=NAME, kernel=smoke_guest["kernel"], initrd=smoke_guest["initrd"],
                                 disk=loop_disk, memory_mib=MEMORY_MIB, vcpu_pin="0", emulator_pin="0",
                                 iotune=A_TUNE))
        a.virsh("define", str(xml))
        a.virsh("start", NAME)
        before = wait_ticks(a, after=5, timeout=BOOT_S)
        boot_id = before[-1][0]
        assert b.virsh("list", "--all", "--name").stdout.strip() == ""
        system = subprocess.run(["virsh", "-c", "qemu:///system", "list", "--all", "--name"], capture_output=True,
                                text=True, timeout=60)
        if system.returncode == 0:  # the machine's libvirtd, when it runs, does not see ours
            assert NAME not in system.stdout.split()
        [qemu_a] = a.qemu_pids()
        assert affinity(qemu_a) == {0}

        target = tmp_path / "b.xml"
        target.write_text(retarget_xml(a.virsh("dumpxml", "--migratable", NAME).stdout, disk=second_loop,
                                       vcpu_pin="1", emulator_pin="1", iotune=B_TUNE))
        t0 = time.monotonic()
        r = a.virsh(*migrate_argv(NAME, target, b, bandwidth_mib=64, tls=True), check=False, timeout=900)
        wall = time.monotonic() - t0
        assert r.returncode == 0, (r.stderr, a.libvirtd_log()[-3000:], b.libvirtd_log()[-3000:])
        last_a = ticks(a)[-1][1]

        # B runs it and libvirt recorded the job there (the source's record went with
        # its domain: --undefinesource).
        assert b.virsh("domstate", NAME).stdout.strip() == "running"
        stats = job_stats(b.virsh("domjobinfo", "--completed", NAME).stdout)
        job, downtime = job_ms(stats, "Time elapsed"), job_ms(stats, "Total downtime")
        record_property("migration_wall_s", round(wall, 3))
        record_property("migration_job_ms", job)
        record_property("migration_downtime_ms", downtime)
        print(f"migration A->B: wall {wall:.2f} s, job {job:.0f} ms, downtime {downtime:.0f} ms")
        assert 0 < downtime < 10_000, stats  # loose: TCG on a loaded machine

        # The guest went on: same boot, no reset, its counter continued from where A left it.
        after = wait_ticks(b, after=last_a + 10, timeout=120)
        assert {boot for boot, _ in after} == {boot_id}
        assert 0 < after[0][1] - last_a <= 3, (before[-3:], after[:3])
        ns = [n for _, n in after]
        assert ns == list(range(ns[0], ns[0] + len(ns))), "ticks skipped or repeated on B"
        assert "HYB-SMOKE-OK" not in host_serial(b, NAME).read_text(errors="replace")

        # B's throttles on B's disk, B's pinning on every QEMU thread that matters.
        [blk] = [d for d in qmp(b, "query-block") if d["inserted"]["file"] == str(second_loop)]
        assert (blk["inserted"]["bps"], blk["inserted"]["iops"]) == (B_TUNE["total_bytes_sec"],
                                                                      B_TUNE["total_iops_sec"])
        [qemu_b] = b.qemu_pids()
        [vcpu] = qmp(b, "query-cpus-fast")
        assert affinity(vcpu["thread-id"]) == {1}
        assert affinity(qemu_b) == {1}
        assert "1" in b.virsh("vcpupin", NAME).stdout.split()

        # A let go of it.
        assert a.virsh("list", "--all", "--name").stdout.strip() == ""
        deadline = time.monotonic() + 60
        while a.qemu_pids() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert a.qemu_pids() == [] and not Path(f"/proc/{qemu_a}").exists()

    # The disk came along (read after the guest is gone: nothing writes it any more).
    with open(second_loop, "rb") as f:
        f.seek(MARK_OFFSET)
        assert f.read(len(marker)) == marker
