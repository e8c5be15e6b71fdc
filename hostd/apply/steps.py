"""Carve steps: one small reversible change each, serialisable to the journal.

A step knows how to apply itself, how to undo itself from what it recorded
(``before``), and how to describe itself in one line for `--dry-run` and logs.
Steps never decide policy; ``hostd.apply.layout_steps`` computes them from a Layout
and the host's current state.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from hostd.apply.sysfs import read_attr, write_attr
from hostd.errors import ApplyFailed

log = logging.getLogger(__name__)


class VfRates(Protocol):
    """Sets and reads an SR-IOV VF's tx rate limits on its PF (netlink)."""

    def get_rate(self, pf: str, vf: int) -> tuple[int, int]: ...  # (max, min) Mbit/s

    def set_rate(self, pf: str, vf: int, max_mbps: int, min_mbps: int) -> None: ...


class Mounter(Protocol):
    def mount_hugetlbfs(self, path: Path, pagesize_kb: int) -> None: ...

    def umount(self, path: Path) -> None: ...

    def is_mounted(self, path: Path) -> bool: ...


@dataclass
class Context:
    """What steps act on: real paths on a host, a tree in tests."""

    vf_rates: VfRates | None
    mounter: Mounter


class Step:
    kind: ClassVar[str]

    def apply(self, ctx: Context) -> None:
        raise NotImplementedError

    def undo(self, ctx: Context) -> None:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **asdict(self)}  # type: ignore[call-overload]


@dataclass
class WriteAttr(Step):
    """Write a sysfs/cgroupfs attribute; undo writes the old value back."""

    kind: ClassVar[str] = "attr"
    path: str
    before: str
    after: str
    verify: bool = False  # read back and fail when the kernel did not take it all

    def apply(self, ctx: Context) -> None:
        write_attr(Path(self.path), self.after)
        if self.verify:
            got = read_attr(Path(self.path))
            if got != self.after:
                raise ApplyFailed(f"kernel accepted {got} of {self.after} at {self.path}",
                                  field=self.path)

    def undo(self, ctx: Context) -> None:
        write_attr(Path(self.path), self.before)

    def describe(self) -> str:
        return f"write {self.path}: {self.before!r} -> {self.after!r}"


@dataclass
class MakeDir(Step):
    """Create a cgroup (or mount point) directory; undo removes it."""

    kind: ClassVar[str] = "mkdir"
    path: str

    def apply(self, ctx: Context) -> None:
        os.mkdir(self.path)

    def undo(self, ctx: Context) -> None:
        try:
            os.rmdir(self.path)
        except FileNotFoundError:
            pass
        except OSError as e:
            if e.errno != errno.ENOTEMPTY:
                raise
            # A plain directory in a test tree: cgroupfs dirs hold only attributes.
            shutil.rmtree(self.path)

    def describe(self) -> str:
        return f"create {self.path}"


@dataclass
class MovePid(Step):
    """Move a process into a cgroup; undo moves it back if it still runs."""

    kind: ClassVar[str] = "move_pid"
    pid: int
    comm: str
    before: str  # cgroup directory it was in
    after: str  # cgroup directory it goes to
    procs_file: str = "cgroup.procs"

    def apply(self, ctx: Context) -> None:
        _move(self.pid, Path(self.after) / self.procs_file)

    def undo(self, ctx: Context) -> None:
        # The original cgroup may be gone (service restarted): nearest ancestor.
        home = Path(self.before)
        while not (home / self.procs_file).exists() and home != home.parent:
            home = home.parent
        if home != Path(self.before):
            log.warning("move_pid undo pid=%s cgroup=%s gone, using %s", self.pid, self.before, home)
        try:
            _move(self.pid, home / self.procs_file)
        except ProcessLookupError:
            log.info("move_pid undo skipped pid=%s reason=exited", self.pid)

    def describe(self) -> str:
        return f"move pid {self.pid} ({self.comm}) {self.before} -> {self.after}"


def _move(pid: int, procs: Path) -> None:
    try:
        write_attr(procs, pid)
    except OSError as e:
        if e.errno == errno.ESRCH:
            raise ProcessLookupError(pid) from e
        raise


@dataclass
class MountHugetlbfs(Step):
    kind: ClassVar[str] = "mount"
    path: str
    pagesize_kb: int
    created_dir: bool

    def apply(self, ctx: Context) -> None:
        p = Path(self.path)
        if self.created_dir:
            p.mkdir(parents=True)
        try:
            ctx.mounter.mount_hugetlbfs(p, self.pagesize_kb)
        except Exception:
            if self.created_dir:
                p.rmdir()
            raise

    def undo(self, ctx: Context) -> None:
        if ctx.mounter.is_mounted(Path(self.path)):  # a crash may have come before the mount
            ctx.mounter.umount(Path(self.path))
        if self.created_dir and Path(self.path).is_dir():
            Path(self.path).rmdir()

    def describe(self) -> str:
        return f"mount hugetlbfs pagesize={self.pagesize_kb}kB at {self.path}"


@dataclass
class SetVfRate(Step):
    kind: ClassVar[str] = "vf_rate"
    pf: str
    vf: int
    before_max: int
    before_min: int
    max_mbps: int
    min_mbps: int

    def apply(self, ctx: Context) -> None:
        assert ctx.vf_rates is not None, "VF steps need a netlink handle"
        ctx.vf_rates.set_rate(self.pf, self.vf, self.max_mbps, self.min_mbps)

    def undo(self, ctx: Context) -> None:
        assert ctx.vf_rates is not None, "VF steps need a netlink handle"
        ctx.vf_rates.set_rate(self.pf, self.vf, self.before_max, self.before_min)

    def describe(self) -> str:
        return (f"set {self.pf} vf {self.vf} tx rate max {self.before_max}->{self.max_mbps} "
                f"min {self.before_min}->{self.min_mbps} Mbit/s")


STEP_KINDS: dict[str, type[Step]] = {
    c.kind: c for c in (WriteAttr, MakeDir, MovePid, MountHugetlbfs, SetVfRate)
}


def step_from_dict(d: dict[str, Any], kinds: dict[str, type[Step]] | None = None) -> Step:
    d = dict(d)
    cls = (kinds or STEP_KINDS)[d.pop("kind")]
    return cls(**d)


class SystemMounter:
    """Real mounts through mount(8)/umount(8)."""

    def mount_hugetlbfs(self, path: Path, pagesize_kb: int) -> None:
        _run(["mount", "-t", "hugetlbfs", "-o", f"pagesize={pagesize_kb}K", "hugetlbfs", str(path)])

    def umount(self, path: Path) -> None:
        _run(["umount", str(path)])

    def is_mounted(self, path: Path) -> bool:
        return os.path.ismount(path)


def _run(cmd: list[str]) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise ApplyFailed(f"{' '.join(cmd)} failed: {r.stderr.strip()}", field=cmd[-1])
