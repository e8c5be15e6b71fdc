"""Name the OS thread behind a Python thread, so ``top -H``, ``ps -L`` and
``/proc/<pid>/task/*/comm`` show which thread burns the CPU (Python 3.11 leaves every
thread named after the process)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

_PR_SET_NAME = 15


@functools.cache
def _libc() -> ctypes.CDLL:
    """libc, loaded on first use (not at import)."""
    return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def name_this_thread(name: str) -> None:
    """Linux keeps 15 bytes of it; a failure is ignored (the name is a diagnostic)."""
    _libc().prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
