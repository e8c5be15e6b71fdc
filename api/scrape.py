"""Where Prometheus scrapes a hostd: the one rule for a metrics URL, which hostd checks
when it loads its config and the scheduler when a host registers (so a URL hostd starts
with is one the scheduler stores, and lists for Prometheus's service discovery)."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

_NETLOC = re.compile(r"^(?:\[[0-9A-Fa-f:.]{2,45}\]|[A-Za-z0-9_.-]{1,253}):([0-9]{1,5})$")
_PATH = re.compile(r"^/[A-Za-z0-9/_.~-]{0,200}$")


def check_metrics_url(v: str) -> str:
    """``http(s)://host:port/path`` (IPv6 hosts in brackets), what a Prometheus scrape
    target is made of: no user, query or fragment, an explicit port (1-65535)."""
    u = urlsplit(v)
    if u.scheme not in ("http", "https"):
        raise ValueError(f"scheme must be http or https, not {u.scheme or 'none'!r}")
    m = _NETLOC.match(u.netloc)
    if not m or not 0 < int(m.group(1)) < 65536:
        raise ValueError(f"{u.netloc!r} is not host:port (port 1-65535, IPv6 in brackets)")
    if not _PATH.match(u.path or "/") or u.query or u.fragment or "?" in v or "#" in v:
        raise ValueError(f"path {u.path!r} must be /... without query or fragment")
    return f"{u.scheme}://{u.netloc}{u.path or '/metrics'}"
