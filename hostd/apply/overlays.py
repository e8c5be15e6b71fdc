"""Per-VM files on the host, in ``<state_dir>/vms/<vm name>/``: a qcow2 overlay on the
image's root disk, so VMs never share a writable root and the image stays pristine, and
the serial console's log (``hostd/domain/designer.py`` names it). The overlay is made
right before the domain is defined; the directory goes with the VM (``release``)."""

from __future__ import annotations

import dataclasses
import logging
import shutil
import stat
import subprocess
from pathlib import Path

from api.bounds import check_vm_name
from hostd.domain.image import Image
from hostd.errors import BadImage

log = logging.getLogger(__name__)

OVERLAY = "root.qcow2"


class Overlays:
    def __init__(self, vms_dir: Path):
        self.vms_dir = vms_dir  # <state_dir>/vms/<vm name>/

    def prepare(self, name: str, image: Image) -> Image:
        """The image as VM ``name`` boots it: a disk image gets a fresh overlay
        (a leftover of a create that died is replaced); a kernel image is as it is."""
        if "disk" not in image.files:
            return image
        d = self.vms_dir / name
        d.mkdir(parents=True, exist_ok=True)
        blocked = unreachable_for_qemu(d)
        if blocked is not None:
            raise BadImage(f"QEMU cannot reach {d}: {blocked} is not traversable by other users "
                           "(chmod o+x, or move state_dir)", field="state_dir")
        overlay = d / OVERLAY
        overlay.unlink(missing_ok=True)
        r = subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", image.files["disk"],
                            "-F", image.format, str(overlay)], capture_output=True, text=True)
        if r.returncode != 0:
            raise BadImage(f"{image.name}: qemu-img could not make the root overlay: {r.stderr.strip()}",
                           field="image")
        return dataclasses.replace(image, files=image.files | {"disk": str(overlay)}, format="qcow2")

    def release(self, name: str) -> None:
        """Remove VM ``name``'s directory, overlay and console log with it. Only a VM
        name (``api.bounds.check_vm_name``) makes a path: a ledger row an older hostd
        wrote for a VM named ".." must not remove the state directory."""
        try:
            check_vm_name(name)
        except ValueError as e:
            log.warning("not removing the files of VM %r: %s", name[:80], e)
            return
        d = self.vms_dir / name
        if d.is_dir() and not d.is_symlink():
            shutil.rmtree(d)


def unreachable_for_qemu(path: Path) -> Path | None:
    """The first ancestor of ``path`` that QEMU (an unprivileged user under libvirt)
    cannot traverse, or None. libvirt chowns a disk file to the QEMU user but never
    its directories, so a root overlay under a 0700 directory cannot be opened."""
    p = path.resolve()
    for d in [p, *p.parents]:
        try:
            if not d.stat().st_mode & stat.S_IXOTH:
                return d
        except FileNotFoundError:
            continue
    return None
