"""The host's carve lock: one file in ``state_dir`` that every process acting on this
host's carve takes, `hostd serve` and the `hostd` command line alike.

- exclusive: a carve or an uncarve (the Carve and Uncarve RPCs, `hostd carve`,
  `hostd uncarve`). The holder writes who it is into the file, for the message of a
  caller that waited in vain.
- shared: what must not run under a carve but may run beside its own kind: planning a
  carve (it reads the host), and the daemon's VM changes (create, start, stop, update,
  delete, reconcile), so the VM check a carve made cannot go stale before it runs,
  whichever process carves.

``flock(2)``: a lock dies with its process (a hostd killed mid-carve leaves no stale
lock, and its journal is undone or finished by the next carve), and it binds open file
descriptions, not processes, so two threads of one daemon exclude each other too.
A wait is bounded: past it, ``CarveBusy`` names the holder.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

from hostd.errors import CarveBusy

log = logging.getLogger(__name__)

LOCK_NAME = "carve.lock"
POLL_S = 0.05


class HostLock:
    def __init__(self, state_dir: Path):
        self.path = state_dir / LOCK_NAME

    @contextlib.contextmanager
    def exclusive(self, what: str, *, wait_s: float) -> Iterator[None]:
        """Held for ``what`` (a carve, an uncarve), waiting up to ``wait_s`` seconds."""
        with self._held(fcntl.LOCK_EX, what, wait_s) as fd:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()}: {what}\n".encode(), 0)
            try:
                yield
            finally:
                os.ftruncate(fd, 0)

    @contextlib.contextmanager
    def shared(self, what: str, *, wait_s: float) -> Iterator[None]:
        with self._held(fcntl.LOCK_SH, what, wait_s):
            yield

    def holder(self) -> str:
        """Who holds it exclusively, as the holder wrote it ("" if nobody says)."""
        try:
            return self.path.read_text().strip()
        except OSError:
            return ""

    @contextlib.contextmanager
    def _held(self, mode: int, what: str, wait_s: float) -> Iterator[int]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            self._acquire(fd, mode, what, wait_s)
            try:
                yield fd
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def _acquire(self, fd: int, mode: int, what: str, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        logged = False
        while True:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                pass
            if time.monotonic() >= deadline:
                held = self.holder() or "VM changes or a carve plan in progress"
                raise CarveBusy(f"{what}: the host's carve lock {self.path} is held ({held}); "
                                f"waited {wait_s:g} s", field="carve.lock")
            if not logged:
                log.info("waiting for the carve lock what=%r holder=%r", what, self.holder())
                logged = True
            time.sleep(POLL_S)
