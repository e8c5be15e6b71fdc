"""The free-capacity index: which hosts could take a VM, found without scanning the fleet.

Pure and in memory (no IO, no clock). Every schedulable host sits in one group keyed by
its total free dedicated CPUs ``f`` (the pack/spread order) and a small *capacity key*:

    (pools, max free CPUs on one node, max free GiB of 2 MiB pages on one node (floor),
     max free 1 GiB pages on one node, min(4, max free local VFs), min(4, max free local disks))

(whole GiB: exact for the usual whole-GiB requests, and monotone, which is all the
certainty argument below needs). A request turns into the same
tuple of needs; a group qualifies when every component covers the need. That is a
necessary condition for ``fit_host`` (all of a non-spanned VM lives on one node), so the
walk — groups in ``f`` order, names ascending inside, merged across qualifying keys —
visits exactly the hosts ``fit_vm`` would accept, in ``fit_vm``'s order, and returns the
same candidates (a property test checks it against the full scan). A request typically
examines a handful of hosts; groups are few (hosts of one shape and fill share a key).

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
from dataclasses import dataclass

from scheduler.fit import Candidate, FitResult, HostView, Rejection, VmWant, fit_host, fit_vm

CAP = 4  # VF and disk counts in the key saturate here (requests rarely ask for more)
_POOL_BIT = {2048: 1, 1048576: 2}


def quantize(pages_2m: int) -> int:
    """Whole GiB of 2 MiB pages, floored: monotone (x >= y implies quantize(x) >= quantize(y))."""
    return max(pages_2m, 0) // 512


NodeKey = tuple[int, int, int, int, int]  # free CPUs, GiB of 2 MiB pages, 1 GiB pages, VFs, disks
Key = tuple[int, tuple[NodeKey, ...]]  # (pools bitmask, one NodeKey per node)
Need = tuple[int, NodeKey, bool]  # (pool bit, per-node needs, memory need is exact in the key's units)
_RESOURCE = ("vcpus", "memory", "vfs", "disks")


def capacity_key(h: HostView) -> Key:
    res, u = h.res, h.usage
    free_vf = {p.name: sum(1 for s in p.slots if (p.name, s) not in u.vfs) for p in res.pfs}
    pools = 0
    nodes = []
    for n in res.nodes:
        t2, t1 = n.pages(2048), n.pages(1048576)
        pools |= (1 if t2 else 0) | (2 if t1 else 0)
        vfs = sum(free_vf[p.name] for p in res.pfs if p.node is None or p.node == n.node)
        disks = sum(1 for d in res.disks if (d.node is None or d.node == n.node) and d.name not in u.disks)
        nodes.append((h.free_by_node[n.node], quantize(t2 - u.pages.get((n.node, 2048), 0)),
                      max(t1 - u.pages.get((n.node, 1048576), 0), 0), min(vfs, CAP), min(disks, CAP)))
    return pools, tuple(nodes)


def need_key(want: VmWant) -> Need:
    two = want.page_size_kb == 2048
    node = (want.vcpus, quantize(want.pages) if two else 0, 0 if two else want.pages,
            min(len(want.vfs), CAP), min(len(want.disks), CAP))
    return _POOL_BIT.get(want.page_size_kb, 0), node, not two or want.pages % 512 == 0


def _covers(n: NodeKey, w: NodeKey) -> bool:
    return n[0] >= w[0] and n[1] >= w[1] and n[2] >= w[2] and n[3] >= w[3] and n[4] >= w[4]


def qualifies(key: Key, need: Need, span: bool) -> bool:
    if not key[0] & need[0]:
        return False
    if span:  # CPUs/pages may come from several nodes: only the total (the group's f) bounds it
        return True
    return any(_covers(n, need[1]) for n in key[1])


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


class FleetIndex:
    """Not thread-safe by itself: the owner (HostCache) serialises access."""

    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}
        self._groups: dict[int, dict[Key, list[str]]] = {}
        self._fs: list[int] = []  # sorted f values that have groups
        self._top: dict[int, Key | None] = {}  # per f: componentwise max of its keys (None = recompute)
        self._why: dict[tuple[VmWant, str], tuple[int, str]] = {}  # memoised per host generation

    def __len__(self) -> int:
        return len(self.entries)

    # ------------------------------------------------------------ maintenance

    def put(self, view: HostView, *, generation: int, layout_rev: int) -> None:
        self.remove(view.res.name)
        e = Entry(view, generation, layout_rev)
        if view.schedulable:
            e.f, e.key = view.free_cpus, capacity_key(view)
            g = self._groups.get(e.f)
            if g is None:
                g = self._groups[e.f] = {}
                insort(self._fs, e.f)
            insort(g.setdefault(e.key, []), view.res.name)
            if e.f in self._top and self._top[e.f] is not None:
                self._top[e.f] = _join(self._top[e.f], e.key)  # type: ignore[arg-type]
        self.entries[view.res.name] = e

    def remove(self, name: str) -> None:
        e = self.entries.pop(name, None)
        if e is None or e.key is None:
            return
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
        if want.policy == "pack":
            yield from self._fs[i:]
        else:
            yield from reversed(self._fs[i:])

    def walk(self, want: VmWant, *, avoid_hosts: frozenset[str] = frozenset(),
             avoid_racks: frozenset[str] = frozenset(), skip: frozenset[str] = frozenset(),
             limit: int = 1) -> tuple[FitResult, dict[str, int]]:
        """The first ``limit`` candidates in ``fit_vm`` order, the rejections of the hosts
        examined, and (only when there is no candidate) all rejections counted per resource."""
        need, span = need_key(want), want.allow_span_nodes
        sign = 1 if want.policy == "pack" else -1
        cands: list[Candidate] = []
        rejs: list[Rejection] = []
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
            if not lists:
                continue
            for name in (heapq.merge(*lists) if len(lists) > 1 else list(lists[0])):
                if name in skip:
                    continue
                got = fit_host(self.entries[name].view, want, avoid_hosts=avoid_hosts, avoid_racks=avoid_racks)
                if isinstance(got, Rejection):
                    rejs.append(got)
                    continue
                cands.append(Candidate(name, got, (sign * (f - want.vcpus), name)))
                if len(cands) >= limit:
                    return FitResult(tuple(cands), tuple(rejs), len(cands) + len(rejs)), {}
        res = FitResult(tuple(cands), tuple(rejs), len(cands) + len(rejs))
        if cands:
            return res, {}
        return res, self._count(want, res, avoid_hosts, avoid_racks, skip)

    def _count(self, want: VmWant, walked: FitResult, avoid_hosts: frozenset[str],
               avoid_racks: frozenset[str], skip: frozenset[str]) -> dict[str, int]:
        if want.labels or avoid_hosts or avoid_racks or skip or want.allow_span_nodes:
            views = [v for v in self.views() if v.res.name not in skip]
            return fit_vm(views, want, avoid_hosts=avoid_hosts, avoid_racks=avoid_racks, explain=True).counts
        need = need_key(want)
        c: Counter[str] = Counter(r.resource for r in walked.rejections)
        c["state"] += sum(1 for e in self.entries.values() if e.key is None)
        for f, groups in self._groups.items():
            for key, names in groups.items():
                if f >= want.vcpus and qualifies(key, need, False):
                    continue  # walked: counted from the walk
                why = certain_reason(key, need)
                if why is not None:
                    c[why] += len(names)
                    continue
                for name in names:
                    c[self._reason(want, name)] += 1
        c = Counter({k: v for k, v in c.items() if v})
        return dict(sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))

    def _reason(self, want: VmWant, name: str) -> str:
        e = self.entries[name]
        got = self._why.get((want, name))
        if got is not None and got[0] == e.generation:
            return got[1]
        r = fit_host(e.view, want)
        why = r.resource if isinstance(r, Rejection) else "vcpus"  # fits: cannot happen here
        if len(self._why) > 200_000:
            self._why.clear()
        self._why[(want, name)] = (e.generation, why)
        return why
