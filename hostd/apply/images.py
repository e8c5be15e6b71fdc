"""hostd's image store: guest images a VM may name, each with a manifest.

    <image_dir>/<name>/manifest.json
    {"name": "smoke", "version": "6.1.0-56", "kind": "kernel",
     "files": {"kernel": "/var/cache/.../vmlinuz", "initrd": "/var/cache/.../initrd.img"},
     "cmdline": "console=ttyS0", "sha256": {"kernel": "...", "initrd": "..."}}

``kind`` is ``kernel`` (direct kernel boot: kernel + initrd + cmdline) or ``disk``
(a raw/qcow2 root disk: files.disk, ``format``). Checksums are verified the first
time an image is used by this process and whenever a file's mtime changes, so a
replaced file is noticed before a VM boots from it.
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

from api.bounds import check_image
from api.jsonmodel import SchemaError, from_jsonable, to_jsonable
from hostd.domain.image import Image
from hostd.errors import BadImage, UnknownImage

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


class ImageStore:
    def __init__(self, root: Path):
        self.root = root
        self._verified: dict[tuple[str, str], float] = {}  # (image, role) -> mtime verified
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
        img = Image(name, version, kind, {r: str(p.resolve()) for r, p in files.items()},
                    {r: sha256_file(p) for r, p in files.items()}, cmdline, fmt, profiles,
                    capabilities=dict(capabilities or {}))
        d = self.root / name
        d.mkdir(parents=True, exist_ok=True)
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
            for role, file in img.files.items():
                p = Path(file)
                try:
                    mtime = p.stat().st_mtime
                except OSError as e:
                    raise BadImage(f"{name}: {role} file {file}: {e.strerror}", field=field) from None
                if self._verified.get((name, role)) == mtime:
                    continue
                if sha256_file(p) != img.sha256.get(role):
                    raise BadImage(f"{name}: {role} file {file} does not match its sha256", field=field)
                self._verified[(name, role)] = mtime
        return img
