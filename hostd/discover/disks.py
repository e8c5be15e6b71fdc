"""Disks from /sys/block, their stable ids, and why a VM may not have one.

Listed: every /sys/block entry except stacked devices (dm-*, md*: they show up
as holders), RAM disks (ram*), unattached loop devices (no backing file) and
unconnected network block devices (nbd* of size 0).

Stable id, first found wins:
1. a /dev/disk/by-id name (from <root>/dev/disk/by-id, or udev's "S:" links),
   preferring wwn-*, then nvme-eui.* / nvme-uuid.* / nvme-nvme.*, then scsi-3*,
   then any other (ata-*, nvme-<model>_<serial>, scsi-*, virtio-*, usb-*), never -partN;
2. from udev properties: ID_WWN -> "wwn-<ID_WWN>" (NVMe: "nvme-<ID_WWN>"),
   else "<ID_BUS>-<ID_SERIAL>";
3. from sysfs, named as udev would name the link: NVMe ``wwid`` -> "nvme-<wwid>",
   SCSI ``device/wwid`` "naa.X" -> "wwn-0xX", virtio ``serial`` -> "virtio-<serial>".
Loop devices have no stable id (None).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from fnmatch import fnmatchcase

from hostd.discover.atomic import read_atomic
from hostd.discover.blockdevs import (
    BLOCK_DIR,
    BlockIndex,
    Mount,
    backing_disks,
    block_index,
    holder_kind,
    holders,
    mount_device,
    read_mounts,
    swap_devices,
)
from hostd.discover.diskuse import Holder, NsMount, namespace_mounts, open_holders, signature
from hostd.discover.fs import HostFs
from hostd.discover.host import probe_file
from hostd.discover.model import Disk
from hostd.discover.nics import numa_node
from hostd.discover.udev import UdevInfo, UdevSource

BY_ID = "dev/disk/by-id"
NOT_ALLOWED = "not in the allow-list"  # the carve planner keys on this prefix
BACKS_ROOT = "backs the root filesystem"
_ID_RANK = ("wwn-", "nvme-eui.", "nvme-uuid.", "nvme-nvme.", "scsi-3")


def allow_matches(pattern: str, name: str, disk_id: str | None) -> bool:
    """An allow-list entry matches the kernel name, /dev/NAME, the stable id or
    /dev/disk/by-id/ID, with fnmatch globs, case-sensitive (as the planner does)."""
    names = [name, f"/dev/{name}"] + ([disk_id, f"/dev/{BY_ID.removeprefix('dev/')}/{disk_id}"]
                                      if disk_id else [])
    return any(fnmatchcase(n, pattern) for n in names)


def _listed(fs: HostFs, idx: BlockIndex, name: str) -> bool:
    d = f"{BLOCK_DIR}/{name}"
    if name.startswith(("dm-", "md", "ram")) or fs.exists(f"{d}/dm") or fs.exists(f"{d}/md"):
        return False
    if name.startswith("loop"):
        return bool(fs.text(f"{d}/loop/backing_file", optional=True))
    if name.startswith("nbd"):
        return bool(fs.int(f"{d}/size", optional=True))
    return True


def _by_id_links(fs: HostFs, idx: BlockIndex) -> dict[str, list[str]]:
    """/dev/disk/by-id entries, grouped by the device they point at."""
    out: dict[str, list[str]] = {}
    for link in fs.listdir(BY_ID):
        target = fs.link_name(f"{BY_ID}/{link}")
        if target:
            out.setdefault(target, []).append(link)
    return out


def _rank(link: str) -> tuple[int, int, str]:
    for i, prefix in enumerate(_ID_RANK):
        if link.startswith(prefix):
            return (i, len(link), link)
    return (len(_ID_RANK), len(link), link)


def _sysfs_ids(fs: HostFs, name: str) -> tuple[str | None, str | None, str | None]:
    """(id, wwn, serial) from sysfs attributes, for hosts without udev data."""
    d = f"{BLOCK_DIR}/{name}"
    if name.startswith("nvme"):
        wwid = fs.text(f"{d}/wwid", optional=True)
        serial = fs.text(f"{d}/device/serial", optional=True)
        return (f"nvme-{wwid}" if wwid else None), wwid, serial or None
    wwid = fs.text(f"{d}/device/wwid", optional=True)
    if wwid and wwid.startswith("naa."):
        wwn = "0x" + wwid.removeprefix("naa.")
        return f"wwn-{wwn}", wwn, None
    serial = fs.text(f"{d}/serial", optional=True)
    if serial and name.startswith("vd"):
        return f"virtio-{serial}", None, serial
    return None, None, serial or None


def stable_id(fs: HostFs, name: str, links: list[str], udev: UdevInfo
              ) -> tuple[str | None, str | None, str | None]:
    """(id, wwn, serial) of a disk; see the module docstring for the order."""
    p = udev.properties
    wwn = p.get("ID_WWN_WITH_EXTENSION") or p.get("ID_WWN")
    serial = p.get("ID_SERIAL_SHORT") or p.get("ID_SERIAL")
    udev_links = [s.removeprefix("disk/by-id/") for s in udev.links if s.startswith("disk/by-id/")]
    candidates = [x for x in {*links, *udev_links} if "-part" not in x]
    if candidates:
        disk_id: str | None = min(candidates, key=_rank)
    elif wwn:
        disk_id = f"nvme-{wwn}" if name.startswith("nvme") else f"wwn-{wwn}"
    elif p.get("ID_SERIAL"):
        disk_id = f"{p['ID_BUS']}-{p['ID_SERIAL']}" if p.get("ID_BUS") else p["ID_SERIAL"]
    else:
        disk_id = None
    if disk_id and wwn and serial:
        return disk_id, wwn, serial
    s_id, s_wwn, s_serial = _sysfs_ids(fs, name)
    return disk_id or s_id, wwn or s_wwn, serial or s_serial


def read_disks(fs: HostFs, udev: UdevSource, allow: tuple[str, ...], only: str | None = None,
               wipe_ok: tuple[str, ...] = ()) -> tuple[Disk, ...]:
    """Every listed disk, or with ``only`` just that one (none if it is gone): the
    re-check right before a VM gets a disk reads that disk's state, not the host's."""
    idx = block_index(fs)
    mounts = read_mounts(fs)
    swaps = swap_devices(fs, idx)
    by_id = _by_id_links(fs, idx)
    root_disks = _root_disks(fs, idx, mounts)
    names = [n for n, parent in idx.parent.items() if parent is None and only in (None, n) and _listed(fs, idx, n)]
    members = {m: n for n in names for m in _members(idx, n)}
    in_use = Use(holders=open_holders(fs, members, skip_pids={os.getpid()}),
                 ns_mounts=namespace_mounts(fs, idx, members), member_of=members)
    probe = {} if fs.live else probe_file(fs)
    out = []
    for name in names:
        disk = _disk(fs, idx, name, udev, by_id.get(name, []), mounts, swaps, name in root_disks, allow)
        disk = dataclasses.replace(disk, atomic=read_atomic(fs, name, probe))
        out.append(_with_use(fs, disk, in_use, wipe_ok))
    return tuple(out)


def _members(idx: BlockIndex, name: str) -> list[str]:
    return [name, *(p for p, parent in idx.parent.items() if parent == name)]


@dataclass(frozen=True)
class Use:
    holders: list[Holder]
    ns_mounts: list[NsMount]
    member_of: dict[str, str]  # disk or partition -> its disk


def _with_use(fs: HostFs, d: Disk, use: Use, wipe_ok: tuple[str, ...]) -> Disk:
    """Mounts in other namespaces join ``reasons`` (a mount is a mount wherever it is);
    open holders and signatures are the handover checks."""
    own = set(d.mountpoints)
    ns = [str(m) for m in use.ns_mounts if use.member_of[m.device] == d.name and m.mountpoint not in own]
    ns = list(dict.fromkeys(ns))
    handover = [str(h) for h in use.holders if use.member_of[h.device] == d.name]
    if not d.reasons and not any(allow_matches(p, d.name, d.id) for p in wipe_ok):
        sig = signature(fs, d.name)
        if sig:
            handover.append(f"carries {sig}" if not sig.startswith("signature unknown") else sig)
    if not ns and not handover:
        return d
    reasons = d.reasons + tuple(ns)
    return dataclasses.replace(d, reasons=reasons, assignable=not reasons, handover=tuple(handover))


def _root_disks(fs: HostFs, idx: BlockIndex, mounts: list[Mount]) -> set[str]:
    root = [m for m in mounts if m.mountpoint == "/"]
    if not root:
        fs.warn("no mount on / in /proc/self/mountinfo: no disk is marked as backing the root filesystem")
        return set()
    m = root[-1]  # the last mount on "/" is the one in effect
    dev = mount_device(idx, m)
    if dev is None:
        fs.warn(f"/ is on {m.source} ({m.fstype}, device {m.devnum or '?'}), not a device in "
                "/sys/block: no disk is marked as backing the root filesystem")
        return set()
    return backing_disks(fs, idx, dev)


def _disk(fs: HostFs, idx: BlockIndex, name: str, udev: UdevSource, links: list[str],
          mounts: list[Mount], swaps: set[str], backs_root: bool, allow: tuple[str, ...]) -> Disk:
    d = f"{BLOCK_DIR}/{name}"
    parts = [p for p, parent in idx.parent.items() if parent == name]
    members = [name, *parts]
    sectors = fs.int(f"{d}/size")
    size = (sectors or 0) * 512  # /sys/block/*/size counts 512-byte sectors, whatever the LBA size
    readonly = fs.int(f"{d}/ro") == 1
    info = udev.info(idx.devnum.get(name, ""), fs.path(d)) if name in idx.devnum else UdevInfo()
    disk_id, wwn, serial = (None, None, None) if name.startswith("loop") else \
        stable_id(fs, name, links, info)
    model = info.properties.get("ID_MODEL") or fs.text(f"{d}/device/model", optional=True)
    held = sorted({h for m in members for h in holders(fs, idx, m)})
    on = [(m.mountpoint, dev) for m in mounts if (dev := mount_device(idx, m)) in members]
    mountpoints = tuple(dict.fromkeys(mp for mp, _ in on))
    swapped = [m for m in members if m in swaps]
    reasons = [f"mounted at {mp} ({dev})" for mp, dev in dict.fromkeys(on)]
    if backs_root:
        reasons.append(BACKS_ROOT)
    reasons += [f"in use as swap ({m})" for m in swapped]
    reasons += [f"holder {h} ({holder_kind(fs, h)})" for h in held]
    if name.startswith("zram"):
        reasons.append("zram (compressed RAM, not a disk)")
    if readonly:
        reasons.append("read-only")
    if size == 0:
        reasons.append("size 0")
    if not any(allow_matches(p, name, disk_id) for p in allow):
        reasons.append(f"{NOT_ALLOWED} (no allow-list given)" if not allow else NOT_ALLOWED)
    dev = fs.real(f"{d}/device") or fs.real(d)
    return Disk(
        name=name, id=disk_id, wwn=wwn, serial=serial, model=model.strip() if model else None,
        size_bytes=size, rotational=fs.int(f"{d}/queue/rotational") == 1, readonly=readonly,
        removable=fs.int(f"{d}/removable") == 1, node=numa_node(fs, dev), partitions=tuple(parts),
        holders=tuple(held), mountpoints=mountpoints, swap=bool(swapped), assignable=not reasons,
        reasons=tuple(reasons),
        backing_file=fs.text(f"{d}/loop/backing_file", optional=True) if name.startswith("loop") else None,
    )
