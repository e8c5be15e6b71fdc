"""Where the cpuset controller lives (cgroup v1 or v2) and how to read it.

Read-only helpers; the writes are ``steps.WriteAttr``/``MakeDir``/``MovePid``.
Every path is relative to ``root`` (``/`` on a host, a tree in tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CpusetFs:
    """The cpuset hierarchy: its mount point and its version."""

    mount: Path
    version: int  # 1 or 2

    @property
    def cpus_file(self) -> str:
        return "cpuset.cpus"

    @property
    def mems_file(self) -> str:
        return "cpuset.mems"

    @property
    def procs_file(self) -> str:
        return "cgroup.procs"

    def path(self, cgroup: str) -> Path:
        return self.mount / cgroup.strip("/") if cgroup.strip("/") else self.mount


def find_cpuset_fs(root: Path = Path("/")) -> CpusetFs | None:
    """The v1 cpuset mount if there is one (it owns the controller), else the v2
    mount whose ``cgroup.controllers`` offers cpuset."""
    v2: Path | None = None
    for line in (root / "proc/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        _dev, mnt, fstype, opts = parts[:4]
        where = root / mnt.lstrip("/")
        if fstype == "cgroup" and "cpuset" in opts.split(","):
            return CpusetFs(where, 1)
        if fstype == "cgroup2" and v2 is None:
            ctrl = where / "cgroup.controllers"
            if ctrl.exists() and "cpuset" in ctrl.read_text().split():
                v2 = where
    return CpusetFs(v2, 2) if v2 else None


def pid_cpuset_cgroup(root: Path, pid: int, version: int) -> str:
    """The cgroup path (relative to the hierarchy) a process is in for cpuset."""
    for line in (root / f"proc/{pid}/cgroup").read_text().splitlines():
        hid, ctrls, path = line.split(":", 2)
        if version == 1 and "cpuset" in ctrls.split(","):
            return path
        if version == 2 and hid == "0":
            return path
    raise LookupError(f"pid {pid} has no cpuset cgroup")


def find_pids(root: Path, pattern: str, *, exclude: set[int] = frozenset()) -> list[tuple[int, str]]:
    """Processes whose full command line contains ``pattern`` (like ``pgrep -f``);
    returns (pid, comm) sorted by pid. Kernel threads (empty cmdline) never match."""
    out: list[tuple[int, str]] = []
    for d in (root / "proc").iterdir():
        if not d.name.isdigit() or int(d.name) in exclude:
            continue
        try:
            matched = cmdline_matches(root, int(d.name), pattern)
            comm = (d / "comm").read_text().strip()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if matched:
            out.append((int(d.name), comm))
    return sorted(out)


def cmdline_matches(root: Path, pid: int, pattern: str) -> bool:
    """``pattern`` is in ``pid``'s command line, its arguments joined by spaces (how
    ``find_pids`` matches the IO service); False for a kernel thread (no command line).
    A process that ended raises (FileNotFoundError, ProcessLookupError)."""
    raw = (root / f"proc/{pid}/cmdline").read_bytes()
    return bool(raw) and pattern in raw.replace(b"\0", b" ").decode(errors="replace").strip()


def cpu_controller_cgroup(root: Path, pid: int) -> Path | None:
    """The directory of ``pid``'s cgroup that holds its CFS quota and ``cpu.stat``: on v1
    under the hierarchy that mounts the ``cpu`` controller, on v2 its one cgroup. None
    when neither can be found (no such process, no cpu controller)."""
    try:
        lines = (root / f"proc/{pid}/cgroup").read_text().splitlines()
        mounts = (root / "proc/mounts").read_text().splitlines()
    except OSError:
        return None
    v1 = v2 = None
    for line in mounts:
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "cgroup" and "cpu" in parts[3].split(","):
            v1 = root / parts[1].lstrip("/")
        elif len(parts) >= 4 and parts[2] == "cgroup2":
            v2 = root / parts[1].lstrip("/")
    for line in lines:
        hid, ctrls, path = line.split(":", 2)
        if v1 is not None and "cpu" in ctrls.split(","):
            return v1 / path.lstrip("/")
        if v1 is None and v2 is not None and hid == "0":
            return v2 / path.lstrip("/")
    return None
