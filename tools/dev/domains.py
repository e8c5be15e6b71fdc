"""Removing the libvirt domains a test or a dev harness made: one rule for the suite's
fixtures, the in-process hostds and the libvirt pair."""

from __future__ import annotations

from typing import Any


def remove_domains(conn: Any, prefix: str = "", *, abort_jobs: bool = False, undefine_flags: int = 0) -> list[str]:
    """Destroy (if running) and undefine (if persistent) every domain on ``conn`` whose
    name starts with ``prefix``; the names removed. ``abort_jobs``: abort a job first (a
    migration still running holds its domain). A transient domain is gone once destroyed,
    so whether it is persistent is asked before."""
    import libvirt

    gone = []
    for dom in conn.listAllDomains():
        name = dom.name()
        if not name.startswith(prefix):
            continue
        persistent = dom.isPersistent()
        if dom.isActive():
            if abort_jobs:
                try:
                    dom.abortJob()
                except libvirt.libvirtError:
                    pass  # no job
            dom.destroy()
        if persistent:
            dom.undefineFlags(undefine_flags)
        gone.append(name)
    return gone


def remove_domains_at(uri: str, prefix: str = "") -> list[str]:
    """``remove_domains`` over a connection of its own to ``uri``."""
    import libvirt

    conn = libvirt.open(uri)
    try:
        return remove_domains(conn, prefix)
    finally:
        conn.close()
