"""Pure NUMA-aware fitting: hosts + usage + one VM request -> ranked candidates with
exact resources, or per-host rejections that name the short resource.

No IO, no clock, no randomness: the same input gives the same output whatever order
the hosts come in (ties break on host name, then node id, then CPU id).

Rules:
- everything on one NUMA node (CPUs, hugepages, VFs from node-local PFs, node-local
  disks) unless the request sets ``allow_span_nodes``; a PF or disk without reported
  affinity (node None) is local to every node;
- CPUs only from the layout's ``vm_cpus`` (IO-service and host CPUs are not in the
  model at all); whole SMT cores first, the odd remainder from already-split cores so
  whole cores stay whole for the next VM;
- ``pack`` is best fit on the NUMA node: hosts in order of their *hole*
  (``HostView.hole``), the fewest free CPUs on a node that could take the VM (its
  capacity key covers the request, see ``HostView.node_keys``). A VM fills the fullest
  node it fits and big empty nodes stay whole for big VMs (ordering by a host's total
  free CPUs put small VMs on the only 12-CPU nodes while two-node hosts looked emptier;
  scheduler/README.md has the measured packing quality). ``spread`` takes the host with
  the most free CPUs; spanned requests order by the host's total free CPUs under both
  policies. Inside a host, ``pack`` tries the ranked node first, ``spread`` the emptiest;
- spanning (only when no single node fits): one guest NUMA cell per host node used, each
  with vCPUs and memory from its own node, memory in proportion to the vCPUs (``_fit_span``);
- anti-affinity: the caller passes the hosts and racks holding the group's members.

Hosts are walked in score order, so with ``explain=False`` the walk stops after
``limit`` candidates (the claim path); ``explain=True`` (dry run) examines every host
and returns every rejection.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from api import cpus as cpus_rule
from api.states import HostState
from scheduler.resources import Allocation, DiskAlloc, DiskRes, HostRes, NodeRes, Usage, VfAlloc

PAGE_SIZES_KB = (2048, 1048576)
CAP = 4  # VF and disk counts in a node key saturate here (requests rarely ask for more)
POLICIES = ("pack", "spread")
# Check order on a node; a host's rejection names the resource its best node was short of.
_ORDER = {"vcpus": 0, "memory": 1, "vfs": 2, "disks": 3}


@dataclass(frozen=True)
class VfWant:
    pf: str = ""  # "" = any node-local PF
    max_tx_rate_mbps: int = 0
    min_tx_rate_mbps: int = 0  # a guarantee: reserved from the PF's tx budget


@dataclass(frozen=True)
class DiskWant:
    disk: str = ""  # kernel name or stable id; "" = any free disk of ``cls``
    cls: str = ""
    min_size_bytes: int = 0
    bytes_sec: int = 0  # the VM's throttle (total_bytes_sec); must fit the disk's budget
    iops: int = 0
    atomic_write_bytes: int = 0  # the guest must write this many bytes whole (0 = no need)
    exact_size_bytes: int = 0  # exactly this size (a live move's target: NBD copies to an equal size)


@dataclass(frozen=True)
class VmWant:
    vcpus: int
    memory_mib: int
    page_size_kb: int = 2048
    vfs: tuple[VfWant, ...] = ()
    disks: tuple[DiskWant, ...] = ()
    allow_span_nodes: bool = False
    policy: str = "pack"
    labels: tuple[tuple[str, str], ...] = ()  # host labels that must match
    # Not from the API: the scheduler sets it (``FleetIndex.hint``) when the nodes that
    # can still take a 1 GiB-page VM run short of the 1 GiB demand it expects. A 2 MiB
    # VM then tries nodes without free 1 GiB pages first (pack order and node choice).
    keep_1g: bool = False

    @property
    def pages(self) -> int:
        return self.memory_mib * 1024 // self.page_size_kb


def validate(want: VmWant) -> list[tuple[str, str]]:
    """(field, reason) for every bad field; empty when the request is well formed."""
    bad: list[tuple[str, str]] = []
    if want.vcpus < 1:
        bad.append(("vcpus", "must be at least 1"))
    if want.page_size_kb not in PAGE_SIZES_KB:
        bad.append(("page_size_kb", f"must be one of {list(PAGE_SIZES_KB)}"))
    if want.memory_mib < 1:
        bad.append(("memory_mib", "must be at least 1"))
    elif want.page_size_kb in PAGE_SIZES_KB and (want.memory_mib * 1024) % want.page_size_kb:
        bad.append(("memory_mib", f"must be a multiple of the {want.page_size_kb // 1024} MiB page size"))
    if want.policy not in POLICIES:
        bad.append(("policy", f"must be one of {list(POLICIES)}"))
    for i, v in enumerate(want.vfs):
        if v.max_tx_rate_mbps and v.min_tx_rate_mbps > v.max_tx_rate_mbps:
            bad.append((f"vfs[{i}].min_tx_rate_mbps", "exceeds max_tx_rate_mbps"))
    named = [d.disk for d in want.disks if d.disk]
    if len(set(named)) != len(named):
        bad.append(("disks", "a disk is listed twice"))
    for i, d in enumerate(want.disks):
        if not d.disk and not d.cls:
            bad.append((f"disks[{i}]", "give a disk name or a class"))
    return bad


def quantize(pages_2m: int) -> int:
    """Whole GiB of 2 MiB pages, floored: monotone (x >= y implies quantize(x) >= quantize(y))."""
    return max(pages_2m, 0) // 512


NodeKey = tuple[int, int, int, int, int]  # free CPUs, GiB of free 2 MiB pages, free 1 GiB pages, VFs, disks


def need_of(want: VmWant) -> NodeKey:
    """The request in node-key units (a node whose key does not cover this cannot take it)."""
    two = want.page_size_kb == 2048
    return (want.vcpus, quantize(want.pages) if two else 0, 0 if two else want.pages,
            min(len(want.vfs), CAP), min(len(want.disks), CAP))


def covers(n: NodeKey, w: NodeKey) -> bool:
    return n[0] >= w[0] and n[1] >= w[1] and n[2] >= w[2] and n[3] >= w[3] and n[4] >= w[4]


def kept(n: NodeKey, w: NodeKey, keep_1g: bool) -> bool:
    """Does a ``keep_1g`` request pass over node ``n`` first? (It has free 1 GiB pages and
    the request needs none.)"""
    return keep_1g and not w[2] and n[2] > 0



@dataclass(frozen=True)
class HostView:
    """One host as the fit sees it: resources, what is used, and whether it takes VMs."""

    res: HostRes
    usage: Usage = field(default_factory=Usage)
    schedulable: bool = True
    state: str = HostState.ACTIVE

    @cached_property
    def free_by_node(self) -> dict[int, int]:
        return {n.node: len(n.cpus - self.usage.cpus) for n in self.res.nodes}

    @cached_property
    def free_cpus(self) -> int:
        return sum(self.free_by_node.values())

    @cached_property
    def node_keys(self) -> tuple[NodeKey, ...]:
        """Per node (in ``res.nodes`` order): what is free there, in coarse units. A
        necessary condition for a one-node fit; the index groups hosts by these."""
        res, u = self.res, self.usage
        free_vf = {p.name: sum(1 for s in p.slots if (p.name, s) not in u.vfs) for p in res.pfs}
        out = []
        for n in res.nodes:
            vfs = sum(free_vf[p.name] for p in res.pfs if p.node is None or p.node == n.node)
            disks = sum(1 for d in res.disks if (d.node is None or d.node == n.node) and d.name not in u.disks)
            out.append((self.free_by_node[n.node], quantize(n.pages(2048) - u.pages.get((n.node, 2048), 0)),
                        max(n.pages(1048576) - u.pages.get((n.node, 1048576), 0), 0), min(vfs, CAP),
                        min(disks, CAP)))
        return tuple(out)

    def hole(self, need: NodeKey, keep_1g: bool = False) -> tuple[bool, int] | None:
        """(kept, free CPUs) of the node a pack walk meets this host at: the fullest node
        whose key covers ``need``, nodes ``kept`` for 1 GiB VMs last (None: no node covers)."""
        return min(((kept(k, need, keep_1g), k[0]) for k in self.node_keys if covers(k, need)), default=None)


def order_key(h: HostView, want: VmWant, need: NodeKey) -> tuple:
    """Where ``h`` comes in the walk for ``want`` (ties by host name)."""
    if want.allow_span_nodes:
        return (h.free_cpus if want.policy == "pack" else -h.free_cpus, h.res.name)
    if want.policy == "pack":
        hole = h.hole(need, want.keep_1g)
        return ((True, 1 << 30) if hole is None else hole, h.res.name)
    return (-h.free_cpus, h.res.name)


@dataclass(frozen=True)
class Candidate:
    host: str
    alloc: Allocation
    score: tuple


@dataclass(frozen=True)
class Rejection:
    host: str
    resource: str  # vcpus | memory | vfs | disks | page_size | state | labels | anti_affinity
    reason: str


@dataclass(frozen=True)
class FitResult:
    candidates: tuple[Candidate, ...]
    rejections: tuple[Rejection, ...]
    examined: int

    @property
    def counts(self) -> dict[str, int]:
        """Rejections counted per resource, most frequent first (ties by name)."""
        c = Counter(r.resource for r in self.rejections)
        return dict(sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))

    def summary(self) -> str:
        if not self.rejections:
            return "no hosts"
        return ", ".join(f"{n} host(s) short of {r}" for r, n in self.counts.items())


class _Short(Exception):
    def __init__(self, resource: str, reason: str):
        super().__init__(reason)
        self.resource = resource
        self.reason = reason


# ---------------------------------------------------------------- the walk


def fit_vm(hosts: Iterable[HostView], want: VmWant, *, avoid_hosts: frozenset[str] = frozenset(),
           avoid_racks: frozenset[str] = frozenset(), limit: int = 1,
           explain: bool = False) -> FitResult:
    """Rank hosts for ``want``. Returns at most ``limit`` candidates, best first."""
    need = need_of(want)
    order = sorted(hosts, key=lambda h: order_key(h, want, need))
    cands: list[Candidate] = []
    rejs: list[Rejection] = []
    examined = 0
    for h in order:
        if len(cands) >= limit and not explain:
            break
        examined += 1
        got = fit_host(h, want, avoid_hosts=avoid_hosts, avoid_racks=avoid_racks)
        if isinstance(got, Rejection):
            rejs.append(got)
        elif len(cands) < limit:
            cands.append(Candidate(h.res.name, got, order_key(h, want, need)))
    return FitResult(tuple(cands), tuple(rejs), examined)


def fit_host(h: HostView, want: VmWant, *, avoid_hosts: frozenset[str] = frozenset(),
             avoid_racks: frozenset[str] = frozenset()) -> Allocation | Rejection:
    """Fit ``want`` on one host: an exact allocation or the reason it does not fit."""
    name = h.res.name
    if not h.schedulable:
        return Rejection(name, "state", f"host is {h.state}")
    labels = h.res.label_map
    for k, v in want.labels:
        if labels.get(k) != v:
            return Rejection(name, "labels", f"label {k}={labels.get(k, '<unset>')}, {v} wanted")
    if name in avoid_hosts:
        return Rejection(name, "anti_affinity", "holds a member of the anti-affinity group")
    if h.res.rack and h.res.rack in avoid_racks:
        return Rejection(name, "anti_affinity", f"rack {h.res.rack} holds a member of the group")
    if not any(n.pages(want.page_size_kb) for n in h.res.nodes):
        return Rejection(name, "page_size", f"no {want.page_size_kb} kB hugepage pool")
    biggest = h.free_cpus if want.allow_span_nodes else max(h.free_by_node.values(), default=0)
    if biggest < want.vcpus:  # cheap pre-filter from cached counts
        where = "in total" if want.allow_span_nodes else "on its best node"
        return Rejection(name, "vcpus", f"{biggest} free dedicated CPUs {where}, {want.vcpus} needed")
    if want.policy == "pack":  # the node ``order_key`` ranked the host by, then the others
        need = need_of(want)
        keys = dict(zip((n.node for n in h.res.nodes), h.node_keys))
        nodes = sorted(h.res.nodes, key=lambda n: (not covers(keys[n.node], need),
                                                   kept(keys[n.node], need, want.keep_1g),
                                                   h.free_by_node[n.node], n.node))
    else:
        nodes = sorted(h.res.nodes, key=lambda n: (-h.free_by_node[n.node], n.node))
    shorts: list[tuple[int, str, str]] = []
    for n in nodes:
        try:
            return _fit_nodes(h, (n,), want)
        except _Short as s:
            shorts.append((_ORDER[s.resource], s.resource, f"node {n.node}: {s.reason}"))
    if want.allow_span_nodes and len(nodes) > 1:
        try:
            return _fit_span(h, want)
        except _Short as s:
            shorts.append((_ORDER[s.resource], s.resource, f"nodes spanned: {s.reason}"))
    best = max(shorts, key=lambda t: t[0])  # the node that got furthest names the resource
    msgs = sorted(m for _, _, m in shorts)
    return Rejection(name, best[1], "; ".join(msgs))


# ---------------------------------------------------------------- one node, or a span


def _fit_nodes(h: HostView, nodes: Sequence[NodeRes], want: VmWant) -> Allocation:
    """Raise _Short naming the first resource the node lacks, else the allocation."""
    (n,) = nodes
    u = h.usage
    cpus = pick_cpus(n, u.cpus, want.vcpus)
    if len(cpus) < want.vcpus:
        raise _Short("vcpus", f"{h.free_by_node[n.node]} free dedicated CPUs, {want.vcpus} needed")
    size, need = want.page_size_kb, want.pages
    free = max(n.pages(size) - u.pages.get((n.node, size), 0), 0)
    if free < need:
        raise _Short("memory", f"{free} free {size} kB pages, {need} needed")
    ids = {n.node}
    return Allocation((n.node,), tuple(cpus), ((n.node, size, need),), _pick_vfs(h, ids, want),
                      _pick_disks(h, ids, want))


def _fit_span(h: HostView, want: VmWant) -> Allocation:
    """A VM over several nodes: one guest NUMA cell per host node it uses, and every
    cell gets vCPUs *and* memory from its own node (hostd binds each cell's memory to
    its node with ``<memnode>``; a cell without a vCPU or without pages is refused).

    Nodes come in order of free CPUs (then free pages), fewest that cover both the
    vCPUs and the pages. vCPUs fill the nodes in that order (each at least one), so as
    few cores split as possible; memory follows the vCPUs: each cell gets pages in
    proportion to its vCPUs, as far as its node has them, the rest on the other cells
    (``apportion``). VFs and disks must be local to one of the nodes used."""
    u, size, need = h.usage, want.page_size_kb, want.pages
    free_pages = {n.node: max(n.pages(size) - u.pages.get((n.node, size), 0), 0) for n in h.res.nodes}
    usable = sorted((n for n in h.res.nodes if h.free_by_node[n.node] and free_pages[n.node]),
                    key=lambda n: (-h.free_by_node[n.node], -free_pages[n.node], n.node))
    chosen: list[NodeRes] = []
    have_cpus = have_pages = 0
    for n in usable:
        if have_cpus >= want.vcpus and have_pages >= need:
            break
        chosen.append(n)
        have_cpus += h.free_by_node[n.node]
        have_pages += free_pages[n.node]
    if have_cpus < want.vcpus:
        raise _Short("vcpus", f"{have_cpus} free dedicated CPUs on nodes with free {size} kB pages, "
                              f"{want.vcpus} needed")
    if have_pages < need:
        raise _Short("memory", f"{have_pages} free {size} kB pages on nodes with free CPUs, {need} needed")
    k = len(chosen)
    if k > want.vcpus:
        raise _Short("vcpus", f"needs {k} nodes for its memory but has {want.vcpus} vCPU(s): "
                              "every guest NUMA cell needs a vCPU")
    if k > need:
        raise _Short("memory", f"needs {k} nodes for its vCPUs but has {need} {size} kB page(s): "
                               "every guest NUMA cell needs memory")
    per_cpu = [1] * k
    left = want.vcpus - k
    for i, n in enumerate(chosen):  # fill in order: the fewest cores split
        extra = min(left, h.free_by_node[n.node] - 1)
        per_cpu[i] += extra
        left -= extra
    per_page = apportion(need, per_cpu, [free_pages[n.node] for n in chosen])
    cpus: list[int] = []
    for n, c in zip(chosen, per_cpu):
        cpus += pick_cpus(n, u.cpus, c)
    ids = {n.node for n in chosen}
    return Allocation(tuple(n.node for n in chosen), tuple(cpus),
                      tuple((n.node, size, p) for n, p in zip(chosen, per_page)),
                      _pick_vfs(h, ids, want), _pick_disks(h, ids, want), tuple(per_cpu))


def apportion(total: int, weights: Sequence[int], caps: Sequence[int]) -> list[int]:
    """Split ``total`` into one part per weight: each part at least 1 and at most its cap,
    as close to proportional to the weights as the caps allow (parts that hit their cap
    hand the rest to the others; ties go to the larger weight, then the earlier part).
    Needs ``len(weights) <= total <= sum(caps)`` and every cap >= 1."""
    k = len(weights)
    if not (k <= total <= sum(caps)) or min(caps, default=1) < 1:
        raise ValueError(f"cannot split {total} into {k} parts capped at {list(caps)}")
    parts = [1] * k
    left = total - k
    # Proportional targets first (largest remainder), clamped to the caps.
    wsum = sum(weights) or 1
    exact = [(total * w) / wsum for w in weights]
    for i in range(k):
        add = min(max(int(exact[i]) - 1, 0), caps[i] - 1, left)
        parts[i] += add
        left -= add
    order = sorted(range(k), key=lambda i: (-(exact[i] - parts[i]), -weights[i], i))
    for i in order:  # the remainders, to the parts furthest below their target
        if left and parts[i] < caps[i] and exact[i] > parts[i]:
            parts[i] += 1
            left -= 1
    for i in sorted(range(k), key=lambda i: (-weights[i], i)):  # what capped parts could not take
        add = min(left, caps[i] - parts[i])
        parts[i] += add
        left -= add
    assert left == 0, (total, weights, caps)
    return parts


def pick_cpus(node: NodeRes, used: frozenset[int], count: int) -> list[int]:
    """Up to ``count`` free CPUs of ``node``, by the rule hostd's claim check uses too
    (api/cpus.py): whole free cores first, the odd remainder from split cores."""
    return cpus_rule.pick_cpus(node.cores, used, count)


def _local(node: int | None, ids: set[int]) -> bool:
    return node is None or node in ids


def _pick_vfs(h: HostView, ids: set[int], want: VmWant) -> tuple[VfAlloc, ...]:
    taken = set(h.usage.vfs)
    reserved = dict(h.usage.reserved_mbps)
    out: list[VfAlloc] = []
    for i, v in enumerate(want.vfs):
        pfs = [p for p in h.res.pfs if (p.name == v.pf if v.pf else True) and _local(p.node, ids)]
        if not pfs:
            where = f"PF {v.pf} is not local" if v.pf else "no local PF"
            raise _Short("vfs", f"vfs[{i}]: {where}")
        why = "no free VF"
        chosen = None
        for p in pfs:
            if v.min_tx_rate_mbps and not p.min_rate_supported:
                why = f"{p.name} cannot guarantee a min tx rate"
                continue
            if v.max_tx_rate_mbps > p.bandwidth_mbps:
                why = f"max {v.max_tx_rate_mbps} Mbit/s above {p.name}'s {p.bandwidth_mbps}"
                continue
            left = p.bandwidth_mbps - reserved.get(p.name, 0)
            if v.min_tx_rate_mbps > left:
                why = f"{p.name} has {left} Mbit/s unreserved, {v.min_tx_rate_mbps} needed"
                continue
            slot = next((s for s in p.slots if (p.name, s) not in taken), None)
            if slot is None:
                why = f"{p.name} has no free VF"
                continue
            chosen = (p, slot)
            break
        if chosen is None:
            raise _Short("vfs", f"vfs[{i}]: {why}")
        p, slot = chosen
        taken.add((p.name, slot))
        reserved[p.name] = reserved.get(p.name, 0) + v.min_tx_rate_mbps
        out.append(VfAlloc(p.name, slot, v.max_tx_rate_mbps, v.min_tx_rate_mbps))
    return tuple(out)


def _disk_ok(d: DiskRes, w: DiskWant) -> str:
    """'' when ``d`` can serve ``w``'s IO limits, else why not."""
    if d.bytes_sec and not w.bytes_sec:
        return f"{d.name} has an IO budget: set bytes_sec"
    if d.bytes_sec and w.bytes_sec > d.bytes_sec:
        return f"{w.bytes_sec} B/s above {d.name}'s budget {d.bytes_sec}"
    if d.iops and w.iops > d.iops:
        return f"{w.iops} IOPS above {d.name}'s budget {d.iops}"
    if d.size_bytes < w.min_size_bytes:
        return f"{d.name} has {d.size_bytes} bytes, {w.min_size_bytes} needed"
    if w.exact_size_bytes and d.size_bytes != w.exact_size_bytes:
        return f"{d.name} has {d.size_bytes} bytes, exactly {w.exact_size_bytes} needed (a live move's copy)"
    if w.atomic_write_bytes > d.atomic_write_bytes:
        if d.atomic_write_bytes:
            return (f"{d.name} guarantees {d.atomic_write_bytes} B atomic writes, "
                    f"{w.atomic_write_bytes} B wanted")
        return f"{d.name} is not offered as atomic ({d.atomic_note or 'no atomic-write unit'})"
    return ""


def _pick_disks(h: HostView, ids: set[int], want: VmWant) -> tuple[DiskAlloc, ...]:
    taken = set(h.usage.disks)
    # Named disks first, so a class request cannot take a disk named later.
    order = sorted(range(len(want.disks)), key=lambda i: (not want.disks[i].disk, i))
    got: dict[int, DiskAlloc] = {}
    for i in order:
        w = want.disks[i]
        pool = [d for d in h.res.disks
                if (w.disk in (d.name, d.id) if w.disk else d.cls == w.cls) and _local(d.node, ids)]
        if not pool:
            what = w.disk or f"class {w.cls}"
            raise _Short("disks", f"disks[{i}]: no local disk {what}")
        why = "taken"
        best = None
        # Best fit: the smallest disk that serves the request, then the name.
        for d in sorted(pool, key=lambda d: (d.size_bytes, d.name)):
            if d.name in taken:
                why = f"{d.name} belongs to another VM"
                continue
            bad = _disk_ok(d, w)
            if bad:
                why = bad
                continue
            best = d
            break
        if best is None:
            raise _Short("disks", f"disks[{i}]: {why}")
        taken.add(best.name)
        got[i] = DiskAlloc(best.name, w.bytes_sec, w.iops)
    return tuple(got[i] for i in range(len(want.disks)))


def check_allocation(res: HostRes, usage: Usage, a: Allocation) -> str:
    """'' when ``a`` fits on top of ``usage`` (the claim's re-check), else why not."""
    cpus = set().union(*(n.cpus for n in res.nodes)) if res.nodes else set()
    if len(set(a.cpus)) != len(a.cpus) or not set(a.cpus) <= cpus:
        return "CPUs outside the host's VM CPUs"
    if set(a.cpus) & usage.cpus:
        return "CPUs taken"
    nodes = {n.node: n for n in res.nodes}
    for node, size, count in a.pages:
        if node not in nodes or usage.pages.get((node, size), 0) + count > nodes[node].pages(size):
            return f"node {node}: not enough {size} kB pages"
    pfs = {p.name: p for p in res.pfs}
    extra: dict[str, int] = {}
    for v in a.vfs:
        p = pfs.get(v.pf)
        if p is None or v.index not in p.slots or (v.pf, v.index) in usage.vfs:
            return f"VF {v.pf}#{v.index} not free"
        extra[v.pf] = extra.get(v.pf, 0) + v.min_tx_rate_mbps
    for pf, mbps in extra.items():
        if usage.reserved_mbps.get(pf, 0) + mbps > pfs[pf].bandwidth_mbps:
            return f"{pf}: tx budget exceeded"
    names = {d.name for d in res.disks}
    for d in a.disks:
        if d.name not in names or d.name in usage.disks:
            return f"disk {d.name} not free"
    return ""
