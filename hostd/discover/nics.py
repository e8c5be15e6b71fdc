"""Network interfaces backed by PCI functions, and their SR-IOV VFs.

Read from /sys/class/net/<if> -> device (the PCI function, or a virtio device
whose parent is one), ``device/sriov_totalvfs``, ``device/sriov_numvfs`` and the
``device/virtfnN`` links. Interfaces without a device (lo, bridges, bonds) are
left out, and so are VF netdevs: they are listed under their PF.
"""

from __future__ import annotations

import re
from pathlib import Path

from hostd.discover.fs import HostFs, natural_key
from hostd.discover.model import Nic, Vf

NET_DIR = "sys/class/net"
_PCI_ADDR = re.compile(r"^[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_VIRTFN = re.compile(r"virtfn(\d+)$")


def numa_node(fs: HostFs, dev: Path | None) -> int | None:
    """``numa_node`` of a device or its nearest ancestor that has one (a virtio or
    NVMe namespace inherits its PCI function's). -1 ("no affinity", common on
    single-socket boards) and absence give None."""
    devices = fs.path("sys/devices")
    p = dev
    while p is not None and (p == devices or devices in p.parents):
        v = fs.int(p / "numa_node", optional=True)
        if v is not None:
            return None if v < 0 else v
        p = p.parent if p != devices else None
    return None


def pci_function(fs: HostFs, dev: Path | None) -> Path | None:
    """The PCI function directory at or above ``dev``."""
    p = dev
    devices = fs.path("sys/devices")
    while p is not None and devices in p.parents:
        if _PCI_ADDR.match(p.name):
            return p
        p = p.parent
    return None


def _vf(fs: HostFs, pf: Path, index: int) -> Vf:
    link = pf / f"virtfn{index}"
    real = fs.real(link)
    pci = real.name if real else (fs.link_name(link) or "")
    netdevs = fs.listdir(link / "net")
    netdev = netdevs[0] if netdevs else None
    mac = fs.text(link / "net" / netdev / "address", optional=True) if netdev else None
    return Vf(index=index, pci=pci, driver=fs.link_name(link / "driver"), netdev=netdev, mac=mac)


def read_nics(fs: HostFs) -> tuple[Nic, ...]:
    out = []
    for name in fs.listdir(NET_DIR):
        ifdir = f"{NET_DIR}/{name}"
        dev = fs.real(f"{ifdir}/device")
        if dev is None:
            continue  # virtual interface
        if fs.exists(dev / "physfn"):
            continue  # a VF's netdev: reported under its PF
        pci = pci_function(fs, dev)
        if pci is None:
            continue  # USB or platform NIC: not assignable through SR-IOV
        totalvfs = fs.int(pci / "sriov_totalvfs", optional=True) or 0
        numvfs = fs.int(pci / "sriov_numvfs", optional=totalvfs == 0) or 0
        idx = sorted((int(m.group(1)) for n in fs.listdir(pci) if (m := _VIRTFN.match(n))))
        if len(idx) != numvfs:
            fs.warn(f"{name}: sriov_numvfs is {numvfs} but {len(idx)} virtfn links exist")
        speed = fs.int(f"{ifdir}/speed", optional=True)  # EINVAL while the link is down
        out.append(Nic(
            name=name,
            pci=pci.name,
            driver=fs.link_name(dev / "driver"),
            node=numa_node(fs, dev),
            speed_mbps=speed if speed is not None and speed > 0 else None,
            mac=fs.text(f"{ifdir}/address", optional=True),
            sriov_totalvfs=totalvfs,
            sriov_numvfs=numvfs,
            vfs=tuple(_vf(fs, pci, i) for i in idx),
        ))
    return tuple(sorted(out, key=lambda n: natural_key(n.name)))
