"""The image store's checksums: verified once per version of a file, across restarts
(``verified.json``), and again whenever the file changed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hostd.apply import images
from hostd.apply.images import VERIFIED, ImageStore
from hostd.errors import BadImage


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files hashed, by name, in order."""
    seen: list[str] = []
    real = images.sha256_file
    monkeypatch.setattr(images, "sha256_file", lambda p: seen.append(Path(p).name) or real(p))
    return seen


def added(tmp_path: Path) -> tuple[ImageStore, Path]:
    kernel = tmp_path / "vmlinuz"
    kernel.write_bytes(b"k" * 4096)
    store = ImageStore(tmp_path / "images")
    store.add("smoke", "1", "kernel", {"kernel": kernel})
    return store, kernel


def test_add_records_what_it_hashed_and_a_restarted_store_trusts_it(tmp_path: Path, hashed: list[str]) -> None:
    _store, _kernel = added(tmp_path)
    assert hashed == ["vmlinuz"]  # add's own checksum
    restarted = ImageStore(tmp_path / "images")  # a hostd started again
    restarted.get("smoke")
    restarted.get("smoke")
    assert hashed == ["vmlinuz"]


def test_a_file_written_since_is_hashed_again_and_refused(tmp_path: Path, hashed: list[str]) -> None:
    store, kernel = added(tmp_path)
    with open(kernel, "r+b") as f:  # one byte: the same inode and size
        f.write(b"x")
    os.utime(kernel, ns=(0, 1))  # a write moves the modification time (coarse clocks may not, here)
    with pytest.raises(BadImage, match="kernel file .* does not match its sha256"):
        ImageStore(tmp_path / "images").get("smoke")
    with pytest.raises(BadImage):
        store.get("smoke")  # still refused: a mismatch is never recorded
    assert hashed == ["vmlinuz"] * 3


def test_a_replaced_file_is_hashed_again_and_then_trusted(tmp_path: Path, hashed: list[str]) -> None:
    """The same bytes in a new file (a copy over the old one): another inode, hashed once."""
    store, kernel = added(tmp_path)
    (tmp_path / "copy").write_bytes(kernel.read_bytes())
    (tmp_path / "copy").replace(kernel)
    store.get("smoke")
    store.get("smoke")
    assert hashed == ["vmlinuz", "vmlinuz"]


def test_a_record_made_for_another_checksum_is_not_trusted(tmp_path: Path, hashed: list[str]) -> None:
    """The manifest changed (the image added again with other files' sums, or edited by
    hand) while the file kept its inode, size and time: the record no longer names the
    checksum the manifest asks for."""
    _store, _kernel = added(tmp_path)
    manifest = tmp_path / "images/smoke/manifest.json"
    m = json.loads(manifest.read_text())
    m["sha256"]["kernel"] = "0" * 64
    manifest.write_text(json.dumps(m))
    with pytest.raises(BadImage, match="does not match"):
        ImageStore(tmp_path / "images").get("smoke")


def test_a_record_that_cannot_be_written_costs_only_a_hash(tmp_path: Path, hashed: list[str]) -> None:
    store, _kernel = added(tmp_path)
    (tmp_path / "images/smoke" / VERIFIED).unlink()
    (tmp_path / "images/smoke" / VERIFIED).mkdir()  # unreadable as a record, unwritable as a file
    store.get("smoke")
    assert hashed == ["vmlinuz", "vmlinuz"]
    assert ImageStore(tmp_path / "images").names() == ["smoke"]
