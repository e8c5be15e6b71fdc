"""What systemd's files say, read from generated host trees: whether systemd is PID 1
(sd_booted()'s test), a unit's full name, a unit's drop-ins in the order systemd applies
them (by file name across the unit directories, the higher directory's file hiding a
lower one of the same name) with the settings each names, and a unit file's exact bytes."""

from __future__ import annotations

from pathlib import Path

from tools.dev.fleetsim_tree import write_tree

from hostd.discover.fs import HostFs
from hostd.discover.systemd import read_unit_file, systemd_booted, unit_dropins, unit_name


def write(root: Path, rel: str, text: str | bytes) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(text if isinstance(text, bytes) else text.encode())


def test_systemd_booted_is_the_trees_not_this_machines(tmp_path: Path) -> None:
    root = tmp_path / "sim-host"
    write_tree(root, "sim-host")  # a generated host without systemd
    assert not systemd_booted(HostFs(root))
    (root / "run/systemd/system").mkdir(parents=True)
    assert systemd_booted(HostFs(root))


def test_unit_names() -> None:
    assert unit_name("ossd") == "ossd.service"
    assert unit_name("ossd.service") == "ossd.service" and unit_name("user.slice") == "user.slice"
    assert unit_name("ceph-osd@3") == "ceph-osd@3.service"


def test_dropins_in_the_order_systemd_applies_them(tmp_path: Path) -> None:
    d = "user.slice.d"
    write(tmp_path, f"usr/lib/systemd/system/{d}/90-vendor.conf", "[Slice]\nAllowedCPUs=0-3\n")
    write(tmp_path, f"etc/systemd/system/{d}/90-vendor.conf", "# the admin's\n[Slice]\nCPUWeight=50\n")
    write(tmp_path, f"run/systemd/system.control/{d}/50-AllowedCPUs.conf", "[Slice]\nAllowedCPUs = 0-1\n")
    write(tmp_path, f"lib/systemd/system/{d}/10-mem.conf", "[Slice]\n; AllowedCPUs=7\nMemoryHigh=8G\n")
    write(tmp_path, f"etc/systemd/system/{d}/README", "not a drop-in\n")
    write(tmp_path, "etc/systemd/system/system.slice.d/50-other.conf", "[Slice]\nAllowedCPUs=2\n")
    got = unit_dropins(HostFs(tmp_path), "user.slice")
    assert [(x.name, x.path.relative_to(tmp_path).parts[0], x.keys) for x in got] == [
        ("10-mem.conf", "lib", frozenset({"MemoryHigh"})),
        ("50-AllowedCPUs.conf", "run", frozenset({"AllowedCPUs"})),
        ("90-vendor.conf", "etc", frozenset({"CPUWeight"})),  # /etc hides the vendor's file of that name
    ]
    assert unit_dropins(HostFs(tmp_path), "ossd.service") == ()


def test_a_unit_file_is_read_byte_for_byte(tmp_path: Path) -> None:
    mine = b"# the admin's\n[Slice]\nAllowedCPUs=3\n\xff not utf-8\n"
    write(tmp_path, "etc/systemd/system/system.slice.d/50-x.conf", mine)
    fs = HostFs(tmp_path)
    text = read_unit_file(fs, "etc/systemd/system/system.slice.d/50-x.conf")
    assert text is not None and text.encode("utf-8", "surrogateescape") == mine
    assert read_unit_file(fs, "etc/systemd/system/system.slice.d/missing.conf") is None
