"""Which silent hosts to mark down now: pure (no I/O).

A host silent for longer than the heartbeat timeout is marked down once (its VMs are
flagged). When a large share of one rack, or of the whole fleet, is newly silent at the
same check, that is reported as one event and those hosts are not marked one by one: a
top-of-rack switch, a network partition or the scheduler's own connectivity is the
likelier cause, as Kubernetes' node lifecycle controller treats an unhealthy zone.
Hosts already marked do not count towards an event (it is about what went silent now).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Rules:
    rack_share: float = 0.5  # newly silent / rack size above this: a rack event
    fleet_share: float = 0.2  # newly silent / fleet size above this: a fleet event
    min_hosts: int = 3  # a rack (or fleet) smaller than this never makes an event


@dataclass(frozen=True)
class Judgement:
    mark: list[str] = field(default_factory=list)  # mark down now (sorted)
    held: dict[str, str] = field(default_factory=dict)  # host -> the event that holds it
    events: list[str] = field(default_factory=list)  # what an operator reads, one line each


def judge(silent: dict[str, str], marked: set[str], sizes: dict[str, int], rules: Rules = Rules()) -> Judgement:
    """``silent``: host -> rack of every host silent past the timeout; ``marked``: the
    hosts already marked down; ``sizes``: hosts per rack, the whole fleet."""
    new = {h: r for h, r in silent.items() if h not in marked}
    fleet = sum(sizes.values())
    held: dict[str, str] = {}
    events: list[str] = []
    if fleet >= rules.min_hosts and len(new) / fleet > rules.fleet_share:
        why = (f"fleet: {len(new)} of {fleet} hosts went silent at once (over {rules.fleet_share:.0%}); "
               "not marked down one by one")
        events.append(why)
        held = dict.fromkeys(new, why)
    else:
        for rack, n in sorted(Counter(new.values()).items()):
            size = sizes.get(rack, 0)
            if size >= rules.min_hosts and n / size > rules.rack_share:
                why = (f"rack {rack or '(none)'}: {n} of {size} hosts went silent at once "
                       f"(over {rules.rack_share:.0%}); not marked down one by one")
                events.append(why)
                held.update({h: why for h, r in new.items() if r == rack})
    return Judgement(sorted(h for h in new if h not in held), held, events)
