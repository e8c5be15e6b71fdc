"""What systemd's files say on a host, read under a ``HostFs``: whether systemd runs as
PID 1 (``sd_booted()``'s test), a unit's full name, the drop-ins of a unit in the order
systemd applies them, and a unit file's exact content. Nothing here runs ``systemctl``
(a tree has no systemd to ask) or writes: ``hostd/apply/systemd_dropins.py`` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hostd.discover.fs import HostFs

# systemd's unit directories, highest priority first (systemd.unit(5)); a drop-in name
# in one of them hides the same name further down.
UNIT_DIRS = ("etc/systemd/system.control", "run/systemd/system.control", "run/systemd/transient",
             "run/systemd/generator.early", "etc/systemd/system", "etc/systemd/system.attached",
             "run/systemd/system", "run/systemd/system.attached", "run/systemd/generator",
             "usr/local/lib/systemd/system", "usr/lib/systemd/system", "lib/systemd/system",
             "run/systemd/generator.late")
# unit type -> the section of its own settings
UNIT_SECTIONS = {"service": "Service", "scope": "Scope", "slice": "Slice", "socket": "Socket",
                 "mount": "Mount", "swap": "Swap"}


def systemd_booted(fs: HostFs) -> bool:
    """``sd_booted()``'s own test: systemd runs as PID 1 on the host under ``fs``."""
    return fs.is_dir("run/systemd/system")


def unit_name(name: str) -> str:
    """A unit's full name: systemctl takes ``osd`` for ``osd.service``."""
    return name if name.rsplit(".", 1)[-1] in UNIT_SECTIONS else f"{name}.service"


@dataclass(frozen=True)
class UnitDropIn:
    """One drop-in that applies to a unit: its file name (what orders it), where it is,
    and the settings it names (``AllowedCPUs``, ...)."""

    name: str
    path: Path
    keys: frozenset[str]


def unit_dropins(fs: HostFs, unit: str) -> tuple[UnitDropIn, ...]:
    """The drop-ins systemd applies to ``unit``, in its order: by file name, whichever
    directory each is in; of two files with one name, the higher directory's."""
    found: dict[str, Path] = {}
    for d in UNIT_DIRS:
        for n in fs.listdir(f"{d}/{unit}.d"):
            if n.endswith(".conf"):
                found.setdefault(n, fs.path(f"{d}/{unit}.d/{n}"))
    return tuple(UnitDropIn(n, found[n], _keys(fs.lines(found[n], optional=True))) for n in sorted(found))


def _keys(lines: list[str]) -> frozenset[str]:
    keys = set()
    for line in lines:
        line = line.strip()
        if line and line[0] not in "#;[" and "=" in line:
            keys.add(line.split("=", 1)[0].strip())
    return frozenset(keys)


def read_unit_file(fs: HostFs, rel: str | Path) -> str | None:
    """A unit file's content exactly (bytes that are not UTF-8 decoded with
    ``surrogateescape``, so they encode back unchanged); None when there is no file."""
    try:
        return fs.path(rel).read_bytes().decode("utf-8", "surrogateescape")
    except FileNotFoundError:
        return None
