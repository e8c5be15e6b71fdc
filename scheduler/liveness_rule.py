"""Which silent hosts to mark down now: pure (no I/O).

A host silent for longer than the heartbeat timeout is marked down once (its VMs are
flagged). When a large share of one rack, or of the whole fleet, is newly silent at the
same check, that is reported as one event and those hosts are not marked one by one: a
top-of-rack switch, a network partition or the scheduler's own connectivity is the
likelier cause, as Kubernetes' node lifecycle controller treats an unhealthy zone.
Hosts already marked do not count towards an event (it is about what went silent now).

Hosts silenced at one instant do not cross the timeout at one instant: their beats are
spread over a beat interval (and a peer's period), so they cross it over that long, a
few at each check. Judged on the hosts past the timeout alone, the first check saw a
share of them, marked those, and the event came a check or two later (a replica's half of
a fleet, 2026-11-29: 3,546 hosts marked before the fleet's event). So an event also
counts the hosts that have missed a beat but are not past the timeout yet
(``missed``: silent longer than a live host can look, ``missed_beat_after``): the check
that would mark the first of them sees most of the group.
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Rules:
    rack_share: float = 0.5  # newly silent / rack size above this: a rack event
    fleet_share: float = 0.2  # newly silent / fleet size above this: a fleet event
    min_hosts: int = 3  # a rack (or fleet) smaller than this never makes an event


@dataclass(frozen=True)
class Survey:
    """What a liveness check judges from: the hosts silent past the timeout (name ->
    rack), which of them are marked down already, the hosts per rack (the whole fleet),
    and each silent host's recorded ``last_heartbeat`` and its last beat as the shared
    liveness has it (the flag's time)."""
    silent: dict[str, str] = field(default_factory=dict)
    marked: set[str] = field(default_factory=set)
    sizes: dict[str, int] = field(default_factory=dict)
    recorded: dict[str, float] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Judgement:
    mark: list[str] = field(default_factory=list)  # mark down now (sorted)
    held: dict[str, str] = field(default_factory=dict)  # host -> the event that holds it
    events: list[str] = field(default_factory=list)  # what an operator reads, one line each


def judge(silent: dict[str, str], marked: set[str], sizes: dict[str, int], rules: Rules = Rules(),
          missed: dict[str, str] | None = None) -> Judgement:
    """``silent``: host -> rack of every host silent past the timeout; ``marked``: the
    hosts already marked down; ``sizes``: hosts per rack, the whole fleet; ``missed``:
    host -> rack of the hosts that missed a beat (``missed_beat_after``) and are not
    past the timeout yet: never marked, but they count towards an event, which is only
    raised where it holds a host this check would mark."""
    new = {h: r for h, r in silent.items() if h not in marked}
    going = {**{h: r for h, r in (missed or {}).items() if h not in marked}, **new}
    fleet = sum(sizes.values())
    held: dict[str, str] = {}
    events: list[str] = []
    if new and fleet >= rules.min_hosts and len(going) / fleet > rules.fleet_share:
        why = (f"fleet: {len(going)} of {fleet} hosts went silent at once (over {rules.fleet_share:.0%}); "
               "not marked down one by one")
        events.append(why)
        held = dict.fromkeys(new, why)
    else:
        racks = set(new.values())
        for rack, n in sorted(Counter(r for r in going.values() if r in racks).items()):
            size = sizes.get(rack, 0)
            if size >= rules.min_hosts and n / size > rules.rack_share:
                why = (f"rack {rack or '(none)'}: {n} of {size} hosts went silent at once "
                       f"(over {rules.rack_share:.0%}); not marked down one by one")
                events.append(why)
                held.update({h: why for h, r in new.items() if r == rack})
    return Judgement(sorted(h for h in new if h not in held), held, events)


# ------------------------------------------------------------------ shared liveness
#
# Each replica writes, once per period, one row naming the hosts it heard from in that
# period (``scheduler.service.pulse``): a set over the hosts' integer ids (``beat_id``).
# Encoded as the smaller of a zlib'd bitmap (dense: most of the fleet beats every period)
# and a zlib'd list of varint gaps between sorted ids (sparse: a replica that took a few
# beats). A tag byte says which: b"B" or b"D".


def encode_ids(ids: Iterable[int]) -> bytes:
    got = sorted(set(ids))
    if got and got[0] < 0:
        raise ValueError("host ids are >= 0")
    bitmap = bytearray((got[-1] >> 3) + 1 if got else 0)
    for i in got:
        bitmap[i >> 3] |= 1 << (i & 7)
    gaps = bytearray()
    prev = -1
    for i in got:
        d = i - prev - 1
        prev = i
        while d >= 0x80:
            gaps.append((d & 0x7F) | 0x80)
            d >>= 7
        gaps.append(d)
    dense, sparse = zlib.compress(bytes(bitmap), 6), zlib.compress(bytes(gaps), 6)
    return b"B" + dense if len(dense) <= len(sparse) else b"D" + sparse


def decode_ids(blob: bytes) -> list[int]:
    """The sorted ids ``encode_ids`` wrote."""
    tag, raw = blob[:1], zlib.decompress(blob[1:])
    if tag == b"B":
        return [(n << 3) + b for n, byte in enumerate(raw) if byte for b in range(8) if byte >> b & 1]
    if tag != b"D":
        raise ValueError(f"unknown host set encoding {tag!r}")
    out: list[int] = []
    prev, d, shift = -1, 0, 0
    for byte in raw:
        d |= (byte & 0x7F) << shift
        if byte & 0x80:
            shift += 7
            continue
        prev += d + 1
        out.append(prev)
        d, shift = 0, 0
    return out


def silent_allowance(*, period_s: float, flush_s: float) -> float:
    """How much older than its last beat a live host's last beat may look to a replica,
    when the beat went to another replica: that replica's row for the period is written
    at the period's end (plus up to a flush) and read by this one up to a period later.
    (A peer row says "heard by the period's end", at most a period after the beat.) A
    replica that dies takes its unwritten period with it, but the host's next beat goes
    to a live replica: it looks at most a beat interval plus a period old meanwhile.
    So the heartbeat timeout must exceed the beat interval plus this."""
    return 2 * period_s + flush_s


def missed_beat_after(*, interval_s: float, period_s: float, flush_s: float) -> float:
    """How long a live host can look silent: a beat interval (hostd's, ``liveness.
    beat_interval_s``) plus ``silent_allowance``. A host silent longer has missed a beat:
    it counts towards a rack's or the fleet's event (``judge``'s ``missed``) before it is
    past the timeout, which must exceed this."""
    return interval_s + silent_allowance(period_s=period_s, flush_s=flush_s)


def beat_retry_after(*, timeout_s: float, period_s: float, flush_s: float, jitter: float) -> int:
    """The ``Retry-After`` (whole seconds, at least 1) for a beat this replica sheds: the
    shed beat counts (its host's liveness is kept), and the host's next beat, after this
    and up to ``jitter`` more of it (``api.bounds.RETRY_AFTER_JITTER``), still lands
    before the heartbeat timeout less how stale a live host may look
    (``silent_allowance``)."""
    room = timeout_s - silent_allowance(period_s=period_s, flush_s=flush_s)
    return max(1, int(room / (1 + jitter)))


def lag_window(*, missed_beat_s: float, retry_s: float, jitter: float) -> float:
    """How long after its lag (or a shed registration) a replica still judges nothing.
    While it lagged, a beat that reached its socket was recorded late (its host looks
    fresher, not staler); a host whose connection was refused or timed out tries again
    within its beat interval, and a host whose registration was shed within ``retry_s``
    and up to ``jitter`` more of it, then beats. So after a beat interval, the allowance
    for a peer's row (``missed_beat_s``) and a registration's retry, every live host's
    beat is counted again; a longer window only delays the marks (after a replica's
    restart, the peer that carried the fleet judges nothing for that long)."""
    return missed_beat_s + retry_s * (1 + jitter)


def lag_reason(*, loop_lag_s: float, flush_late_s: float, bound_s: float, shed: int = 0) -> str | None:
    """Why this replica must not judge silences now (None: it may): behind on its own
    beats by more than ``bound_s`` (its event loop late to run a timer, or its flush late),
    or turning registrations away (``shed`` of them lately: a host told to register later
    does not beat meanwhile), a host's silence may be this replica's own doing. Shed beats
    are not counted here: they count for their hosts (``service.shed``)."""
    if shed:
        return f"shed {shed} registrations lately (overloaded)"
    if loop_lag_s > bound_s:
        return f"event loop {loop_lag_s:.2f} s late (bound {bound_s:g} s)"
    if flush_late_s > bound_s:
        return f"heartbeat flush {flush_late_s:.2f} s late (bound {bound_s:g} s)"
    return None
