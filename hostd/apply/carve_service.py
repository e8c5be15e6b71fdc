"""The one service that changes this host's carve: `hostd carve` / `hostd uncarve` (the
command line) and the Carve / Uncarve / PlanCarve / GetHostInfo RPCs (`hostd serve`)
both call it, so both make the same checks, under the same lock, through the same
journal, and fail with the same errors.

- The lock: the host's carve lock in ``state_dir`` (hostd.apply.hostlock), exclusive
  for a carve or an uncarve, shared for a plan; the daemon's VM changes take it shared
  too, so a `hostd carve` beside a running `hostd serve` cannot race either. Inside
  the daemon the VM manager's own lock is held as well (``HostVms.held``): no VM is
  created, started or deleted while the host changes under it.
- The checks: a carve refuses a layout that would not hold the VMs on this host
  (``hyb.carve.vms_would_not_fit``); an uncarve refuses while VMs run
  (``hyb.carve.vms_running``) or exist undrained (``hyb.carve.not_drained``). The VMs
  are the daemon's: its manager in-process, its ledger (``state_dir/ledger.db``) from
  the command line, read under the lock.
- Compare-and-set: a carve or an uncarve names the digest it expects to replace ("":
  uncarved) and its operation id; another carve since the caller looked is refused
  (``hyb.carve.conflict``, naming the carve the host has and who made it), as
  placement's generations and etcd's revisions refuse a stale write. A retry of a carve
  that is done (same digest, same operation) is allowed and changes nothing. The
  command line may leave the expectation out (the operator at the host decides).
- The journal and the carve state: hostd.apply.carve_state.

Which policy `hostd serve` serves VMs with (``served_policy``) lives here too: the
carved one if the host was carved, else the policy file; after a carve or an uncarve
the daemon's ``on_served`` swaps it in (the command line has none: a daemon running
beside it serves the new layout from its next start, and its GetHostInfo shows the
carve at once).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from api.bounds import OPERATION_ID_RULE, check_digest, check_operation_id
from api.layout import Layout
from api.policy import policy_digest
from hostd.apply.carve_state import (
    Carved,
    CarveState,
    boot_pending,
    carve,
    handles_for,
    journal_steps,
    load_state,
    uncarve_host,
)
from hostd.apply.hostlock import HostLock
from hostd.apply.layout_steps import plan_steps
from hostd.apply.ledger import ON_HOST, Ledger, VmRecord, VmState
from hostd.apply.steps import Step
from hostd.carve.conflicts import vm_conflicts
from hostd.carve.plan import plan_host
from hostd.carve.policy import Policy, PolicyError, loads_policy
from hostd.discover import DiskProbe, discover_host
from hostd.discover.model import Topology
from hostd.errors import (
    CarveConflict,
    CarveFailed,
    CarveNoFit,
    CarveRequestInvalid,
    DigestMismatch,
    HostdError,
    NoFit,
    NotDrained,
    PolicyInvalid,
    StartupError,
    VmsRunning,
    VmsWouldNotFit,
)

log = logging.getLogger(__name__)

CARVE_STATE = "carve state"  # Served.source of a carved host

LEDGER_NAME = "ledger.db"
WAIT_S = 60.0  # how long a carve waits for the lock before CarveBusy


@dataclass(frozen=True)
class Asker:
    """Who asks for a carve or an uncarve, and what they expect to replace.

    ``expected``: the carved digest the change replaces ("" = uncarved); None only from
    the command line, where the operator at the host may skip the comparison.
    ``operation``: the caller's id for the change (recorded; a retry of a done carve
    with the same id is allowed). ``by``: the caller's name (certificate name)."""

    expected: str | None
    operation: str
    by: str

    def check(self) -> None:
        if self.expected is not None:
            try:
                check_digest(self.expected)
            except ValueError as e:
                raise CarveRequestInvalid(str(e), field="expected_digest") from None
        if not self.operation:
            raise CarveRequestInvalid(f"required: {OPERATION_ID_RULE}", field="operation_id")
        try:
            check_operation_id(self.operation)
        except ValueError as e:
            raise CarveRequestInvalid(str(e), field="operation_id") from None


def describe_carve(st: CarveState | None) -> str:
    """What a host carries, for a refusal: the digest, who carved it and when."""
    if st is None:
        return "uncarved"
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(st.carved_unix))
    return (f"carved with {st.digest} by {st.by or '(unrecorded)'} "
            f"(operation {st.operation or '(unrecorded)'}) at {when}")


@dataclass(frozen=True)
class Where:
    root: Path
    state_dir: Path
    policy_file: Path
    virt_type: str
    # The disk allow-list to discover with instead of the policy's (`hostd carve --allow`).
    allow: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Served:
    """The policy hostd serves VMs with, and what it made of this host."""

    text: str
    digest: str
    policy: Policy
    topo: Topology
    layout: Layout
    source: str  # CARVE_STATE or the policy file's path

    @property
    def carved(self) -> bool:
        """Served from the carve state: the host was carved with this policy."""
        return self.source == CARVE_STATE


def discover_for(policy: Policy, where: Where) -> Topology:
    allow = where.allow if where.allow is not None else tuple(policy.disks.allow)
    return discover_host(where.root, allow=allow, wipe_ok=tuple(policy.disks.wipe_ok),
                         virt_type=where.virt_type, probe_versions=where.root == Path("/"))


def disk_probe(policy: Policy, where: Where) -> DiskProbe:
    return DiskProbe(where.root, tuple(policy.disks.allow), tuple(policy.disks.wipe_ok))


def served_policy(where: Where, *, prefer_carved: bool = True) -> Served:
    """What ``hostd serve`` starts with: the carved policy (carve state) if the host was
    carved, else the policy file. StartupError when it cannot be read or does not fit."""
    st = load_state(where.state_dir) if prefer_carved else None
    if st is not None:
        text, source = st.policy_toml, CARVE_STATE
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
    digest = policy_digest(text)
    log.info("serving policy source=%s digest=%s", source, digest[:12])
    return Served(text, digest, policy, topo, layout, source)


# ---------------------------------------------------------------- the VMs a carve checks


class HostVms(Protocol):
    """The VMs on this host, as the carve checks see them."""

    def list(self) -> list[VmRecord]: ...

    def held(self) -> AbstractContextManager[None]:
        """Held around a carve: no VM changes meanwhile (in this process)."""
        ...


class LedgerVms:
    """The daemon's VMs from another process (the command line): its ledger in
    ``state_dir``, read when asked. The daemon's VM changes wait for the carve lock
    the command line holds, so nothing in-process needs holding."""

    def __init__(self, state_dir: Path):
        self.path = state_dir / LEDGER_NAME

    def list(self) -> list[VmRecord]:
        if not self.path.exists():
            return []  # no hostd ever served here
        ledger = Ledger(self.path)
        try:
            return ledger.list()
        finally:
            ledger.close()

    def held(self) -> AbstractContextManager[None]:
        return contextlib.nullcontext()


# ---------------------------------------------------------------- the service


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
    carve_operation: str = ""
    carved_by: str = ""
    carved_unix: float = 0.0


class CarveService:
    """``served``: the policy a daemon serves with (None on the command line: nothing is
    served, and a policy text must be given). ``on_served`` runs after a carve or an
    uncarve changed it, under the VM manager's lock (the daemon swaps the manager's
    layout, re-registers, retargets the IO-health signal)."""

    def __init__(self, where: Where, vms: HostVms, *, served: Served | None = None,
                 on_served: Callable[[Served], None] | None = None, wait_s: float = WAIT_S):
        self.where = where
        self.vms = vms
        self.served = served
        self.on_served = on_served
        self.wait_s = wait_s
        self.lock = HostLock(where.state_dir)
        self.started = time.time()

    def _parse(self, text: str, policy: Policy | None) -> tuple[str, Policy]:
        if policy is not None:
            return text, policy
        if not text and self.served is not None:
            text = self.served.text
        try:
            return text, loads_policy(text, source="policy_toml")
        except PolicyError as e:
            raise PolicyInvalid(e.reason, field=e.field) from None

    @contextlib.contextmanager
    def _exclusive(self, what: str) -> Iterator[None]:
        with self.lock.exclusive(what, wait_s=self.wait_s), self.vms.held():
            yield

    def info(self) -> Info:
        st = load_state(self.where.state_dir)
        vms = self.vms.list()
        served = self.served
        return Info(carved_digest=st.digest if st else "", journal_steps=len(journal_steps(self.where.state_dir)),
                    reboot_pending=boot_pending(served.layout, self.where.root) if st and served else [],
                    vms=len(vms), vms_running=sum(r.state == VmState.RUNNING for r in vms), started_unix=self.started,
                    policy_digest=served.digest if served else "", carved_policy_toml=st.policy_toml if st else "",
                    carve_operation=st.operation if st else "", carved_by=st.by if st else "",
                    carved_unix=st.carved_unix if st else 0.0)

    def plan(self, text: str, *, policy: Policy | None = None) -> Planned:
        """What ``carve`` would do (``text`` "": the served policy). Reads only."""
        text, policy = self._parse(text, policy)
        digest = policy_digest(text)
        with self.lock.shared("plan a carve", wait_s=self.wait_s):
            st = load_state(self.where.state_dir)
            result = plan_host(discover_for(policy, self.where), policy)
            already = st is not None and st.digest == digest
            if isinstance(result, NoFit):
                return Planned(digest, None, result, already_carved=already)
            unmovable: list = []
            steps = plan_steps(result, handles_for(self.where.root, exclusive=policy.io_service.exclusive),
                               unmovable)
            return Planned(digest, result, None, steps, [str(u) for u in unmovable],
                           vm_conflicts(result, self.vms.list()), already)

    def _compare(self, asker: Asker, *, target: str) -> None:
        """Refuse unless the host carries what ``asker`` expects, or already carries
        ``target`` ("": uncarved) by ``asker``'s own doing (a retry). Under the lock."""
        st = load_state(self.where.state_dir)
        current = st.digest if st else ""
        if asker.expected is None or asker.expected == current:
            return
        if st is None and target == "":
            return  # an uncarve that is done (ours or not: nothing is changed either way)
        if st is not None and target == current and st.operation == asker.operation:
            return  # a retry: this operation made exactly this carve
        raise CarveConflict(f"the host is {describe_carve(st)}, not "
                            f"{'uncarved' if not asker.expected else 'carved with ' + asker.expected} "
                            "as this request expects; nothing was changed", field="expected_digest")

    def carve(self, text: str, asker: Asker, *, digest: str | None = None, policy: Policy | None = None) -> Carved:
        """Carve the host for ``text`` (``policy``: already parsed by the caller, else
        parsed here), if it carries what ``asker`` expects. ``digest``: the sha256 the
        caller planned with (the RPC's; the command line read the text itself and gives
        none)."""
        asker.check()
        text, policy = self._parse(text, policy)
        own = policy_digest(text)
        if digest is not None and digest != own:
            raise DigestMismatch(f"{digest[:80] or '(none)'} is not the sha256 of the policy text "
                                 f"({own}): plan with the text you carve", field="policy_digest")
        with self._exclusive("carve"):
            self._compare(asker, target=own)
            layout = plan_host(discover_for(policy, self.where), policy)
            if isinstance(layout, NoFit):
                raise CarveNoFit(layout.reason, field=layout.field)
            conflicts = vm_conflicts(layout, self.vms.list())
            if conflicts:
                raise VmsWouldNotFit("; ".join(conflicts), field="vm_conflicts")
            try:
                out = carve(text, policy, layout, root=self.where.root, state_dir=self.where.state_dir,
                            operation=asker.operation, by=asker.by)
            except Exception as e:
                log.error("carve failed digest=%s error=%s", own[:12], e)
                detail = str(e) if isinstance(e, HostdError) else f"{type(e).__name__}: {e}"
                raise CarveFailed(f"{detail}; every step of this carve was undone",
                                  field=getattr(e, "field", None)) from e
            if self.on_served is not None:
                # Discover again: the carve made VFs (their PCI addresses are new VM devices).
                self._serve(Served(text, out.digest, policy, discover_for(policy, self.where), layout,
                                   CARVE_STATE))
            return out

    def uncarve(self, asker: Asker, *, drained: bool, dry_run: bool = False) -> list[Step]:
        """Undo the journal, newest first (``dry_run``: what would be undone), if the
        host carries what ``asker`` expects. Refused while VMs run, and while VMs exist
        unless ``drained``."""
        asker.check()
        hold = self.lock.shared("plan an uncarve", wait_s=self.wait_s) if dry_run else self._exclusive("uncarve")
        with hold:
            self._compare(asker, target="")
            vms = self.vms.list()
            busy = [f"{r.name} ({r.vm_id}, {r.state})" for r in vms if r.state in ON_HOST]
            if busy:
                raise VmsRunning(f"VMs are running: {', '.join(busy)}; drain the host first", field="vms")
            if vms and not drained:
                raise NotDrained("VMs exist (" + ", ".join(f"{r.name} ({r.vm_id}, {r.state})" for r in vms)
                                 + "): drain the host and say so (drained = true)", field="drained")
            if dry_run:
                return list(reversed(journal_steps(self.where.state_dir)))
            undone = uncarve_host(self.where.state_dir, self.where.root)
            log.info("uncarved operation=%s by=%s", asker.operation, asker.by)
            if self.on_served is not None:
                try:
                    served = served_policy(self.where, prefer_carved=False)
                except HostdError as e:  # keep serving what it served; a restart would refuse too
                    log.warning("uncarved, but the policy file cannot be served (%s): keeping the layout", e)
                else:
                    self._serve(served)
            return undone

    def _serve(self, served: Served) -> None:
        self.served = served
        assert self.on_served is not None
        try:
            self.on_served(served)
        except Exception:  # the carve is done; registration and the signal catch up on restart
            log.exception("after the carve: updating the daemon failed")
