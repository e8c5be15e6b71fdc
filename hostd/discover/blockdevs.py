"""What uses a block device: the index of /sys/block, mounts, swap, the device
stack (holders/slaves) and the device that backs "/".

Mounts are matched by major:minor from /proc/self/mountinfo (a mount source
may be /dev/root, a /dev/mapper name or a by-uuid path; the device number is
exact). Filesystems that report an anonymous device (btrfs "0:NN") are matched
by their source path instead, and /proc/mounts is read when mountinfo is absent.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hostd.discover.fs import HostFs
from hostd.discover.memory import unescape_mount

BLOCK_DIR = "sys/block"


@dataclass(frozen=True)
class Mount:
    devnum: str  # "8:2"
    mountpoint: str
    fstype: str
    source: str


@dataclass
class BlockIndex:
    """Every block device and partition the kernel lists, by name and by major:minor."""

    parent: dict[str, str | None] = field(default_factory=dict)  # partition -> disk, disk -> None
    devnum: dict[str, str] = field(default_factory=dict)  # name -> "maj:min"
    by_devnum: dict[str, str] = field(default_factory=dict)
    dm_names: dict[str, str] = field(default_factory=dict)  # "vg0-root" -> "dm-0"

    def sysdir(self, name: str) -> str:
        p = self.parent.get(name)
        return f"{BLOCK_DIR}/{p}/{name}" if p else f"{BLOCK_DIR}/{name}"

    def disk_of(self, name: str) -> str:
        return self.parent.get(name) or name

    def name_for_path(self, path: str) -> str | None:
        """"/dev/sda1" -> "sda1", "/dev/mapper/vg0-root" -> "dm-0"."""
        if path.startswith("/dev/mapper/"):
            return self.dm_names.get(path.removeprefix("/dev/mapper/"))
        if path.startswith("/dev/"):
            name = path.removeprefix("/dev/")
            return name if name in self.devnum else None
        return None


def block_index(fs: HostFs) -> BlockIndex:
    idx = BlockIndex()
    for name in fs.listdir(BLOCK_DIR):
        idx.parent[name] = None
        _add_devnum(fs, idx, name, f"{BLOCK_DIR}/{name}")
        for sub in fs.listdir(f"{BLOCK_DIR}/{name}"):
            if fs.exists(f"{BLOCK_DIR}/{name}/{sub}/partition"):
                idx.parent[sub] = name
                _add_devnum(fs, idx, sub, f"{BLOCK_DIR}/{name}/{sub}")
        dm = fs.text(f"{BLOCK_DIR}/{name}/dm/name", optional=True)
        if dm:
            idx.dm_names[dm] = name
    return idx


def _add_devnum(fs: HostFs, idx: BlockIndex, name: str, d: str) -> None:
    dev = fs.text(f"{d}/dev")
    if dev:
        idx.devnum[name] = dev
        idx.by_devnum[dev] = name


def read_mounts(fs: HostFs) -> list[Mount]:
    """Mounts from /proc/self/mountinfo, or /proc/mounts (no device numbers) when absent."""
    lines = fs.lines("proc/self/mountinfo", optional=True)
    if lines:
        out = []
        for line in lines:
            pre, sep, post = line.partition(" - ")
            a, b = pre.split(), post.split()
            if not sep or len(a) < 5 or len(b) < 2:
                fs.warn(f"/proc/self/mountinfo: cannot parse {line[:60]!r}")
                continue
            out.append(Mount(a[2], unescape_mount(a[4]), b[0], unescape_mount(b[1])))
        return out
    out = []
    for line in fs.lines("proc/mounts"):
        f = line.split()
        if len(f) >= 3:
            out.append(Mount("", unescape_mount(f[1]), f[2], unescape_mount(f[0])))
    return out


def mount_device(idx: BlockIndex, m: Mount) -> str | None:
    """The block device (disk, partition, dm, md) a mount lives on, if any."""
    return idx.by_devnum.get(m.devnum) or idx.name_for_path(m.source)


def swap_devices(fs: HostFs, idx: BlockIndex) -> set[str]:
    """Block devices in /proc/swaps (swap files are ignored: their disk is mounted)."""
    out = set()
    for line in fs.lines("proc/swaps")[1:]:
        f = line.split()
        if f and (name := idx.name_for_path(unescape_mount(f[0]))):
            out.add(name)
    return out


def slaves(fs: HostFs, idx: BlockIndex, name: str) -> list[str]:
    return fs.listdir(f"{idx.sysdir(name)}/slaves")


def holders(fs: HostFs, idx: BlockIndex, name: str) -> list[str]:
    return fs.listdir(f"{idx.sysdir(name)}/holders")


def backing_disks(fs: HostFs, idx: BlockIndex, name: str) -> set[str]:
    """The disks under a device: a partition's disk, a dm/md device's slaves' disks."""
    out: set[str] = set()
    todo, seen = [name], set()
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        below = slaves(fs, idx, n)
        if below:
            todo.extend(below)
        else:
            out.add(idx.disk_of(n))
    return out


def holder_kind(fs: HostFs, holder: str) -> str:
    """Human words for what a holder is, for the reasons list."""
    d = f"{BLOCK_DIR}/{holder}"
    if fs.exists(f"{d}/md") or holder.startswith("md"):
        level = fs.text(f"{d}/md/level", optional=True)
        return f"md {level} member" if level else "md raid member"
    if fs.exists(f"{d}/dm") or holder.startswith("dm-"):
        uuid = fs.text(f"{d}/dm/uuid", optional=True) or ""
        name = fs.text(f"{d}/dm/name", optional=True)
        kind = ("device-mapper/LVM" if uuid.startswith("LVM-") else
                "device-mapper/crypt" if uuid.startswith("CRYPT-") else
                "device-mapper/multipath" if uuid.startswith("mpath-") else "device-mapper")
        return f"{kind} {name}" if name else kind
    if holder.startswith("bcache"):
        return "bcache backing or cache device"
    return "stacked block device"
