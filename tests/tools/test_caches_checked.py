"""``tools.dev.caches.checked_manifest``: a cached image's files against its manifest,
hashed again only when a file changed since its last check."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from tools.dev import caches

from hostd.apply import images


def image(d: Path, body: bytes) -> Path:
    (d / "disk.raw").write_bytes(body)
    (d / "manifest.json").write_text(json.dumps({"files": {"disk": "disk.raw"},
                                                 "sha256": {"disk": hashlib.sha256(body).hexdigest()}}))
    return d


def test_a_file_is_hashed_once_until_it_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = image(tmp_path, b"x" * 4096)
    hashed: list[Path] = []
    real = images.sha256_file
    monkeypatch.setattr(images, "sha256_file", lambda p: hashed.append(p) or real(p))
    caches.checked_manifest(d)
    caches.checked_manifest(d)
    assert hashed == [d / "disk.raw"]  # the second check read the record
    with open(d / "disk.raw", "r+b") as f:  # one byte changed: size and inode as they were
        f.write(b"y")
    os.utime(d / "disk.raw", ns=(0, 1))  # the modification time moved, as any write moves it
    with pytest.raises(AssertionError, match="disk.raw does not match"):
        caches.checked_manifest(d)


def test_a_record_of_another_checksum_is_not_trusted(tmp_path: Path) -> None:
    """A rebuilt image whose file kept its stat (same inode, size and time) but whose
    manifest now names another checksum is hashed again."""
    d = image(tmp_path, b"x" * 4096)
    caches.checked_manifest(d)
    m = json.loads((d / "manifest.json").read_text())
    m["sha256"]["disk"] = "0" * 64
    (d / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(AssertionError, match="does not match"):
        caches.checked_manifest(d)
