"""Atomic-write units (issue #41): sysfs on Linux 6.12, NVMe identify data on 6.1, statx
on this host. The two recorded trees are constructed from the kernel's sysfs layout and
nvme-cli's JSON field names (tests/data/hosts/make_trees.py says how), not captured."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from hostd.discover import discover_host
from hostd.discover.atomic import lba_bytes, pow2_floor, read_atomic, statx_atomic
from hostd.discover.fs import HostFs
from hostd.discover.model import AtomicWrite, Topology

HOSTS = Path(__file__).resolve().parents[2] / "data" / "hosts"
NEW, OLD = "1s-4c-nvme-atomic-6.12", "1s-4c-nvme-identify-6.1"


def disks(tree: Path | str) -> dict[str, AtomicWrite | None]:
    return {d.name: d.atomic for d in discover_host(Path(tree)).disks}


def test_612_sysfs_limits_with_and_without_a_unit() -> None:
    got = disks(HOSTS / NEW)
    assert got["nvme0n1"] == AtomicWrite("sysfs", 4096, 16384, 16384, 0, statx_unit_max_bytes=16384,
                                         detail="kernel queue limits")
    for name in ("nvme1n1", "sda"):
        assert got[name] == AtomicWrite("sysfs", 0, 0, 0, 0, detail="the kernel reports no atomic writes")


def test_61_identify_data_by_the_kernels_rules() -> None:
    got = disks(HOSTS / OLD)
    # NSFEAT bit 1 + NAWUPF 3 on 4 KiB blocks: the namespace's own 16 KiB
    assert (got["nvme0n1"].source, got["nvme0n1"].unit_min_bytes, got["nvme0n1"].unit_max_bytes) == \
        ("nvme-id", 4096, 16384)
    # NSFEAT bit 1 clear: NAWUPF is ignored, the controller's AWUPF 0 = one block
    assert got["nvme1n1"].unit_max_bytes == 4096
    assert "controller nvme1 AWUPF 0" in got["nvme1n1"].detail
    # 16 x 512 B = 8 KiB unit, but a 4 KiB boundary (NABSPF 7) caps what is whole
    n2 = got["nvme2n1"]
    assert (n2.unit_min_bytes, n2.unit_max_bytes, n2.boundary_bytes, n2.max_bytes) == (512, 4096, 4096, 4096)
    # an atomic boundary offset: Linux offers none, nor do we
    assert got["nvme3n1"].unit_max_bytes == 0 and "NABO 8" in got["nvme3n1"].detail
    # nothing recorded, and a SATA disk on a kernel without the files: unknown
    assert got["nvme4n1"] is None and got["sda"] is None


def test_render_shows_the_unit() -> None:
    from rich.console import Console
    from hostd.discover.render import render_topology
    console = Console(width=240, record=True)
    render_topology(discover_host(HOSTS / OLD), console)
    rows = {line.split()[1]: line for line in console.export_text().splitlines() if line.startswith("│ nvme")}
    assert " 16K " in rows["nvme0n1"] and " 4K/b4K " in rows["nvme2n1"]
    assert " 0 " in rows["nvme3n1"] and " ? " in rows["nvme4n1"]


def test_older_trees_report_unknown_not_zero() -> None:
    assert set(disks(HOSTS / "amd-epyc-nps4").values()) == {None}


def test_json_round_trip_keeps_the_units() -> None:
    topo = discover_host(HOSTS / OLD)
    back = Topology.from_json(topo.to_json())
    assert back.disks == topo.disks
    by_name = {d["name"]: d for d in json.loads(topo.to_json())["disks"]}
    assert by_name["nvme0n1"]["atomic"]["unit_max_bytes"] == 16384 and by_name["sda"]["atomic"] is None


def _copy(tmp_path: Path, tree: str) -> Path:
    dst = tmp_path / tree
    shutil.copytree(HOSTS / tree, dst, symlinks=True)
    return dst


def test_statx_disagreeing_with_sysfs_keeps_the_smaller_and_warns(tmp_path: Path) -> None:
    root = _copy(tmp_path, NEW)
    probe = json.loads((root / ".hostd-probe.json").read_text())
    probe["statx"]["nvme0n1"]["atomic_write_unit_max"] = 8192
    (root / ".hostd-probe.json").write_text(json.dumps(probe))
    topo = discover_host(root)
    a = next(d.atomic for d in topo.disks if d.name == "nvme0n1")
    assert a is not None and (a.unit_max_bytes, a.statx_unit_max_bytes) == (8192, 8192)
    assert any("statx atomic_write_unit_max 8192 differs" in w for w in topo.host.warnings)


@pytest.mark.parametrize("edit, warning", [
    ({"nawupf": "3"}, "nawupf missing or not a count"),
    ({"flbas": 7}, "no usable flbas/lbafs"),
])
def test_bad_identify_records_are_unknown_with_a_warning(tmp_path: Path, edit: dict, warning: str) -> None:
    root = _copy(tmp_path, OLD)
    f = root / ".hostd-probe/nvme/nvme0n1.id-ns.json"
    f.write_text(json.dumps(json.loads(f.read_text()) | edit))
    fs = HostFs(root)
    assert read_atomic(fs, "nvme0n1", {}) is None
    assert any(warning in w for w in fs.warnings)


def test_identify_that_is_not_json_is_a_warning(tmp_path: Path) -> None:
    root = _copy(tmp_path, OLD)
    (root / ".hostd-probe/nvme/nvme0n1.id-ns.json").write_text("{not json")
    fs = HostFs(root)
    assert read_atomic(fs, "nvme0n1", {}) is None
    assert any("not JSON" in w for w in fs.warnings)


def test_missing_controller_record_is_unknown(tmp_path: Path) -> None:
    root = _copy(tmp_path, OLD)
    (root / ".hostd-probe/nvme/nvme1.id-ctrl.json").unlink()
    assert read_atomic(HostFs(root), "nvme1n1", {}) is None


def test_lba_size_and_pow2_helpers() -> None:
    lbafs = [{"ds": 9}, {"ds": 12}] + [{"ds": 9}] * 15 + [{"ds": 13}]
    assert lba_bytes({"flbas": 1, "lbafs": lbafs}) == 4096
    assert lba_bytes({"flbas": 0x21, "lbafs": lbafs}) == 8192  # bits 6:5 extend the index past 15
    assert lba_bytes({"flbas": 0, "lbafs": [{"ds": 0}]}) is None
    assert [pow2_floor(n) for n in (0, 1, 4096, 12288, 16384)] == [0, 1, 4096, 8192, 16384]


# ---------------------------------------------------------------- this host


def _sysfs_unit(name: str) -> int:
    return int(Path(f"/sys/block/{name}/queue/atomic_write_unit_max_bytes").read_text())


LIVE = [n for n in sorted(os.listdir("/sys/block"))
        if Path(f"/sys/block/{n}/queue/atomic_write_unit_max_bytes").exists() and Path(f"/dev/{n}").exists()]


@pytest.mark.skipif(not LIVE, reason="this kernel has no atomic_write_* queue limits (before 6.11)")
@pytest.mark.parametrize("name", LIVE)
def test_live_statx_agrees_with_sysfs(name: str) -> None:
    """The statx syscall through ctypes on a real block device: when the kernel reports
    atomic writes it must give sysfs's unit; when it reports none, sysfs says 0."""
    sx = statx_atomic(f"/dev/{name}")
    if sx is None:
        assert _sysfs_unit(name) == 0
    else:
        assert sx.unit_max == _sysfs_unit(name)
    live = {d.name: d.atomic for d in discover_host(Path("/")).disks}
    if name in live:
        assert live[name] is not None and live[name].unit_max_bytes == _sysfs_unit(name)


def test_statx_on_a_path_that_is_not_there_is_none() -> None:
    assert statx_atomic("/dev/no-such-disk-hyb") is None
