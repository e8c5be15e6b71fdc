"""Reading a host's /sys, /proc and /dev under a root path, without ever raising.

Every reader in ``hostd.discover`` takes a ``HostFs``: ``HostFs(Path("/"))`` is
this machine, ``HostFs(Path("tests/data/hosts/2s-48c-smt-2pf-32vf"))`` a recorded
tree (like prometheus/procfs ``sysfs.NewFS(mountPoint)``). A missing or malformed
file degrades to ``None`` (or an empty list) and, unless the caller marks it
optional, adds a warning that names the file as it is on the host ("/sys/...").
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from hostd.cpulist import CpuListError, parse_cpu_list

_NUM_SUFFIX = re.compile(r"(\d+)")


def natural_key(name: str) -> list:
    """Sort "cpu2" before "cpu10", "nvme2n1" before "nvme10n1"."""
    return [int(p) if p.isdigit() else p for p in _NUM_SUFFIX.split(name)]


class HostFs:
    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).resolve()
        self.warnings: list[str] = []

    @property
    def live(self) -> bool:
        """True when reading this machine, not a recorded tree."""
        return self.root == Path("/")

    # ------------------------------------------------------------ paths

    def path(self, rel: str | Path) -> Path:
        """``rel`` ("sys/block") or an already-joined path under the root."""
        p = Path(rel)
        if p.is_absolute() and self._under_root(p):
            return p
        return self.root / str(rel).lstrip("/")

    def _under_root(self, p: Path) -> bool:
        return self.root == Path("/") or p == self.root or self.root in p.parents

    def show(self, p: Path | str) -> str:
        """The path as it is on the host: "/sys/block/sda" for <tree>/sys/block/sda."""
        p = self.path(p)
        try:
            rel = str(p.relative_to(self.root))
        except ValueError:
            return str(p)
        return "/" if rel == "." else "/" + rel

    def warn(self, msg: str) -> None:
        if msg not in self.warnings:
            self.warnings.append(msg)

    # ------------------------------------------------------------ reads

    def text(self, rel: str | Path, *, optional: bool = False) -> str | None:
        """The file's content, stripped; None when absent or unreadable."""
        p = self.path(rel)
        try:
            return p.read_text(errors="replace").strip()
        except FileNotFoundError:
            if not optional:
                self.warn(f"{self.show(p)}: missing")
        except OSError as e:
            # sysfs answers EINVAL for e.g. a down link's speed: not worth a warning
            # when the caller said the value may be absent.
            if not optional:
                self.warn(f"{self.show(p)}: unreadable ({e.strerror or e})")
        return None

    def lines(self, rel: str | Path, *, optional: bool = False) -> list[str]:
        t = self.text(rel, optional=optional)
        return t.splitlines() if t else []

    def int(self, rel: str | Path, *, optional: bool = False) -> int | None:
        t = self.text(rel, optional=optional)
        if t is None:
            return None
        try:
            return int(t, 0) if t.startswith("0x") else int(t)
        except ValueError:
            self.warn(f"{self.show(rel)}: expected an integer, found {t[:40]!r}")
            return None

    def cpu_list(self, rel: str | Path, *, optional: bool = False) -> frozenset[int] | None:
        t = self.text(rel, optional=optional)
        if t is None:
            return None
        if t == "(null)":  # nohz_full when the kernel was built with it but not booted with it
            return frozenset()
        try:
            return parse_cpu_list(t)
        except CpuListError as e:
            self.warn(f"{self.show(rel)}: {e}")
            return None

    def listdir(self, rel: str | Path) -> list[str]:
        """Entry names, naturally sorted; [] when the directory is absent."""
        try:
            return sorted(os.listdir(self.path(rel)), key=natural_key)
        except OSError:
            return []

    def exists(self, rel: str | Path) -> bool:
        return os.path.lexists(self.path(rel))

    def is_dir(self, rel: str | Path) -> bool:
        return self.path(rel).is_dir()

    def link_name(self, rel: str | Path) -> str | None:
        """The last component of a symlink's target ("ixgbe" for driver -> ../drivers/ixgbe)."""
        try:
            return os.path.basename(os.readlink(self.path(rel)))
        except OSError:
            return None

    def real(self, rel: str | Path) -> Path | None:
        """Where a sysfs symlink leads, resolved inside the root; None when dangling."""
        p = self.path(rel)
        try:
            r = p.resolve(strict=True)
        except (OSError, RuntimeError):
            return None
        return r if self._under_root(r) else None
