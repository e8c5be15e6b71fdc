"""A small file system a test can fill: the real ENOSPC a full disk gives (root: mount)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def small_tmpfs(mnt: Path, size: str = "4m") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted on ``mnt`` (made), lazily unmounted afterwards."""
    mnt.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "hyb-test-small", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


def fill(fs: Path) -> Path:
    """Fills ``fs`` to its last byte with one file (unbuffered, so nothing is left to a
    close that would fail); returns the file, whose removal gives the space back."""
    ballast = fs / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 16, 512):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
    finally:
        os.close(fd)
    return ballast
