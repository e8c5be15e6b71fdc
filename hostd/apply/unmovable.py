"""What a carve could not take from ``io_cpus``, and why: reported by ``hostd carve``
and the Carve RPC, never skipped in silence. Its own module so that the exclusive carve
(``exclusive.py``) and its systemd drop-ins (``systemd_dropins.py``) both report in it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Unmovable:
    what: str
    why: str

    def __str__(self) -> str:
        return f"{self.what}: {self.why}"
