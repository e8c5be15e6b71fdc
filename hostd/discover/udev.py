"""udev properties of block devices: pyudev on this host, the udev database
files (/run/udev/data/b<major>:<minor>) under a recorded tree.

On the live host (root "/") pyudev asks libudev, which reads the same database
(and, under ``umockdev-run``, the mocked one). Where no udev daemon ever ran
there are no ID_* properties: callers then fall back to sysfs attributes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from hostd.discover.fs import HostFs

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UdevInfo:
    properties: dict[str, str] = field(default_factory=dict)
    links: tuple[str, ...] = ()  # symlinks under /dev, without the "/dev/" prefix


class UdevSource(Protocol):
    def info(self, devnum: str, sys_path: Path) -> UdevInfo: ...


class UdevDataFiles:
    """Reads <root>/run/udev/data/b<maj>:<min>: "E:KEY=VALUE" and "S:link" lines."""

    def __init__(self, fs: HostFs) -> None:
        self.fs = fs

    def info(self, devnum: str, sys_path: Path) -> UdevInfo:
        props: dict[str, str] = {}
        links: list[str] = []
        for line in self.fs.lines(f"run/udev/data/b{devnum}", optional=True):
            kind, _, rest = line.partition(":")
            if kind == "E" and "=" in rest:
                k, _, v = rest.partition("=")
                props[k] = v
            elif kind == "S":
                links.append(rest)
        return UdevInfo(props, tuple(links))


class Pyudev:
    """libudev through pyudev, for the live host only (it always reads the real /sys)."""

    def __init__(self) -> None:
        import pyudev

        self._pyudev = pyudev
        self._ctx = pyudev.Context()

    def info(self, devnum: str, sys_path: Path) -> UdevInfo:
        try:
            dev = self._pyudev.Devices.from_sys_path(self._ctx, str(sys_path))
            props = {str(k): str(v) for k, v in dev.properties.items()}
            links = tuple(str(s).removeprefix("/dev/") for s in dev.device_links)
        except Exception as e:  # noqa: BLE001 - libudev errors vary; degrade to sysfs
            log.debug("pyudev sys_path=%s error=%s", sys_path, e)
            return UdevInfo()
        return UdevInfo(props, links)


def udev_source(fs: HostFs) -> UdevSource:
    """pyudev on the live host, the database files for a tree (or if pyudev is missing)."""
    if fs.live:
        try:
            return Pyudev()
        except Exception as e:  # noqa: BLE001 - ImportError, or libudev not loadable
            fs.warn(f"pyudev unavailable ({e}); reading /run/udev/data directly")
    return UdevDataFiles(fs)
