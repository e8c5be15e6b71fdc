"""The exclusive carve's systemd drop-ins (AllowedCPUs= for system.slice and user.slice,
so what systemd starts later starts off io_cpus) on generated cgroup v2 host trees, with
and without ``/run/systemd/system`` (sd_booted()'s test): the files' exact content,
uncarve removing new files (and the directories made for them) and putting a file that
was there back byte for byte, a second carve planning nothing, the IO service's own unit
keeping its CPUs. This machine has no systemd as PID 1 (and cgroup v1), so the live
path, ``systemctl daemon-reload`` on root ``/``, cannot run here: it is exercised with a
stand-in ``systemctl`` that records its calls and plays systemd leaving a running
slice's cpuset as it was (systemd#43846)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from api.layout import IoServiceTarget, Layout, NodeLayout
from hostd.apply.cgroups import CpusetFs, find_cpuset_fs
from hostd.apply.exclusive import plan_exclusive
from hostd.apply.layout_steps import HostHandles, Journal, apply_layout, plan_steps, uncarve
from hostd.apply.steps import Context
from hostd.apply.systemd_dropins import DROPIN_NAME, DropIn, SystemdDropIns
from hostd.apply.unmovable import Unmovable
from hostd.discover.fs import HostFs

ETC = "etc/systemd/system"
HEAD = "# hostd exclusive carve (io_cpus 0-1); `hostd uncarve` takes it back\n"


class NoMounts:
    def mount_hugetlbfs(self, path: Path, pagesize_kb: int) -> None:
        raise AssertionError("no hugetlbfs in these layouts")

    def umount(self, path: Path) -> None:
        raise AssertionError("no hugetlbfs in these layouts")

    def is_mounted(self, path: Path) -> bool:
        return False


def write(root: Path, rel: str, text: str | bytes) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(text if isinstance(text, bytes) else text.encode())


def layout(io: IoServiceTarget) -> Layout:
    return Layout(nodes=(NodeLayout(0, io_cpus=(0, 1), host_cpus=(2,), vm_cpus=(3,), hugepages=()),), pfs=(),
                  disks=(), io_service=io, vm_cgroup="machine", reboot_required=())


PROCESS = IoServiceTarget("process", "ossd")
UNIT = IoServiceTarget("unit", "ossd.service")


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """A cgroup v2 host with 4 CPUs, no tasks to move, booted with systemd."""
    r = tmp_path / "host"
    write(r, "proc/mounts", "cgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n")
    write(r, "proc/meminfo", "Hugepagesize:       2048 kB\n")
    write(r, "proc/77/comm", "ossd\n")
    write(r, "proc/77/cmdline", b"ossd\0--id\0")
    write(r, "proc/77/cgroup", "0::/hyb-io\n")
    write(r, "sys/devices/system/cpu/online", "0-3\n")
    cg = "sys/fs/cgroup"
    write(r, f"{cg}/cgroup.controllers", "cpuset cpu io memory pids\n")
    write(r, f"{cg}/cgroup.subtree_control", "cpuset cpu\n")
    write(r, f"{cg}/cpuset.mems", "0\n")
    for d in ("hyb-io", "system.slice/ossd.service"):
        write(r, f"{cg}/{d}/cpuset.cpus", "0-1\n")
        write(r, f"{cg}/{d}/cpuset.mems", "0\n")
        write(r, f"{cg}/{d}/cpuset.cpus.partition", "root\n")
    write(r, f"{cg}/machine/cpuset.cpus", "3\n")
    write(r, f"{cg}/machine/cpuset.mems", "0\n")
    (r / "run/systemd/system").mkdir(parents=True)
    return r


def handles(root: Path) -> HostHandles:
    return HostHandles(root=root, cpuset=find_cpuset_fs(root), vf_rates=None, hugetlbfs_base=root / "dev",
                       exclusive=True)


def snapshot(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def dropins(steps: list) -> list[SystemdDropIns]:
    return [s for s in steps if isinstance(s, SystemdDropIns)]


def test_system_and_user_slice_get_every_cpu_but_io_cpus_and_uncarve_removes_them(host: Path, tmp_path: Path) -> None:
    before = snapshot(host)
    h = handles(host)
    (step,) = dropins(plan_steps(layout(PROCESS), h))
    assert step.reload == [] and step.slice_cpus == {}, "a tree root runs nothing"
    assert step.describe() == (f"write {host}/{ETC}/system.slice.d/{DROPIN_NAME}: AllowedCPUs=2-3 (new file); "
                               f"write {host}/{ETC}/user.slice.d/{DROPIN_NAME}: AllowedCPUs=2-3 (new file)")
    journal = Journal(tmp_path / "state/carve-journal.json")
    ctx = Context(None, NoMounts())
    apply_layout(layout(PROCESS), h, journal, ctx)
    for sl in ("system.slice", "user.slice"):
        assert (host / ETC / f"{sl}.d" / DROPIN_NAME).read_text() == HEAD + "[Slice]\nAllowedCPUs=2-3\n"
        assert stat.S_IMODE((host / ETC / f"{sl}.d" / DROPIN_NAME).stat().st_mode) == 0o644
    assert not (host / ETC / "init.scope.d").exists() and not (host / ETC / "machine.slice.d").exists()
    assert dropins(plan_steps(layout(PROCESS), h)) == [], "a second carve plans nothing"
    assert apply_layout(layout(PROCESS), h, journal, ctx) == []
    uncarve(journal, ctx)
    assert snapshot(host) == before  # the files, and etc/ the carve made for them, are gone


def test_a_file_that_was_there_is_put_back_byte_for_byte(host: Path, tmp_path: Path) -> None:
    mine = b"# the admin's\n[Slice]\nAllowedCPUs=3\n\xff not utf-8\n"
    write(host, f"{ETC}/system.slice.d/{DROPIN_NAME}", mine)
    os.chmod(host / ETC / "system.slice.d" / DROPIN_NAME, 0o600)
    write(host, f"{ETC}/system.slice.d/10-other.conf", "[Slice]\nMemoryHigh=8G\n")
    before = snapshot(host)
    h = handles(host)
    (step,) = dropins(plan_steps(layout(PROCESS), h))
    assert "AllowedCPUs=2-3 (replaces the file there; uncarve puts it back)" in step.describe()
    journal = Journal(tmp_path / "state/carve-journal.json")
    ctx = Context(None, NoMounts())
    apply_layout(layout(PROCESS), h, journal, ctx)
    assert (host / ETC / "system.slice.d" / DROPIN_NAME).read_text() == HEAD + "[Slice]\nAllowedCPUs=2-3\n"
    json.loads(journal.path.read_text())  # the old bytes went through the JSON journal
    uncarve(journal, ctx)
    assert snapshot(host) == before
    assert stat.S_IMODE((host / ETC / "system.slice.d" / DROPIN_NAME).stat().st_mode) == 0o600


def test_no_dropins_without_systemd_or_on_cgroup_v1(host: Path) -> None:
    """cgroup v1: systemd's AllowedCPUs= needs the unified hierarchy; the hyb-host
    cpuset keeps new tasks off there."""
    v1 = CpusetFs(host / "sys/fs/cgroup", 1)
    steps, _ = plan_exclusive(layout(PROCESS), HostFs(host), v1, exclude_pids=frozenset(), io_cgroup="hyb-io")
    assert steps and dropins(steps) == []
    (host / "run/systemd/system").rmdir()
    assert dropins(plan_steps(layout(PROCESS), handles(host))) == []
    assert not (host / "etc").exists()


def test_the_io_service_unit_keeps_its_cpus(host: Path, tmp_path: Path) -> None:
    """io_service.unit runs in system.slice: AllowedCPUs= there would cut the unit to the
    slice's CPUs, so system.slice is skipped (and reported) and the unit gets a drop-in
    of its own that says io_cpus, so a reload keeps what the carve wrote."""
    write(host, "proc/77/cgroup", "0::/system.slice/ossd.service\n")
    before = snapshot(host)
    h = handles(host)
    unmovable: list[Unmovable] = []
    (step,) = dropins(plan_steps(layout(UNIT), h, unmovable))
    assert [f.path for f in step.files] == [f"{host}/{ETC}/ossd.service.d/{DROPIN_NAME}",
                                            f"{host}/{ETC}/user.slice.d/{DROPIN_NAME}"]
    assert [f.after for f in step.files] == [HEAD + "[Service]\nAllowedCPUs=0-1\nAllowedMemoryNodes=0\n",
                                             HEAD + "[Slice]\nAllowedCPUs=2-3\n"]
    assert step.describe().startswith(f"write {host}/{ETC}/ossd.service.d/{DROPIN_NAME}: "
                                      "AllowedCPUs=0-1 AllowedMemoryNodes=0 (new file); ")
    assert [u.what for u in unmovable] == ["system.slice"]
    assert "holds the IO service (system.slice/ossd.service)" in unmovable[0].why
    journal = Journal(tmp_path / "state/carve-journal.json")
    ctx = Context(None, NoMounts())
    apply_layout(layout(UNIT), h, journal, ctx)
    assert dropins(plan_steps(layout(UNIT), h)) == []
    uncarve(journal, ctx)
    assert snapshot(host) == before


def test_a_later_allowed_cpus_dropin_is_reported(host: Path) -> None:
    # set-property's file outranks /etc by directory, but sorts before ours: ours wins
    write(host, "run/systemd/system.control/user.slice.d/50-AllowedCPUs.conf", "[Slice]\nAllowedCPUs=0-3\n")
    write(host, "usr/lib/systemd/system/user.slice.d/90-vendor.conf", "[Slice]\nAllowedCPUs=0-3\n")
    write(host, f"{ETC}/system.slice.d/99-notes.conf", "[Slice]\nCPUWeight=50\n")
    fs = find_cpuset_fs(host)
    _, unmovable = plan_exclusive(layout(PROCESS), HostFs(host), fs, exclude_pids=frozenset(), io_cgroup="hyb-io")
    vendor = host / "usr/lib/systemd/system/user.slice.d/90-vendor.conf"
    assert [str(u) for u in unmovable] == [f"user.slice: {vendor} sets AllowedCPUs= after {DROPIN_NAME}, so it decides"]


def test_live_step_reloads_after_the_files_and_settles_the_slice_cpuset(tmp_path: Path) -> None:
    """The live path with a stand-in systemctl: it sees the files already written (carve)
    and already restored (uncarve); the slice's cpuset.cpus it leaves alone is written."""
    log = tmp_path / "calls"
    conf = tmp_path / "etc/systemd/system/system.slice.d" / DROPIN_NAME
    fake = tmp_path / "systemctl"
    fake.write_text(f"#!/bin/sh\necho \"$@ $(cat {conf} 2>/dev/null | tail -n1)\" >> {log}\n")
    fake.chmod(0o755)
    cpus = tmp_path / "cg/system.slice/cpuset.cpus"
    write(tmp_path, "cg/system.slice/cpuset.cpus", "\n")
    step = SystemdDropIns([DropIn(str(conf), None, "[Slice]\nAllowedCPUs=2-3\n",
                                  [str(tmp_path / "etc"), str(tmp_path / "etc/systemd"),
                                   str(tmp_path / "etc/systemd/system"), str(conf.parent)])],
                          [str(fake), "daemon-reload"], {str(cpus): ["", "2-3"]})
    ctx = Context(None, NoMounts())
    step.apply(ctx)
    assert cpus.read_text() == "2-3"
    step.undo(ctx)
    assert log.read_text() == "daemon-reload AllowedCPUs=2-3\ndaemon-reload \n"
    assert cpus.read_text() == "\n" and not (tmp_path / "etc").exists()
    assert step.describe().endswith(f"; then {fake} daemon-reload")
