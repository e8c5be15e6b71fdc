"""hostd's image store: guest images a VM may name, each with a manifest.

    <image_dir>/<name>/manifest.json
    {"name": "smoke", "version": "6.1.0-56", "kind": "kernel",
     "files": {"kernel": "/var/cache/.../vmlinuz", "initrd": "/var/cache/.../initrd.img"},
     "cmdline": "console=ttyS0", "sha256": {"kernel": "...", "initrd": "..."}}

``kind`` is ``kernel`` (direct kernel boot: kernel + initrd + cmdline) or ``disk``
(a raw/qcow2 root disk: files.disk, ``format``). A file's checksum is verified once
per version of the file: ``<name>/verified.json`` records, for each file, the inode,
size and modification time it had when its checksum last matched (``add`` computes
the checksums, so it writes the record too). A file replaced or written since is
hashed again before a VM boots from it; one unchanged is not, across restarts: a
restarted hostd hashed every image again at its first CreateVM, under the manager's
lock (a 2 GiB disk: 1.4 CPU-s from the page cache, ~13 s from the disk). The change
time is not part of it: libvirt's DAC driver may chown a backing file to QEMU's user
at every start, which moves it without a byte written.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from pathlib import Path

from api.bounds import check_image
from api.jsonmodel import SchemaError, from_jsonable, to_jsonable
from hostd.domain.image import Image
from hostd.errors import BadImage, UnknownImage

log = logging.getLogger(__name__)

VERIFIED = "verified.json"


def _is_name(name: str) -> bool:
    try:
        check_image(name)  # the bound of CreateVM.image too: one rule for an image name
    except ValueError:
        return False
    return True


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _stamp(st: os.stat_result, sha256: str) -> list:
    """What ``verified.json`` keeps of a file whose checksum matched."""
    return [st.st_ino, st.st_size, st.st_mtime_ns, sha256]


def matching_stamp(path: Path, sha256: str, seen: list | None) -> list | None:
    """The file's stamp if its content has ``sha256``, else None; hashed only when
    ``seen`` (the stamp kept from its last match) is not the file's stamp now: the same
    inode, size and modification time, and the same checksum asked. Raises OSError
    when the file cannot be read."""
    stamp = _stamp(path.stat(), sha256)
    if seen == stamp:
        return stamp
    return stamp if sha256_file(path) == sha256 else None


def read_stamps(path: Path) -> dict[str, list]:
    """The stamps kept at ``path`` (role -> ``matching_stamp``'s answer); none when it is
    missing or unreadable (every file is then hashed)."""
    try:
        got = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return got if isinstance(got, dict) else {}


def keep_stamps(path: Path, stamps: dict[str, list]) -> None:
    """Write the stamps to ``path`` atomically (processes and threads sharing a directory
    each write a temporary file of their own)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}")
    try:
        tmp.write_text(json.dumps(stamps) + "\n")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


class ImageStore:
    def __init__(self, root: Path):
        self.root = root
        self._lock = threading.Lock()

    def add(self, name: str, version: str, kind: str, files: dict[str, Path], *,
            cmdline: str = "", fmt: str = "raw", profiles: tuple[str, ...] = (),
            capabilities: dict[str, bool] | None = None) -> Image:
        if not _is_name(name):
            raise BadImage("use 1-64 of a-z, 0-9, '_', '.', '-'", field="image.name")
        need = {"kernel": {"kernel"}, "disk": {"disk"}}.get(kind)
        if need is None:
            raise BadImage("must be kernel or disk", field="image.kind")
        if not need <= files.keys():
            raise BadImage(f"a {kind} image needs files {sorted(need)}", field="image.files")
        for role, p in files.items():
            if not p.is_file():
                raise BadImage(f"{p} is not a file", field=f"image.files.{role}")
        stats = {r: p.stat() for r, p in files.items()}  # before the hash: a write meanwhile shows
        img = Image(name, version, kind, {r: str(p.resolve()) for r, p in files.items()},
                    {r: sha256_file(p) for r, p in files.items()}, cmdline, fmt, profiles,
                    capabilities=dict(capabilities or {}))
        d = self.root / name
        d.mkdir(parents=True, exist_ok=True)
        keep_stamps(d / VERIFIED, {r: _stamp(st, img.sha256[r]) for r, st in stats.items()})
        tmp = d / "manifest.json.tmp"
        tmp.write_text(json.dumps(to_jsonable(img), indent=2) + "\n")
        tmp.replace(d / "manifest.json")
        return img

    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.parent.name for p in self.root.glob("*/manifest.json"))

    def get(self, name: str, *, field: str = "image") -> Image:
        """The image, its files verified; UnknownImage / BadImage name ``field``."""
        path = self.root / name / "manifest.json"
        if not _is_name(name) or not path.is_file():
            known = ", ".join(self.names()) or "none"
            raise UnknownImage(f"no image {name[:80]!r} in {self.root} (known: {known})", field=field)
        try:
            img = from_jsonable(Image, json.loads(path.read_text()), "manifest")
        except (ValueError, SchemaError) as e:
            raise BadImage(f"{path}: {e}", field=field) from None
        with self._lock:
            record = read_stamps(self.root / name / VERIFIED)
            kept = dict(record)
            for role, file in img.files.items():
                try:
                    stamp = matching_stamp(Path(file), img.sha256.get(role, ""), record.get(role))
                except OSError as e:
                    raise BadImage(f"{name}: {role} file {file}: {e.strerror}", field=field) from None
                if stamp is None:
                    raise BadImage(f"{name}: {role} file {file} does not match its sha256", field=field)
                kept[role] = stamp
            if kept != record:
                try:
                    keep_stamps(self.root / name / VERIFIED, kept)
                except OSError as e:  # verified all the same; only the next start hashes again
                    log.warning("cannot record verified checksums image=%s: %s", name, e)
        return img
