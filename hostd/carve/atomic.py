"""Which atomic-write unit a VM on a disk is guaranteed (issue #41). Pure.

A guest can rely on an atomic write only if every layer between it and the device
keeps the write whole. A disk's unit is offered (``DiskBudget.atomic_write_bytes``)
only through a path in ``CARRIES``; everything else offers 0 with the reason in
``atomic_note``, and the scheduler's dry run quotes that reason.

- ``virtio-blk`` / ``virtio-scsi`` (how hostd hands raw disks to guests today): the
  guest is never told an atomic unit, so its kernel never issues an atomic write.
- ``emulated-nvme``: QEMU's NVMe controller (9.2+) can advertise ``atomic.awun`` /
  ``atomic.awupf``, but it writes a guest command to the backing device with
  ``dma_blk_write`` -> ``blk_aio_pwritev`` and no atomic flag (hw/nvme/ctrl.c
  ``nvme_blk_write``, system/dma-helpers.c ``dma_blk_cb``): the command may go down as
  several writes, and the host kernel is free to split it. Advertising the unit would
  promise what QEMU does not keep, so the path does not carry it (hostd/README.md,
  "Atomic writes", has the reading of the source).
- ``vfio-nvme``: the guest drives the NVMe function itself and sees the device's own
  units. It carries the guarantee; hostd cannot build it yet (the domain designer
  renders raw disks as virtio-blk), so no carve lists it.
"""

from __future__ import annotations

from hostd.discover.model import Disk

CARRIES = {"virtio-blk": False, "virtio-scsi": False, "emulated-nvme": False, "vfio-nvme": True}
WHY_NOT = {
    "virtio-blk": "virtio-blk does not tell the guest an atomic unit",
    "virtio-scsi": "virtio-scsi does not tell the guest an atomic unit",
    "emulated-nvme": ("QEMU's emulated NVMe can split a guest's atomic write on its way to the disk "
                      "(blk_aio_pwritev without an atomic flag)"),
}


def offer(disk: Disk, paths: frozenset[str]) -> tuple[int, int, str]:
    """(device unit, unit offered to a VM, note) for ``disk`` when hostd can give it to a
    guest over ``paths``. The offered unit is the device's power-of-two unit through a
    path that carries it, else 0 and why."""
    a = disk.atomic
    if a is None:
        return 0, 0, "atomic-write unit unknown (kernel before 6.11 and no NVMe identify data)"
    if not a.unit_max_bytes:
        return 0, 0, a.detail or "no atomic writes"
    carrying = sorted(p for p in paths if CARRIES.get(p))
    if carrying:
        return a.unit_max_bytes, a.unit_max_bytes, f"{a.unit_max_bytes} B through {carrying[0]}"
    why = "; ".join(WHY_NOT.get(p, f"{p} is not known to carry atomic writes") for p in sorted(paths))
    return a.unit_max_bytes, 0, f"device unit {a.unit_max_bytes} B, but no path carries it to the guest: {why}"
