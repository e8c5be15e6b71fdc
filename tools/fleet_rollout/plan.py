"""The plan: which hosts go in which wave. Pure and fast (7,000 hosts well under a second).

Hosts are ordered round-robin over racks (rack by rack, name by name inside one), so
every wave spreads over the failure domains instead of taking a whole rack at once;
the canary is the first host of that order. Wave *i* ends when ``waves.percent[i]`` of
the eligible hosts are in waves 0..i. Hosts whose preflight said they cannot take the
change are listed with the reason and left out, never attempted.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from tools.fleet_rollout.inventory import Host
from tools.fleet_rollout.spec import RolloutSpec, SpecError


@dataclass(frozen=True)
class Plan:
    waves: tuple[tuple[Host, ...], ...]
    skipped: tuple[tuple[Host, str], ...]  # host, why it was left out

    @property
    def hosts(self) -> int:
        return sum(len(w) for w in self.waves)

    def to_dict(self) -> dict:
        return {"waves": [[h.name for h in w] for w in self.waves],
                "skipped": [{"host": h.name, "reason": why} for h, why in self.skipped]}


class FitsNone(SpecError):
    """No selected host can take the change: ``hosts``, their names."""

    def __init__(self, reason: str, hosts: list[str]):
        super().__init__("policy", reason)
        self.hosts = hosts


def rack_order(hosts: list[Host]) -> list[Host]:
    by_rack: dict[str, list[Host]] = defaultdict(list)
    for h in sorted(hosts, key=lambda h: (h.rack, h.name)):
        by_rack[h.rack].append(h)
    racks = [by_rack[r] for r in sorted(by_rack)]
    out: list[Host] = []
    for i in range(max((len(r) for r in racks), default=0)):
        out += [r[i] for r in racks if i < len(r)]
    return out


def wave_sizes(n: int, spec: RolloutSpec) -> list[int]:
    sizes: list[int] = []
    done = 0
    if spec.waves.canary and n:
        sizes.append(min(spec.waves.canary, n))
        done = sizes[0]
    for pct in spec.waves.percent:
        end = min(n, math.ceil(n * pct / 100))
        if end > done:
            sizes.append(end - done)
            done = end
    return sizes


def make_plan(hosts: list[Host], spec: RolloutSpec, refused: Mapping[str, str] | None = None) -> Plan:
    """``refused``: host name -> why its preflight refused it (skipped, with the reason)."""
    refused = refused or {}
    names = [h.name for h in hosts]
    if len(set(names)) != len(names):
        dup = min({n for n in names if names.count(n) > 1})
        raise SpecError("inventory", f"host {dup} is listed twice")
    skipped = tuple((h, refused[h.name]) for h in sorted(hosts, key=lambda h: h.name) if h.name in refused)
    eligible = rack_order([h for h in hosts if h.name not in refused])
    if not eligible:
        why = f"; e.g. {skipped[0][0].name}: {skipped[0][1]}" if skipped else ""
        raise FitsNone(f"fits none of the {len(hosts)} selected hosts{why}", names)
    waves = []
    at = 0
    for size in wave_sizes(len(eligible), spec):
        waves.append(tuple(eligible[at:at + size]))
        at += size
    return Plan(tuple(waves), skipped)
