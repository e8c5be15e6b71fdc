"""The running daemon's side of the remote carve (GetHostInfo, PlanCarve, Carve,
Uncarve): which policy hostd serves VMs with, and changing it safely.

One carve or uncarve at a time, and each under the VM manager's lock: no VM is
created, started or deleted while the host changes under it, and the VM conflict
check cannot go stale before the carve runs. After a carve (or uncarve) the manager
serves the new layout, and ``on_served`` tells the rest of the daemon (scheduler
registration, the IO-health signal).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from api.layout import Layout
from api.policy import policy_digest
from hostd.apply.live_carve import plan_steps
from hostd.apply.steps import Step
from hostd.apply.vms import VmManager
from hostd.carve.plan import plan_host
from hostd.carve.policy import Policy, PolicyError, loads_policy
from hostd.discover import DiskProbe, discover_host
from hostd.discover.model import Topology
from hostd.errors import (
    CarveFailed,
    CarveNoFit,
    DigestMismatch,
    HostdError,
    NoFit,
    NotDrained,
    PolicyInvalid,
    StartupError,
    VmsRunning,
    VmsWouldNotFit,
)
from hostd.rpc.carving import (
    Carved,
    boot_pending,
    carve,
    handles_for,
    journal_steps,
    load_state,
    uncarve_host,
    vm_conflicts,
)

log = logging.getLogger(__name__)

BUSY_STATES = ("running", "creating", "deleting")


@dataclass(frozen=True)
class Served:
    """The policy hostd serves VMs with, and what it made of this host."""

    text: str
    digest: str
    policy: Policy
    topo: Topology
    layout: Layout
    source: str  # "carve state" or the policy file's path


@dataclass(frozen=True)
class Where:
    root: Path
    state_dir: Path
    policy_file: Path
    virt_type: str


def discover_for(policy: Policy, where: Where) -> Topology:
    return discover_host(where.root, allow=tuple(policy.disks.allow), wipe_ok=tuple(policy.disks.wipe_ok),
                         virt_type=where.virt_type, probe_versions=where.root == Path("/"))


def disk_probe(policy: Policy, where: Where) -> DiskProbe:
    return DiskProbe(where.root, tuple(policy.disks.allow), tuple(policy.disks.wipe_ok))


def served_policy(where: Where, *, prefer_carved: bool = True) -> Served:
    """What ``hostd serve`` starts with: the carved policy (carve state) if the host was
    carved, else the policy file. StartupError when it cannot be read or does not fit."""
    st = load_state(where.state_dir) if prefer_carved else None
    if st is not None:
        text, source = st.policy_toml, "carve state"
    else:
        try:
            text, source = where.policy_file.read_text(), str(where.policy_file)
        except OSError as e:
            raise StartupError(e.strerror or str(e), field=f"policy {where.policy_file}") from None
    try:
        policy = loads_policy(text, source=source)
    except PolicyError as e:
        raise StartupError(e.reason, field=f"policy {e.field}") from None
    topo = discover_for(policy, where)
    layout = plan_host(topo, policy)
    if isinstance(layout, NoFit):
        raise StartupError(f"the policy ({source}) does not fit this host: {layout}", field=layout.field)
    if st is not None and layout.to_json(None) != st.layout_json:
        log.warning("the carved policy plans differently on this host now (carved %s); Carve it again",
                     time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(st.carved_unix)))
    log.info("serving policy source=%s digest=%s", source, policy_digest(text)[:12])
    return Served(text, policy_digest(text), policy, topo, layout, source)


@dataclass
class Planned:
    digest: str
    layout: Layout | None
    nofit: NoFit | None
    steps: list[Step] = field(default_factory=list)
    cannot_move: list[str] = field(default_factory=list)
    vm_conflicts: list[str] = field(default_factory=list)
    already_carved: bool = False


@dataclass
class Info:
    carved_digest: str
    journal_steps: int
    reboot_pending: list[str]
    vms: int
    vms_running: int
    started_unix: float
    policy_digest: str
    carved_policy_toml: str = ""


class HostCarver:
    def __init__(self, where: Where, manager: VmManager, served: Served,
                 on_served: Callable[[Served], None] = lambda s: None):
        self.where = where
        self.m = manager
        self.served = served
        self.on_served = on_served
        self.started = time.time()
        self._lock = threading.Lock()  # one carve or uncarve at a time

    def _parse(self, text: str) -> tuple[str, Policy]:
        text = text or self.served.text
        try:
            return text, loads_policy(text, source="policy_toml")
        except PolicyError as e:
            raise PolicyInvalid(e.reason, field=e.field) from None

    def info(self) -> Info:
        st = load_state(self.where.state_dir)
        vms = self.m.list()
        return Info(carved_digest=st.digest if st else "", journal_steps=len(journal_steps(self.where.state_dir)),
                    reboot_pending=boot_pending(self.served.layout, self.where.root) if st else [], vms=len(vms),
                    vms_running=sum(r.state == "running" for r in vms), started_unix=self.started,
                    policy_digest=self.served.digest, carved_policy_toml=st.policy_toml if st else "")

    def plan(self, text: str) -> Planned:
        text, policy = self._parse(text)
        digest = policy_digest(text)
        with self._lock:
            st = load_state(self.where.state_dir)
            result = plan_host(discover_for(policy, self.where), policy)
            already = st is not None and st.digest == digest
            if isinstance(result, NoFit):
                return Planned(digest, None, result, already_carved=already)
            unmovable: list = []
            steps = plan_steps(result, handles_for(self.where.root, exclusive=policy.io_service.exclusive),
                               unmovable)
            return Planned(digest, result, None, steps, [str(u) for u in unmovable],
                           vm_conflicts(result, self.m.list()), already)

    def carve(self, text: str, digest: str) -> Carved:
        text, policy = self._parse(text)
        if digest != policy_digest(text):
            raise DigestMismatch(f"{digest or '(none)'} is not the sha256 of the policy text "
                                 f"({policy_digest(text)}): plan with the text you carve", field="policy_digest")
        with self._lock, self.m.held():
            topo = discover_for(policy, self.where)
            layout = plan_host(topo, policy)
            if isinstance(layout, NoFit):
                raise CarveNoFit(layout.reason, field=layout.field)
            conflicts = vm_conflicts(layout, self.m.list())
            if conflicts:
                raise VmsWouldNotFit("; ".join(conflicts), field="vm_conflicts")
            try:
                out = carve(text, policy, layout, root=self.where.root, state_dir=self.where.state_dir)
            except Exception as e:
                log.error("carve failed digest=%s error=%s", digest[:12], e)
                detail = str(e) if isinstance(e, HostdError) else f"{type(e).__name__}: {e}"
                raise CarveFailed(f"{detail}; every step of this carve was undone",
                                  field=getattr(e, "field", None)) from e
            # Discover again: the carve made VFs (their PCI addresses are new VM devices).
            self._serve(Served(text, out.digest, policy, discover_for(policy, self.where), layout, "carve state"))
            return out

    def uncarve(self, drained: bool) -> list[Step]:
        with self._lock, self.m.held():
            vms = self.m.list()
            busy = [f"{r.name} ({r.vm_id}, {r.state})" for r in vms if r.state in BUSY_STATES]
            if busy:
                raise VmsRunning(f"VMs are running: {', '.join(busy)}; drain the host first", field="vms")
            if vms and not drained:
                raise NotDrained("VMs exist (" + ", ".join(f"{r.name} ({r.vm_id}, {r.state})" for r in vms)
                                 + "): drain the host and say so (drained = true)", field="drained")
            undone = uncarve_host(self.where.state_dir, self.where.root)
            try:
                served = served_policy(self.where, prefer_carved=False)
            except HostdError as e:  # keep serving what it served; a restart would refuse too
                log.warning("uncarved, but the policy file cannot be served (%s): keeping the layout", e)
            else:
                self._serve(served)
            return undone

    def _serve(self, served: Served) -> None:
        self.served = served
        self.m.set_layout(served.layout, disk_probe(served.policy, self.where))
        try:
            self.on_served(served)
        except Exception:  # the carve is done; registration and the signal catch up on restart
            log.exception("after the carve: updating the daemon failed")
