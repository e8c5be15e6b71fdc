"""Test doubles for hardware this machine does not have."""

from __future__ import annotations


class RecordingVfRates:
    """In-memory VF rate table: the netlink test double for hosts without SR-IOV.
    ``einval_min`` mimics drivers (many Intel ones) that refuse min_tx_rate."""

    def __init__(self, rates: dict[tuple[str, int], tuple[int, int]] | None = None,
                 *, einval_min: bool = False):
        self.rates = dict(rates or {})
        self.calls: list[tuple[str, int, int, int]] = []
        self.einval_min = einval_min

    def get_rate(self, pf: str, vf: int) -> tuple[int, int]:
        return self.rates.get((pf, vf), (0, 0))

    def set_rate(self, pf: str, vf: int, max_mbps: int, min_mbps: int) -> None:
        if self.einval_min and min_mbps:
            raise OSError(22, "Invalid argument (driver does not support min_tx_rate)")
        self.calls.append((pf, vf, max_mbps, min_mbps))
        self.rates[(pf, vf)] = (max_mbps, min_mbps)
