"""Errors with an actionable message (what is missing, and the command that fixes it)."""

from __future__ import annotations


class KvmUtilsError(Exception):
    """A user-facing failure; `main()` prints it and exits 2."""


class NotAvailable(KvmUtilsError):
    """A capability this command needs is missing on this host."""
