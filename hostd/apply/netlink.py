"""SR-IOV VF tx rate limits through rtnetlink (pyroute2), as `ip link set PF vf N
max_tx_rate X min_tx_rate Y` does. No SR-IOV hardware exists on the development
machines: this class is exercised on real hosts only; the carve logic is tested
with an in-memory stand-in for the PF driver (tests/hostd/apply/fakes.py)."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


class NetlinkVfRates:
    def __init__(self) -> None:
        from pyroute2 import IPRoute  # imported here: nothing at import time

        self._ipr = IPRoute()

    def close(self) -> None:
        self._ipr.close()

    def _index(self, pf: str) -> int:
        idx = self._ipr.link_lookup(ifname=pf)
        if not idx:
            raise LookupError(f"no network interface {pf!r}")
        return idx[0]

    def get_rate(self, pf: str, vf: int) -> tuple[int, int]:
        # ext_mask=1 is RTEXT_FILTER_VF: the kernel includes IFLA_VFINFO_LIST.
        (msg,) = self._ipr.get_links(self._index(pf), ext_mask=1)
        vfs = msg.get_attr("IFLA_VFINFO_LIST")
        for info in vfs.get_attrs("IFLA_VF_INFO") if vfs else ():
            rate = info.get_attr("IFLA_VF_RATE")
            if rate and rate["vf"] == vf:
                return rate["max_tx_rate"], rate["min_tx_rate"]
        raise LookupError(f"{pf} has no VF {vf}")

    def set_rate(self, pf: str, vf: int, max_mbps: int, min_mbps: int) -> None:
        self._ipr.link("set", index=self._index(pf),
                       vf={"vf": vf, "rate": {"max_tx_rate": max_mbps, "min_tx_rate": min_mbps}})
        log.info("vf rate set pf=%s vf=%d max_mbps=%d min_mbps=%d", pf, vf, max_mbps, min_mbps)

