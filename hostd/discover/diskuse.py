"""Who uses a disk right now, beyond what /sys and this mount namespace show.

Three readers, each taking the host root like every discover reader:

- ``open_holders``: processes holding a disk (or one of its partitions) open, from
  ``/proc/<pid>/fd`` the way ``fuser`` finds them: the IO service on some storage
  hosts writes raw disks without mounting them.
- ``namespace_mounts``: mounts of a disk in *any* mount namespace, from one
  ``/proc/<pid>/mountinfo`` per namespace (``/proc/<pid>/ns/mnt``): a container or a
  service with ``PrivateMounts=`` can mount a disk the host's mount table never shows.
- ``signature``: what libblkid finds on the device (``blkid -p``, a low-level probe
  that ignores its cache): a filesystem, RAID member, LVM PV or partition table means
  the disk holds data, even when nothing uses it now (a disk the IO service owns but
  has not mounted yet, or one just pulled from another host).

These are the *handover* checks: they are made right before a disk goes to a VM (and
shown by ``hostd discover``). A VM's own QEMU holds its disk open and a guest writes
filesystems on it, so they do not shrink the carve layout the way a mount does.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
from collections.abc import Collection
from dataclasses import dataclass

from hostd.discover.blockdevs import BlockIndex, unescape_mount
from hostd.discover.fs import HostFs

BLKID_TIMEOUT_S = 10
_PID_RE = re.compile(r"^\d+$")


@dataclass(frozen=True)
class Holder:
    pid: int
    comm: str
    device: str  # the disk or partition it holds

    def __str__(self) -> str:
        return f"held open by pid {self.pid} ({self.comm}) on {self.device}"


def _pids(fs: HostFs) -> list[str]:
    return [p for p in fs.listdir("proc") if _PID_RE.match(p)]


def _comm(fs: HostFs, pid: str) -> str:
    return fs.text(f"proc/{pid}/comm", optional=True) or "?"


def open_holders(fs: HostFs, names: Collection[str], *, skip_pids: Collection[int] = ()) -> list[Holder]:
    """Processes with an open file descriptor on a block device in ``names`` (kernel
    names: a disk and its partitions). Processes that vanish while read are skipped."""
    want = set(names)
    out: list[Holder] = []
    for pid in _pids(fs):
        if int(pid) in skip_pids:
            continue
        fd_dir = fs.path(f"proc/{pid}/fd")
        try:
            fds = os.listdir(fd_dir)
        except OSError:  # gone, or not ours to read
            continue
        seen: set[str] = set()
        for fd in fds:
            try:
                target = os.readlink(fd_dir / fd)
            except OSError:
                continue
            if target.startswith("/dev/") and (dev := target.rsplit("/", 1)[-1]) in want and dev not in seen:
                seen.add(dev)
                out.append(Holder(int(pid), _comm(fs, pid), dev))
    return out


@dataclass(frozen=True)
class NsMount:
    pid: int  # a process in that namespace
    comm: str
    device: str
    mountpoint: str

    def __str__(self) -> str:
        return f"mounted at {self.mountpoint} ({self.device}) in the mount namespace of pid {self.pid} ({self.comm})"


def namespace_mounts(fs: HostFs, idx: BlockIndex, names: Collection[str]) -> list[NsMount]:
    """Mounts of a device in ``names`` in mount namespaces other than this process's
    (its own are read from /proc/self/mountinfo with the rest of discover)."""
    want = set(names)
    own = _ns(fs, "self")
    seen = {own} if own else set()
    out: list[NsMount] = []
    for pid in _pids(fs):
        ns = _ns(fs, pid)
        if ns is None or ns in seen:
            continue
        seen.add(ns)
        for line in fs.lines(f"proc/{pid}/mountinfo", optional=True):
            pre, sep, post = line.partition(" - ")
            a, b = pre.split(), post.split()
            if not sep or len(a) < 5 or len(b) < 2:
                continue
            dev = idx.by_devnum.get(a[2]) or idx.name_for_path(unescape_mount(b[1]))
            if dev in want:
                out.append(NsMount(int(pid), _comm(fs, pid), dev, unescape_mount(a[4])))
    return out


def _ns(fs: HostFs, pid: str) -> str | None:
    try:
        return os.readlink(fs.path(f"proc/{pid}/ns/mnt"))
    except OSError:
        return None


def signature(fs: HostFs, name: str) -> str | None:
    """What libblkid finds on /dev/<name>, as a reason ("an ext4 filesystem signature"),
    or None when it finds nothing. Not probed (None) where the host tree has no such
    device node (a recorded tree). A device that cannot be read is a reason too: a disk
    nobody can show to be blank is not handed over."""
    dev = fs.path(f"dev/{name}")
    try:
        mode = dev.stat().st_mode
    except OSError:
        return None
    if not (stat.S_ISBLK(mode) or stat.S_ISREG(mode)):
        return None
    try:
        r = subprocess.run(["blkid", "-p", "-o", "export", str(dev)], capture_output=True, text=True,
                           timeout=BLKID_TIMEOUT_S)
    except FileNotFoundError:
        return "signature unknown: blkid (util-linux) is not installed"
    except subprocess.TimeoutExpired:
        return f"signature unknown: blkid did not answer in {BLKID_TIMEOUT_S} s"
    if r.returncode == 2 and not r.stdout.strip():
        return None  # blkid: nothing found
    if r.returncode != 0:
        return f"signature unknown: blkid failed ({(r.stderr or r.stdout).strip()[:120] or r.returncode})"
    found = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
    return describe(found)


_USAGE = {"filesystem": "filesystem", "raid": "RAID member", "crypto": "encrypted volume",
          "other": "signature"}


def describe(found: dict[str, str]) -> str | None:
    """blkid's export keys -> the reason, naming what it found."""
    if found.get("PTTYPE"):
        return f"{_a(found['PTTYPE'])} {found['PTTYPE']} partition table"
    kind = found.get("TYPE")
    if not kind:
        return None
    if kind == "LVM2_member":
        return "an LVM physical volume signature (LVM2_member)"
    usage = _USAGE.get(found.get("USAGE", ""), "signature")
    return f"{_a(kind)} {kind} {usage} signature"


def _a(word: str) -> str:
    return "an" if word[:1].lower() in "aeiox" else "a"  # "an ext4", "an xfs", "a gpt"
