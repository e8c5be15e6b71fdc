"""Hold a VM's raw disks exclusively while its domain is defined and started.

``open(O_EXCL)`` on a block device claims it the way a mount, MD/LVM or ``mkfs`` does:
the open fails with EBUSY while any of those holds the disk, and while we hold it
none of them can take it. Held from right before the domain is defined until QEMU
has opened the disk, it closes the window between the handover checks
(``hostd/discover/diskuse.py``) and QEMU's open. QEMU opens without O_EXCL (libvirt
offers no exclusive open for block disks), so once our hold is released a host
mount of the disk would succeed again: docs/security.md says what remains.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from hostd.errors import Refused


class DiskHold:
    """``missing_ok``: a host tree (tests, a simulated fleet) has no device nodes; a
    disk without one is then not held. On a live host a missing node is a refusal."""

    def __init__(self, dev_dir: Path = Path("/dev"), *, missing_ok: bool = False):
        self.dev_dir = dev_dir
        self.missing_ok = missing_ok

    @contextlib.contextmanager
    def hold(self, disks: Sequence[tuple[str, str]]) -> Iterator[None]:
        """``disks``: (field, kernel name) pairs; a refusal names the field."""
        fds: list[int] = []
        try:
            for field, name in disks:
                path = self.dev_dir / name
                if self.missing_ok and not path.exists():
                    continue
                try:
                    fds.append(os.open(path, os.O_RDONLY | os.O_EXCL | os.O_CLOEXEC))
                except OSError as e:
                    why = ("another exclusive user holds it (a mount, MD/LVM, mkfs, or an O_EXCL opener)"
                           if e.errno == errno.EBUSY else e.strerror or str(e))
                    raise Refused(f"{name} cannot be held for the VM: {why}", field=field) from None
            yield
        finally:
            for fd in fds:
                os.close(fd)
