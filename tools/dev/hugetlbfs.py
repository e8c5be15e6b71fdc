"""A 2 MiB hugetlbfs mount shared by every test run and bench on this machine.

A machine without systemd (CI, this development machine) has no hugetlbfs mounted, and
libvirtd and hostd's carve check need one. Who mounts it may not unmount it while
another process still uses it: a bench that unmounted "its" mount at exit took it from a
test run beside it (hostd then answered "no hugetlbfs mount with 2048 kB pages" in the
middle of a live migration test). So each user holds the mount: a file per holder
(``<pid>-<n>``) in ``/run/hyb-hugetlbfs/``, changed under one lock; the first holder
mounts ``/dev/hugepages`` if the machine has no 2 MiB hugetlbfs, the last one unmounts
it only if a holder mounted it. Holders that died without letting go (SIGKILL) are
dropped by their PID when the next holder comes or goes.

    with held_2m() as mnt:
        ...
"""

from __future__ import annotations

import fcntl
import itertools
import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

REGISTRY = Path("/run/hyb-hugetlbfs")
MOUNT = Path("/dev/hugepages")
_seq = itertools.count()


def mount_2m(mounts: Path = Path("/proc/mounts")) -> Path | None:
    """A 2 MiB hugetlbfs mount point of this machine, if any."""
    for line in mounts.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "hugetlbfs" and ("pagesize=2M" in parts[3] or "pagesize" not in parts[3]):
            return Path(parts[1])
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _holders(reg: Path) -> list[Path]:
    out = []
    for f in reg.iterdir():
        pid = f.name.split("-", 1)[0]
        if not pid.isdigit():
            continue
        if _alive(int(pid)):
            out.append(f)
        else:
            f.unlink(missing_ok=True)  # a holder killed before it let go
    return out


@contextmanager
def _locked(reg: Path) -> Iterator[None]:
    reg.mkdir(mode=0o700, exist_ok=True)
    with open(reg / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@contextmanager
def held_2m(reg: Path = REGISTRY, mount: Path = MOUNT,
            find: Callable[[], Path | None] = mount_2m) -> Iterator[Path]:
    """``reg``, ``mount`` and ``find`` (the machine's 2 MiB hugetlbfs, if any) are the
    machine's; a test gives its own."""
    me = reg / f"{os.getpid()}-{next(_seq)}"
    with _locked(reg):
        mnt = find()
        if mnt is None:
            mount.mkdir(exist_ok=True)
            subprocess.run(["mount", "-t", "hugetlbfs", "-o", "pagesize=2M", "hugetlbfs", str(mount)], check=True)
            (reg / ".made").write_text(str(mount))
            mnt = mount
        me.touch()
    try:
        yield mnt
    finally:
        with _locked(reg):
            me.unlink(missing_ok=True)
            made = reg / ".made"
            if not _holders(reg) and made.exists():
                subprocess.run(["umount", made.read_text()], check=False)
                made.unlink()
