"""The free-capacity index: which hosts could take a VM, found without scanning the fleet.

Pure and in memory (no IO, no clock). Every schedulable host has a *capacity key*: its
hugepage pools and, per NUMA node, a ``NodeKey`` (``fit.HostView.node_keys``):

    (free CPUs, free GiB of 2 MiB pages (floor), free 1 GiB pages,
     min(4, free local VFs), min(4, free local disks))

(whole GiB: exact for the usual whole-GiB requests, and monotone, which is all the
certainty argument below needs). A request turns into the same tuple of needs
(``fit.need_of``); a node *covers* it when every component does. That is a necessary
condition for ``fit_host`` (all of a non-spanned VM lives on one node). Two views:

- ``pack`` (the default, best fit on the node): every node of every host sits in a group
  keyed by its free CPUs ``x`` and its NodeKey. The walk visits ``x`` ascending from the
  request's vCPUs, merges the names of the covering groups, and meets each host first at
  its *hole* (``HostView.hole``), which is exactly ``fit_vm``'s order for pack.
- ``spread`` and spanned requests: hosts grouped by total free CPUs ``f`` and the whole
  capacity key, ``f`` descending (spread) or ascending (spanned pack).

A 2 MiB pack request may carry ``keep_1g`` (set by ``hint`` from the recent demand the
index counts in ``note``): then the pack walk takes two passes, nodes without free 1 GiB
pages first, as ``fit.order_key`` ranks them.

Either walk returns exactly ``fit_vm``'s candidates (a property test checks it against
the full scan on random fleets). A request typically examines a handful of hosts; groups
are few (hosts of one shape and fill share a key).

When nothing fits, rejections are still counted per resource as ``fit_vm(explain=True)``
would count them, without fitting every host: a non-qualifying group's reason is certain
when it fails on the pool (``page_size``), on CPUs (``vcpus``, exact) or on memory (the
quantisation is monotone, so ``q(free) < q(need)`` proves the shortage on every node);
only groups excluded by the VF/disk components are fitted host by host (memoised per host
generation). Requests with labels, anti-affinity or exclusions fall back to the full scan
for the counts (rare, and the reasons depend on per-host data the key does not hold).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace

from scheduler.fit import (CAP, Candidate, FitResult, HostView, NodeKey, Rejection, VmWant, covers, fit_host,
                           fit_vm, kept, need_of, order_key, quantize)

__all__ = ["CAP", "DEMAND_WINDOW", "FleetIndex", "quantize"]

DEMAND_WINDOW = 2000  # requests: the horizon of the demand ``FleetIndex.hint`` expects

_POOL_BIT = {2048: 1, 1048576: 2}
Key = tuple[int, tuple[NodeKey, ...]]  # (pools bitmask, one NodeKey per node)
Need = tuple[int, NodeKey, bool]  # (pool bit, per-node needs, memory need is exact in the key's units)
_RESOURCE = ("vcpus", "memory", "vfs", "disks")


def _members(names: list[str], few: frozenset[str]) -> list[str]:
    """The elements of ``few`` in the sorted list ``names``."""
    out = []
    for n in few:
        i = bisect_left(names, n)
        if i < len(names) and names[i] == n:
            out.append(n)
    return out


def capacity_key(h: HostView) -> Key:
    pools = 0
    for n in h.res.nodes:
        pools |= (1 if n.pages(2048) else 0) | (2 if n.pages(1048576) else 0)
    return pools, h.node_keys


def need_key(want: VmWant) -> Need:
    return (_POOL_BIT.get(want.page_size_kb, 0), need_of(want),
            want.page_size_kb != 2048 or want.pages % 512 == 0)


def qualifies(key: Key, need: Need, span: bool) -> bool:
    if not key[0] & need[0]:
        return False
    if span:  # CPUs/pages may come from several nodes: only the total (the group's f) bounds it
        return True
    return any(covers(n, need[1]) for n in key[1])


def certain_reason(key: Key, need: Need) -> str | None:
    """The resource ``fit_host`` names for every host of a non-qualifying group, or None
    when only fitting each host tells (no labels/anti-affinity; not spanned). Per node the
    first short component decides, as in ``fit_host``; it is certain when every earlier
    component certainly passed (CPUs are exact; memory is exact for whole-GiB requests;
    a VF count that suffices may still lack bandwidth)."""
    if not key[0] & need[0]:
        return "page_size"
    w, exact_mem = need[1], need[2]
    worst = 0
    for n in key[1]:
        if n[0] < w[0]:
            order = 0
        elif n[1] < w[1] or n[2] < w[2]:
            order = 1
        elif n[3] < w[3] and exact_mem:
            order = 2
        elif n[4] < w[4] and exact_mem and not w[3]:
            order = 3
        else:
            return None
        worst = max(worst, order)
    return _RESOURCE[worst]


def _join(a: Key, b: Key) -> Key:
    """One-node key covering every node of both (a necessary condition for either)."""
    nodes = a[1] + b[1]
    return a[0] | b[0], (tuple(max(n[i] for n in nodes) for i in range(5)),)  # type: ignore[return-value]


@dataclass
class Entry:
    view: HostView
    generation: int
    layout_rev: int
    f: int = 0
    key: Key | None = None  # None: not schedulable (not in any group)
    nodes: frozenset[NodeKey] = frozenset()  # its distinct node keys (the pack groups it is in)


class FleetIndex:
    """Not thread-safe by itself: the owner (HostCache) serialises access."""

    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}
        self._groups: dict[int, dict[Key, list[str]]] = {}
        self._fs: list[int] = []  # sorted f values that have groups
        self._top: dict[int, Key | None] = {}  # per f: componentwise max of its keys (None = recompute)
        # want -> host -> (generation, reason), memoised per host generation; keyed by the
        # want first so a count hashes the (many-field) want once, not once per host
        self._why: dict[VmWant, dict[str, tuple[int, str]]] = {}
        self._by_x: dict[int, dict[NodeKey, list[str]]] = {}  # pack: node free CPUs -> node key -> hosts
        self._xs: list[int] = []  # sorted x values that have groups
        self._xtop: dict[int, NodeKey | None] = {}  # per x: componentwise max of its node keys
        self._unschedulable: set[str] = set()  # entries with no key (the 507's "state" count)
        self._free_cpus = 0  # over schedulable entries, for ``hint``
        self._seen = self._seen_vcpus = self._seen_1g = 0.0  # decayed request counts (``note``)
        self._probe: NodeKey | None = None  # the need of the latest 1 GiB request

    def __len__(self) -> int:
        return len(self.entries)

    # ------------------------------------------------------------ maintenance

    def put(self, view: HostView, *, generation: int, layout_rev: int) -> None:
        self.remove(view.res.name)
        e = Entry(view, generation, layout_rev)
        if not view.schedulable:
            self._unschedulable.add(view.res.name)
        else:
            e.f, e.key = view.free_cpus, capacity_key(view)
            self._free_cpus += e.f
            g = self._groups.get(e.f)
            if g is None:
                g = self._groups[e.f] = {}
                insort(self._fs, e.f)
            insort(g.setdefault(e.key, []), view.res.name)
            if e.f in self._top and self._top[e.f] is not None:
                self._top[e.f] = _join(self._top[e.f], e.key)  # type: ignore[arg-type]
            e.nodes = frozenset(e.key[1])
            for nk in e.nodes:
                gx = self._by_x.get(nk[0])
                if gx is None:
                    gx = self._by_x[nk[0]] = {}
                    insort(self._xs, nk[0])
                    self._xtop[nk[0]] = nk
                elif (top := self._xtop.get(nk[0])) is not None:  # None: stale, recomputed on use
                    self._xtop[nk[0]] = tuple(max(a, b) for a, b in zip(top, nk))  # type: ignore[assignment]
                insort(gx.setdefault(nk, []), view.res.name)
        self.entries[view.res.name] = e

    def remove(self, name: str) -> None:
        e = self.entries.pop(name, None)
        if e is None or e.key is None:
            self._unschedulable.discard(name)
            return
        self._free_cpus -= e.f
        for nk in e.nodes:
            gx = self._by_x[nk[0]]
            names = gx[nk]
            del names[bisect_left(names, name)]
            if not names:
                del gx[nk]
                self._xtop[nk[0]] = None
                if not gx:
                    del self._by_x[nk[0]]
                    self._xtop.pop(nk[0], None)
                    del self._xs[bisect_left(self._xs, nk[0])]
        g = self._groups[e.f]
        names = g[e.key]
        del names[bisect_left(names, name)]
        if not names:
            del g[e.key]
            self._top[e.f] = None
            if not g:
                del self._groups[e.f]
                self._top.pop(e.f, None)
                del self._fs[bisect_left(self._fs, e.f)]

    def views(self) -> list[HostView]:
        return [e.view for e in self.entries.values()]

    # ------------------------------------------------------------ the walk

    def _order(self, want: VmWant) -> Iterator[int]:
        i = bisect_left(self._fs, want.vcpus)  # f < vcpus can never fit
        if want.policy == "pack":  # spanned pack (one-node pack walks the nodes)
            yield from self._fs[i:]
        else:
            yield from reversed(self._fs[i:])

    def walk(self, want: VmWant, *, avoid_hosts: frozenset[str] = frozenset(),
             avoid_racks: frozenset[str] = frozenset(), skip: frozenset[str] = frozenset(),
             limit: int = 1) -> tuple[FitResult, dict[str, int]]:
        """The first ``limit`` candidates in ``fit_vm`` order, the rejections of the hosts
        examined, and (only when there is no candidate) all rejections counted per resource."""
        need, span = need_key(want), want.allow_span_nodes
        cands: list[Candidate] = []
        rejs: list[Rejection] = []
        for name in (self._pack_order(need, want.keep_1g) if want.policy == "pack" and not span
                     else self._host_order(want, need, span)):
            if name in skip:
                continue
            view = self.entries[name].view
            got = fit_host(view, want, avoid_hosts=avoid_hosts, avoid_racks=avoid_racks)
            if isinstance(got, Rejection):
                rejs.append(got)
                continue
            cands.append(Candidate(name, got, order_key(view, want, need[1])))
            if len(cands) >= limit:
                return FitResult(tuple(cands), tuple(rejs), len(cands) + len(rejs)), {}
        res = FitResult(tuple(cands), tuple(rejs), len(cands) + len(rejs))
        if cands:
            return res, {}
        return res, self._count(want, res, avoid_hosts, avoid_racks, skip)

    def _pack_order(self, need: Need, keep_1g: bool = False) -> Iterator[str]:
        """Hosts in (hole, name) order: node groups by free CPUs ascending; a host is met
        first at its fullest covering node, later meetings (other nodes) are skipped.
        ``keep_1g`` (``VmWant.keep_1g``): two passes, nodes with free 1 GiB pages in the
        second, so a host is met first at its fullest covering node without them."""
        w = need[1]
        seen: set[str] = set()
        passes = (False, True) if keep_1g and not w[2] else (None,)
        for second in passes:
            for x in self._xs[bisect_left(self._xs, w[0]):]:
                top = self._x_top(x)
                if not covers(top, w) or (second and not kept(top, w, True)):
                    continue
                lists = [names for nk, names in self._by_x[x].items()
                         if covers(nk, w) and (second is None or kept(nk, w, True) == second)]
                for name in (heapq.merge(*lists) if len(lists) > 1 else list(lists[0]) if lists else ()):
                    if name not in seen:
                        seen.add(name)
                        if self.entries[name].key[0] & need[0]:  # type: ignore[index]  # has the pool
                            yield name

    def _x_top(self, x: int) -> NodeKey:
        """Componentwise max of the node keys with ``x`` free CPUs (cached until one goes)."""
        top = self._xtop.get(x)
        if top is None:
            keys = list(self._by_x[x])
            top = self._xtop[x] = tuple(max(k[i] for k in keys) for i in range(5))  # type: ignore[assignment]
        return top  # type: ignore[return-value]

    # ------------------------------------------------------------ 1 GiB demand

    def note(self, want: VmWant) -> None:
        """Count a request (once per request, not per walk) into the demand ``hint`` uses:
        decayed over about the last ``DEMAND_WINDOW`` requests."""
        d = 1.0 - 1.0 / DEMAND_WINDOW
        one_g = want.page_size_kb == 1048576
        self._seen = self._seen * d + 1.0
        self._seen_vcpus = self._seen_vcpus * d + want.vcpus
        self._seen_1g = self._seen_1g * d + one_g
        if one_g and not want.allow_span_nodes:
            self._probe = need_of(want)

    def hint(self, want: VmWant) -> VmWant:
        """``want`` with ``keep_1g`` set when a 2 MiB VM should leave the nodes with free
        1 GiB pages for last: when the hosts that could still take the latest 1 GiB
        request (``note``) are no more than the 1 GiB VMs still expected, i.e. the 1 GiB
        share of recent requests times the VMs the free CPUs hold at the recent mean size.
        Best fit on CPUs alone lets 2 MiB VMs break those nodes while emptier ones wait
        (bench/packing.py: quality 0.950 / 0.901 -> see scheduler/README.md)."""
        if (want.page_size_kb != 2048 or want.policy != "pack" or want.allow_span_nodes or want.keep_1g
                or self._probe is None or self._seen_1g < 0.5):
            return want
        expected = self._seen_1g / self._seen * self._free_cpus / (self._seen_vcpus / self._seen)
        probe = self._probe
        hosts = 0
        for x in self._xs[bisect_left(self._xs, probe[0]):]:
            if covers(self._x_top(x), probe):
                hosts += sum(len(names) for nk, names in self._by_x[x].items() if covers(nk, probe))
                if hosts > expected:
                    return want
        return replace(want, keep_1g=True)

    def _host_order(self, want: VmWant, need: Need, span: bool) -> Iterator[str]:
        for f in list(self._order(want)):
            top = self._top.get(f)
            if top is None:
                keys = iter(self._groups[f])
                top = _join(next(keys), (0, ()))
                for k in keys:
                    top = _join(top, k)
                self._top[f] = top
            if not qualifies(top, need, span):  # no key of this f can qualify
                continue
            lists = [names for key, names in self._groups[f].items() if qualifies(key, need, span)]
            if lists:
                yield from (heapq.merge(*lists) if len(lists) > 1 else list(lists[0]))

    def _count(self, want: VmWant, walked: FitResult, avoid_hosts: frozenset[str],
               avoid_racks: frozenset[str], skip: frozenset[str]) -> dict[str, int]:
        if want.allow_span_nodes:
            views = [v for v in self.views() if v.res.name not in skip]
            return fit_vm(views, want, avoid_hosts=avoid_hosts, avoid_racks=avoid_racks, explain=True).counts
        need = need_key(want)
        c: Counter[str] = Counter(r.resource for r in walked.rejections)
        c["state"] += len(self._unschedulable) - len(self._unschedulable & skip)  # a scan of every entry was 9 % of the claim thread's CPU
        # Labels and anti-affinity reject a host before its resources are looked at
        # (fit_host's order). Skipped hosts and avoided hosts are few: a group whose reason
        # is certain is counted by its size less its members of them (by bisection in its
        # sorted names). Labels and avoided racks are checked host by host (a dict lookup
        # each). Before, any of these made a 507 fit every host of the fleet (~110-290 ms
        # at 10,000 hosts).
        one_by_one = bool(want.labels or avoid_racks)
        few = skip | avoid_hosts
        memo = self._memo(want)
        pre_checks = bool(want.labels or avoid_hosts or avoid_racks)
        for f, groups in self._groups.items():
            for key, names in groups.items():
                if f >= want.vcpus and qualifies(key, need, False):
                    continue  # walked: counted from the walk
                why = certain_reason(key, need)
                if not one_by_one and why is not None:
                    inside = _members(names, few) if few else ()
                    avoided = sum(1 for n in inside if n not in skip)
                    c[why] += len(names) - len(inside)
                    c["anti_affinity"] += avoided
                    continue
                for name in names:
                    if name in skip:
                        continue
                    pre = self._pre_reason(want, name, avoid_hosts, avoid_racks) if pre_checks else None
                    c[pre or why or self._reason(want, name, memo)] += 1
        c = Counter({k: v for k, v in c.items() if v})
        return dict(sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))

    def _pre_reason(self, want: VmWant, name: str, avoid_hosts: frozenset[str],
                    avoid_racks: frozenset[str]) -> str | None:
        """fit_host's checks before resources, for a schedulable host."""
        res = self.entries[name].view.res
        if want.labels:
            labels = res.label_map
            if any(labels.get(k) != v for k, v in want.labels):
                return "labels"
        if name in avoid_hosts or (res.rack and res.rack in avoid_racks):
            return "anti_affinity"
        return None

    def _memo(self, want: VmWant) -> dict[str, tuple[int, str]]:
        memo = self._why.get(want)
        if memo is None:
            if len(self._why) > 20:  # request shapes; each memo holds at most the fleet
                self._why.clear()
            memo = self._why[want] = {}
        return memo

    def _reason(self, want: VmWant, name: str, memo: dict[str, tuple[int, str]]) -> str:
        e = self.entries[name]
        got = memo.get(name)
        if got is not None and got[0] == e.generation:
            return got[1]
        r = fit_host(e.view, want)
        why = r.resource if isinstance(r, Rejection) else "vcpus"  # fits: cannot happen here
        memo[name] = (e.generation, why)
        return why
