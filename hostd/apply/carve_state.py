"""A policy's carve of one host and the state that records it (what
hostd.apply.carve_service runs for `hostd carve` and the Carve RPC alike): where the
carve acts (the host, or a host tree under ``root``), the layout's journaled steps
(hostd.apply.layout_steps) followed by the carve state that names the policy the host
was carved with, and the undo of both.

``carve-state.json`` (in ``state_dir``, beside ``carve-journal.json``) holds the
policy text, its digest, the layout, the time, and who carved it (the operation id and
the caller: what a compare-and-set refusal names). It is written atomically after the
journal, so a host is either carved with a recorded policy or not; ``hostd serve``
plans with the carved policy in preference to its policy file, so an upgrade carved
remotely survives a restart; uncarve removes it.

Where ``root`` is a tree (not ``/``), nothing outside the tree is touched: the
exclusive part of the carve is off (it would sched_setaffinity PIDs read from the
tree's /proc, which may be real processes of this machine), hugetlbfs mounts are
recorded in the tree's /proc/mounts instead of mount(2), and there is no netlink.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from api.layout import Layout
from api.policy import policy_digest
from hostd.apply.cgroups import find_cpuset_fs
from hostd.apply.layout_steps import HostHandles, Journal, apply_layout, hugetlbfs_mounts, plan_steps, uncarve
from hostd.apply.steps import Context, Mounter, Step, SystemMounter
from hostd.carve.policy import Policy
from hostd.errors import ApplyFailed, BadState

log = logging.getLogger(__name__)

JOURNAL_NAME = "carve-journal.json"
STATE_NAME = "carve-state.json"
STATE_VERSION = 2  # 2 added operation and by; a version 1 state reads with them ""


def boot_changes(layout: Layout) -> list[str]:
    """The kernel command line changes a layout needs, ``param=value`` each."""
    return [f"{b.param}={b.value}" for b in layout.reboot_required]


def boot_pending(layout: Layout, root: Path) -> list[str]:
    """Those of ``boot_changes`` the running kernel was not booted with (``/proc/cmdline``
    under ``root``): what a reboot still has to bring. All of them if it cannot be read."""
    try:
        booted = set((root / "proc/cmdline").read_text().split())
    except OSError:
        booted = set()
    return [c for c in boot_changes(layout) if c not in booted]


# ---------------------------------------------------------------- carve state


@dataclass(frozen=True)
class CarveState:
    digest: str
    policy_toml: str
    layout_json: str
    carved_unix: float
    operation: str = ""  # the caller's operation id
    by: str = ""  # the caller: its certificate name, or hostd-cli:<user>


def load_state(state_dir: Path) -> CarveState | None:
    path = state_dir / STATE_NAME
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as e:
        raise BadState(f"{path}: {e}", field="state") from None
    if data.get("version") not in (1, STATE_VERSION):
        raise BadState(f"{path} has version {data.get('version')}, expected {STATE_VERSION}", field="state")
    st = CarveState(data["digest"], data["policy_toml"], data["layout_json"], data["carved_unix"],
                    data.get("operation", ""), data.get("by", ""))
    if policy_digest(st.policy_toml) != st.digest:
        raise BadState(f"{path}: the digest does not match the policy text", field="state")
    return st


def save_state(state_dir: Path, st: CarveState) -> None:
    """Write-rename-fsync: a crash leaves the old state or the new one, never a part."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / STATE_NAME
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump({"version": STATE_VERSION, **asdict(st)}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dfd = os.open(state_dir, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def clear_state(state_dir: Path) -> None:
    (state_dir / STATE_NAME).unlink(missing_ok=True)


def missing_pool_mount(root: Path, size_kb: int) -> str:
    """Why the host under ``root`` cannot back a VM's memory with ``size_kb`` pages yet
    ("" when it can): no hugetlbfs mount of that page size, which the carve makes and
    libvirt needs (QEMU maps guest RAM from it)."""
    try:
        mounts = hugetlbfs_mounts(root)
    except OSError as e:
        return f"cannot read the hugetlbfs mounts under {root}: {e.strerror or e}"
    if size_kb in mounts:
        return ""
    return f"no hugetlbfs mount with {size_kb} kB pages (the carve makes one): carve the host first"


# ---------------------------------------------------------------- where the carve acts


class TreeMounter:
    """Mounts on a host tree: recorded in ``<root>/proc/mounts`` (what the planner reads),
    never mount(2). Undo restores the file byte for byte."""

    def __init__(self, root: Path):
        self.root = root

    def _entry(self, path: Path, pagesize_kb: int | None = None) -> str:
        where = "/" + str(path.relative_to(self.root))
        return f"hugetlbfs {where} hugetlbfs rw,relatime,pagesize={pagesize_kb}K 0 0" if pagesize_kb \
            else f"hugetlbfs {where} hugetlbfs "

    def _lines(self) -> tuple[Path, str]:
        p = self.root / "proc/mounts"
        return p, p.read_text() if p.exists() else ""

    def mount_hugetlbfs(self, path: Path, pagesize_kb: int) -> None:
        if not path.is_dir():
            raise ApplyFailed(f"mount {path}: not a directory", field=str(path))
        p, text = self._lines()
        entry = self._entry(path, pagesize_kb)
        p.write_text(text + entry + "\n" if not text or text.endswith("\n") else text + "\n" + entry)

    def umount(self, path: Path) -> None:
        p, text = self._lines()
        lines = text.split("\n")
        hit = next((i for i, ln in enumerate(lines) if ln.startswith(self._entry(path))), None)
        if hit is None:
            raise ApplyFailed(f"umount {path}: not mounted", field=str(path))
        del lines[hit]
        p.write_text("\n".join(lines))

    def is_mounted(self, path: Path) -> bool:
        return any(ln.startswith(self._entry(path)) for ln in self._lines()[1].split("\n"))


def handles_for(root: Path, *, exclusive: bool = False) -> HostHandles:
    """Where a carve acts. On a tree the exclusive carve is forced off (see the module doc)."""
    vf = None
    if root == Path("/"):
        from hostd.apply.netlink import NetlinkVfRates

        vf = NetlinkVfRates()
    elif exclusive:
        log.info("carve on a host tree root=%s: the exclusive (live affinity) part is off", root)
    return HostHandles(root=root, cpuset=find_cpuset_fs(root), vf_rates=vf,
                       hugetlbfs_base=root / "dev", exclude_pids=frozenset({os.getpid(), os.getppid()}),
                       exclusive=exclusive and root == Path("/"))


def context_for(h: HostHandles) -> Context:
    mounter: Mounter = SystemMounter() if h.root == Path("/") else TreeMounter(h.root)
    return Context(h.vf_rates, mounter)


# ---------------------------------------------------------------- carve, uncarve


@dataclass(frozen=True)
class Carved:
    digest: str
    layout: Layout
    steps: list[Step]  # done (or, dry run, that would be done)
    cannot_move: list[str]
    dry_run: bool

    @property
    def changed(self) -> bool:
        return bool(self.steps) and not self.dry_run


def carve(text: str, policy: Policy, layout: Layout, *, root: Path, state_dir: Path,
          dry_run: bool = False, operation: str = "", by: str = "") -> Carved:
    """Make the host under ``root`` match ``layout`` (planned from ``policy``, whose TOML
    is ``text``), journaled in ``state_dir``; then record the carve state with who asked
    (``operation``, ``by``). A failing step rolls this carve back and raises
    (ApplyFailed or the step's HostdError)."""
    h = handles_for(root, exclusive=policy.io_service.exclusive)
    journal = Journal(state_dir / JOURNAL_NAME)
    unmovable: list = []
    digest = policy_digest(text)
    if dry_run:
        steps = plan_steps(layout, h, unmovable)
    else:
        steps = apply_layout(layout, h, journal, context_for(h), unmovable)
        save_state(state_dir, CarveState(digest, text, layout.to_json(None), time.time(), operation, by))
        log.info("carved digest=%s steps=%d root=%s operation=%s by=%s", digest[:12], len(steps), root,
                 operation, by)
    refused = [s.skipped for s in steps if getattr(s, "skipped", "")]
    return Carved(digest, layout, steps, [str(u) for u in unmovable] + refused, dry_run)


def journal_steps(state_dir: Path) -> list[Step]:
    return Journal(state_dir / JOURNAL_NAME).load()


def uncarve_host(state_dir: Path, root: Path) -> list[Step]:
    """Undo the journal, newest first, and forget the carved policy. An empty journal
    is nothing to do ([]). A failing undo raises ApplyFailed and keeps what is left
    in the journal (and the state), so a second uncarve can finish."""
    journal = Journal(state_dir / JOURNAL_NAME)
    undone = uncarve(journal, context_for(handles_for(root))) if journal.load() else []
    clear_state(state_dir)
    log.info("uncarved steps=%d root=%s", len(undone), root)
    return undone
