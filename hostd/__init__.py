"""hostd: the host daemon (discover -> carve -> apply -> rpc).

``hostd.__version__`` is the installed distribution's version (setup.cfg
``[metadata] version``), read when first asked for, not at import time.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "hybrid-kvm"


def package_version() -> str:
    """The version of the installed hybrid-kvm distribution ("0+unknown" when run from a
    tree that was never installed)."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "0+unknown"


def __getattr__(name: str) -> str:
    if name == "__version__":
        return package_version()
    raise AttributeError(f"module 'hostd' has no attribute {name!r}")
