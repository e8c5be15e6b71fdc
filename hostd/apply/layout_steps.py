"""A Layout as steps on this host: planned from what the host is, applied behind a
journal, undone exactly.

``plan_steps`` reads the host's current state and returns the steps that would
change it (empty when the host already matches: a second carve changes nothing):
cpusets, the IO service's processes, hugepage pools, hugetlbfs mounts, VFs, and the
exclusive part (hostd.apply.exclusive). ``apply_layout`` runs them behind a
write-ahead ``Journal``: each step is recorded before it runs, a failing step rolls
back every step of this run, and ``uncarve`` undoes everything the journal holds,
newest first. The policy, the carve state and who asked are hostd.apply.carve_state's.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from api.layout import Layout
from hostd.apply.cgroups import CpusetFs, find_pids, pid_cpuset_cgroup
from hostd.apply.exclusive import EXCLUSIVE_STEPS, BestEffortAttr, Unmovable, plan_exclusive
from hostd.apply.steps import (
    STEP_KINDS,
    Context,
    MakeDir,
    MountHugetlbfs,
    MovePid,
    SetVfRate,
    Step,
    VfRates,
    WriteAttr,
    step_from_dict,
)
from hostd.cpulist import format_cpu_list
from hostd.discover.fs import HostFs
from hostd.errors import ApplyFailed, BadState, HostdError, IoServiceNotFound, NotCarved

log = logging.getLogger(__name__)

IO_CGROUP = "hyb-io"
JOURNAL_VERSION = 1
STEPS = {**STEP_KINDS, **{c.kind: c for c in EXCLUSIVE_STEPS}}  # journal kinds


@dataclass(frozen=True)
class HostHandles:
    """Where the carve acts: a real host (root=/) or a tree in tests."""

    root: Path
    cpuset: CpusetFs | None
    vf_rates: VfRates | None
    hugetlbfs_base: Path  # mount points are created under here ("/dev")
    exclude_pids: frozenset[int] = field(default_factory=frozenset)
    # Take io_cpus from every other task, IRQ and the unbound workqueues, live
    # (hostd/apply/exclusive.py; the policy's io_service.exclusive).
    exclusive: bool = False

    def sys(self, rel: str) -> Path:
        return self.root / "sys" / rel


# ---------------------------------------------------------------- planning


def plan_steps(layout: Layout, h: HostHandles, unmovable: list[Unmovable] | None = None) -> list[Step]:
    """The changes that make the host match ``layout``; reads, never writes. What the
    exclusive carve cannot move is appended to ``unmovable``, with the reason."""
    steps: list[Step] = []
    steps += _cpuset_steps(layout, h)
    if h.exclusive and h.cpuset is not None and layout.io_cpus:
        io_pids = {s.pid for s in steps if isinstance(s, MovePid)}  # the IO service, on its way to its CPUs
        io = layout.io_service
        # Only the IO service stays. hostd and its parent are left out of the IO service's
        # match (h.exclude_pids), not out of this move: hostd's own threads (its samplers
        # read /proc every second) left on io_cpus were the foreign CPU its own health
        # signal reported there (0.3-0.5 CPU-s/s in the real-host rollout test).
        s, u = plan_exclusive(layout, HostFs(h.root), h.cpuset, exclude_pids=frozenset(io_pids),
                              io_cgroup=_io_cgroup(layout), io_pattern=io.name if io.kind == "process" else "")
        steps += s
        if unmovable is not None:
            unmovable += u
    steps += _hugepage_steps(layout, h)
    steps += _hugetlbfs_steps(layout, h)
    steps += _sriov_steps(layout, h)
    return steps


def _cpuset_steps(layout: Layout, h: HostHandles) -> list[Step]:
    if not layout.vm_cpus and not layout.io_cpus:
        return []
    if h.cpuset is None:
        raise ApplyFailed("no cpuset cgroup controller is mounted (v1 or v2)", field="cgroup")
    fs = h.cpuset
    steps: list[Step] = []
    if fs.version == 2:
        ctl = fs.mount / "cgroup.subtree_control"
        if "cpuset" not in ctl.read_text().split():
            # Undo of this step writes "-cpuset": WriteAttr writes `before` back.
            steps.append(WriteAttr(str(ctl), before="-cpuset", after="+cpuset"))
    io = layout.io_service
    if layout.io_cpus and io.kind != "none":
        cg = _io_cgroup(layout)
        steps += _cgroup_steps(fs, cg, layout.io_cpus, _nodes_of(layout, layout.io_cpus),
                               create=io.kind == "process")
        if io.kind == "process":
            steps += _move_steps(h, fs, io.name, cg)
    if layout.vm_cpus:
        steps += _cgroup_steps(fs, layout.vm_cgroup, layout.vm_cpus,
                               _nodes_of(layout, layout.vm_cpus), create=True)
    return steps


def _io_cgroup(layout: Layout) -> str:
    io = layout.io_service
    return IO_CGROUP if io.kind in ("process", "none") else _unit_cgroup(io.name) if io.kind == "unit" else io.name


def _unit_cgroup(unit: str) -> str:
    # systemd places a service at system.slice/<unit> on cgroup v2.
    return f"system.slice/{unit}"


def _nodes_of(layout: Layout, cpus: tuple[int, ...]) -> list[int]:
    want = set(cpus)
    return sorted(n.node for n in layout.nodes
                  if want & set(n.io_cpus + n.host_cpus + n.vm_cpus))


def _cgroup_steps(fs: CpusetFs, cgroup: str, cpus: tuple[int, ...], nodes: list[int],
                  *, create: bool) -> list[Step]:
    d = fs.path(cgroup)
    steps: list[Step] = []
    if not d.is_dir():
        if not create:
            raise ApplyFailed(f"cgroup {d} does not exist", field="io_service.cgroup")
        steps.append(MakeDir(str(d)))
        cur_cpus = cur_mems = ""
    else:
        cur_cpus = (d / fs.cpus_file).read_text().strip()
        cur_mems = (d / fs.mems_file).read_text().strip()
    want_cpus, want_mems = format_cpu_list(cpus), format_cpu_list(nodes)
    # v1 refuses tasks in a cpuset whose mems are empty: mems first.
    if cur_mems != want_mems:
        steps.append(WriteAttr(str(d / fs.mems_file), cur_mems, want_mems))
    if cur_cpus != want_cpus:
        steps.append(WriteAttr(str(d / fs.cpus_file), cur_cpus, want_cpus))
    return steps


def _move_steps(h: HostHandles, fs: CpusetFs, pattern: str, cgroup: str) -> list[Step]:
    exclude = set(h.exclude_pids) | {os.getpid()}
    pids = find_pids(h.root, pattern, exclude=exclude)
    if not pids:
        raise IoServiceNotFound(f"no process matches {pattern!r}", field="io_service.process")
    steps: list[Step] = []
    target = "/" + cgroup.strip("/")
    for pid, comm in pids:
        cur = pid_cpuset_cgroup(h.root, pid, fs.version)
        if cur != target:
            steps.append(MovePid(pid=pid, comm=comm, before=str(fs.path(cur)),
                                 after=str(fs.path(cgroup)), procs_file=fs.procs_file))
    return steps


def _hugepage_steps(layout: Layout, h: HostHandles) -> list[Step]:
    steps: list[Step] = []
    for n in layout.nodes:
        for t in n.hugepages:
            attr = _hugepage_attr(h, n.node, t.size_kb)
            cur = attr.read_text().strip()
            if cur != str(t.count):
                steps.append(WriteAttr(str(attr), cur, str(t.count), verify=True))
    return steps


def _hugepage_attr(h: HostHandles, node: int, size_kb: int) -> Path:
    per_node = h.sys(f"devices/system/node/node{node}/hugepages/hugepages-{size_kb}kB/nr_hugepages")
    if per_node.exists():
        return per_node
    glob = h.sys(f"kernel/mm/hugepages/hugepages-{size_kb}kB/nr_hugepages")
    if node == 0 and glob.exists():
        return glob
    raise ApplyFailed(f"no {size_kb} kB hugepage pool on node {node}", field=f"hugepages.node{node}")


def hugetlbfs_mounts(root: Path) -> dict[int, str]:
    """pagesize kB -> a mount point, from /proc/mounts."""
    default_kb = 2048
    for line in (root / "proc/meminfo").read_text().splitlines():
        if line.startswith("Hugepagesize:"):
            default_kb = int(line.split()[1])
    out: dict[int, str] = {}
    for line in (root / "proc/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "hugetlbfs":
            size = default_kb
            for opt in parts[3].split(","):
                if opt.startswith("pagesize="):
                    size = _size_kb(opt.split("=", 1)[1])
            out.setdefault(size, parts[1])
    return out


def _size_kb(text: str) -> int:
    units = {"K": 1, "M": 1024, "G": 1024 * 1024}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text) // 1024


def _hugetlbfs_steps(layout: Layout, h: HostHandles) -> list[Step]:
    sizes = sorted({t.size_kb for n in layout.nodes for t in n.hugepages if t.count > 0})
    have = hugetlbfs_mounts(h.root)
    steps: list[Step] = []
    for size in sizes:
        if size in have:
            continue
        label = f"{size // (1024 * 1024)}G" if size >= 1024 * 1024 else f"{size // 1024}M"
        path = h.hugetlbfs_base / f"hugepages-{label}"
        steps.append(MountHugetlbfs(str(path), size, created_dir=not path.exists()))
    return steps


def _sriov_steps(layout: Layout, h: HostHandles) -> list[Step]:
    steps: list[Step] = []
    for pf in layout.pfs:
        attr = h.sys(f"class/net/{pf.name}/device/sriov_numvfs")
        cur = int(attr.read_text().strip())
        if cur != pf.numvfs:
            if cur:  # the kernel only changes a non-zero VF count through 0
                steps.append(WriteAttr(str(attr), str(cur), "0"))
            if pf.numvfs:
                steps.append(WriteAttr(str(attr), "0", str(pf.numvfs)))
        for slot in pf.slots:
            if slot.index < cur and h.vf_rates is not None:
                before = h.vf_rates.get_rate(pf.name, slot.index)
            else:
                before = (0, 0)  # a VF the kernel is about to create starts unlimited
            want = (slot.max_tx_rate_mbps, slot.min_tx_rate_mbps)
            if before != want:
                if h.vf_rates is None:
                    raise ApplyFailed("VF rate limits need netlink (pyroute2)",
                                      field=f"sriov.pfs.{pf.name}")
                steps.append(SetVfRate(pf.name, slot.index, before[0], before[1], *want))
    return steps


# ---------------------------------------------------------------- journal


class Journal:
    """The record of what carve changed, written ahead of each step."""

    def __init__(self, path: Path):
        self.path = path

    def load(self) -> list[Step]:
        if not self.path.exists():
            return []
        data = json.loads(self.path.read_text())
        if data.get("version") != JOURNAL_VERSION:
            raise BadState(f"journal {self.path} has version {data.get('version')}, "
                           f"expected {JOURNAL_VERSION}", field="state")
        return [step_from_dict(d, STEPS) for d in data["steps"]]

    def save(self, steps: list[Step]) -> None:
        if not steps:
            self.path.unlink(missing_ok=True)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump({"version": JOURNAL_VERSION, "updated": time.time(),
                       "steps": [s.to_dict() for s in steps]}, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


def apply_layout(layout: Layout, h: HostHandles, journal: Journal, ctx: Context,
                 unmovable: list[Unmovable] | None = None) -> list[Step]:
    """Apply what differs; on failure roll this run back and raise ApplyFailed."""
    done = journal.load()
    steps = plan_steps(layout, h, unmovable)
    # What the kernel refused last time it will refuse again: reported, not retried, so a
    # second carve changes nothing.
    refused = {(s.path, s.after): s for s in done if isinstance(s, BestEffortAttr) and s.skipped}
    again = [s for s in steps if isinstance(s, BestEffortAttr) and (s.path, s.after) in refused]
    steps = [s for s in steps if s not in again]
    if unmovable is not None:
        unmovable += [Unmovable(s.what, refused[(s.path, s.after)].skipped) for s in again]
    ran: list[Step] = []
    for step in steps:
        journal.save(done + ran + [step])  # write-ahead: a crash leaves it undoable
        try:
            step.apply(ctx)
        except Exception as e:
            log.error("carve step failed step=%r error=%s", step.describe(), e)
            _rollback(ran + [step], ctx)
            journal.save(done)
            if isinstance(e, HostdError):
                raise
            raise ApplyFailed(f"{step.describe()}: {e}") from e
        log.info("carve step=%r", step.describe())
        ran.append(step)
    journal.save(done + ran)
    return ran


def _rollback(steps: list[Step], ctx: Context) -> None:
    for step in reversed(steps):
        try:
            step.undo(ctx)
            log.info("rollback step=%r", step.describe())
        except Exception as e:  # keep undoing the rest; report each
            log.error("rollback failed step=%r error=%s", step.describe(), e)


def uncarve(journal: Journal, ctx: Context) -> list[Step]:
    """Undo every recorded step, newest first. Stops at the first failure and keeps
    the steps not yet undone in the journal, so a second uncarve can finish."""
    steps = journal.load()
    if not steps:
        raise NotCarved(f"nothing to undo: no journal at {journal.path}", field="state")
    undone: list[Step] = []
    while steps:
        step = steps[-1]
        try:
            step.undo(ctx)
        except Exception as e:
            journal.save(steps)
            raise ApplyFailed(f"undo of '{step.describe()}' failed: {e}") from e
        log.info("uncarve step=%r", step.describe())
        undone.append(steps.pop())
    journal.save([])
    return undone
