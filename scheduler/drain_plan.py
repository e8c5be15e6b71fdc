"""What a drain may do to each VM on the hosts being drained, now: pure (no I/O).

Each VM says what maintenance may do to it (``on_maintenance``, like GCE's
onHostMaintenance): ``replace`` (a new VM from the same spec on another host; the old
one is deleted once the new one runs), ``stop``, ``migrate`` (moved live to another
host, its state kept; scheduler/service/migrations.py), or ``block`` (the fleet's default
unless the scheduler's config says otherwise: the drain waits for the VM's owner). VMs
may share a disruption budget (``group``, ``max_unavailable``, like Kubernetes'
PodDisruptionBudget): at most that many of the group's VMs are unavailable at once,
counting every VM of the group in the fleet that is not running, being replaced, being
moved live (until it runs on its target), or stopped for maintenance; VMs outside any
group move freely.

``plan`` answers, for every VM on a draining host, one step: start a replacement, stop
it, start its live move, or wait, with what it waits for, in words an operator reads.
It is called again after every change; a replacement that runs is followed by the old
VM's deletion, and one that failed (its hostd down, nowhere else to go) is deleted and
made again in the next round (``retry``), its move keeping the group's budget. ``budget_problem`` is the same budget rule for one VM an operator moves
by hand (``POST /v1/vms/{id}/migrate``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from api.states import DrainAction, OnMaintenance, VmStatus

ON_MAINTENANCE = tuple(OnMaintenance)
# A VM in these statuses holds nothing on its host: the drain has nothing to do with it.
DONE = {VmStatus.STOPPED: "stopped", VmStatus.FAILED: "failed: it holds nothing on the host"}
#: how a VM's ``reason`` starts while the drain cannot place its replacement (the drain
#: loop writes it, with when and why; ``plan`` shows it beside the step)
NOT_PLACED = "drain: no host for its replacement"
#: how the migration service's notes in a VM's ``reason`` start (one kind: a new one
#: replaces the last, a move that succeeds clears it, another reason stays)
MOVE_NOTE = "migration"
#: how a VM's ``reason`` starts after its live move failed or could not start (the VM
#: runs where it was; the target and hostd's or placement's answer follow; the next
#: drain round tries again, and ``plan`` shows it beside the step)
NOT_MOVED = MOVE_NOTE + " failed"


@dataclass(frozen=True)
class DrainVm:
    id: str
    name: str
    host: str | None
    status: str  # a VmStatus
    on_maintenance: str = OnMaintenance.BLOCK
    group: str = ""
    max_unavailable: int = 0
    replaces: str = ""  # this VM is the replacement of that VM id
    reason: str = ""    # the scheduler's reason on the VM (a NOT_PLACED note is shown)
    moving_to: str = ""  # a live move under way: its target host (it runs on ``host`` until done)


@dataclass(frozen=True)
class Step:
    vm: str
    name: str
    action: DrainAction
    why: str


def _unavailable(vms: list[DrainVm]) -> Counter[str]:
    """Per group, its VMs that are not serving: not running, or a replacement under way
    (the VM it replaces counts once, as the move's one unavailable member)."""
    moving = {v.replaces for v in vms if v.replaces}
    out: Counter[str] = Counter()
    for v in vms:
        if not v.group or v.replaces:
            continue
        if v.id in moving or v.status != VmStatus.RUNNING or v.moving_to:
            out[v.group] += 1
    return out


def budget_problem(vm: DrainVm, vms: list[DrainVm]) -> str:
    """Why ``vm`` may not be made unavailable now (its group's budget is spent by the
    others of ``vms``, every VM of its group), "" when it may: the drain's rule, for a
    move asked by hand."""
    if not vm.group:
        return ""
    down = _unavailable([v for v in vms if v.id != vm.id])
    if down[vm.group] >= vm.max_unavailable:
        return (f"group {vm.group}: {down[vm.group]} of its VMs unavailable, "
                f"max_unavailable = {vm.max_unavailable}")
    return ""


def plan(draining: set[str], vms: list[DrainVm]) -> list[Step]:
    """One step per VM on a ``draining`` host (``vms``: every VM of the fleet that shares a
    group with one of them, and the replacements under way), in a stable order."""
    down = _unavailable(vms)
    replacement = {v.replaces: v for v in vms if v.replaces}
    steps: list[Step] = []
    for v in sorted((v for v in vms if v.host in draining and not v.replaces), key=lambda v: (v.group, v.name)):
        if v.status in DONE:
            steps.append(Step(v.id, v.name, DrainAction.DONE, DONE[v.status]))
            continue
        if v.status == VmStatus.DELETING:  # a stop under way (its budget is spent): go on with it
            steps.append(Step(v.id, v.name, DrainAction.STOP, "being stopped for the drain"))
            continue
        if v.moving_to:  # under way (or to be resumed or undone by the migration service)
            steps.append(Step(v.id, v.name, DrainAction.WAIT, f"moving live to {v.moving_to}"))
            continue
        new = replacement.get(v.id)
        if new is not None:
            if new.status == VmStatus.RUNNING:
                steps.append(Step(v.id, v.name, DrainAction.DELETE_OLD,
                                  f"its replacement {new.id} runs on {new.host}"))
            elif new.status == VmStatus.FAILED:  # deleted now, replaced again next round (its budget kept)
                steps.append(Step(v.id, v.name, DrainAction.RETRY, f"its replacement {new.id} failed"
                                                                   + (f" ({new.reason})" if new.reason else "")
                                                                   + ": deleted, and replaced again"))
            else:
                steps.append(Step(v.id, v.name, DrainAction.WAIT, f"its replacement {new.id} is {new.status}"
                                                                  + (f" on {new.host}" if new.host else "")))
            continue
        if v.on_maintenance == OnMaintenance.BLOCK:
            steps.append(Step(v.id, v.name, DrainAction.WAIT,
                              "on_maintenance = block: its owner moves or deletes it"))
            continue
        if v.status != VmStatus.RUNNING:
            steps.append(Step(v.id, v.name, DrainAction.WAIT, f"it is {v.status}: the drain moves it once it runs"))
            continue
        if v.group and down[v.group] >= v.max_unavailable:
            steps.append(Step(v.id, v.name, DrainAction.WAIT, f"group {v.group}: {down[v.group]} of its VMs "
                                                              f"unavailable, max_unavailable = {v.max_unavailable}"))
            continue
        if v.group:
            down[v.group] += 1  # this move takes one of the budget
        why = "on_maintenance = " + v.on_maintenance
        if (v.on_maintenance == OnMaintenance.REPLACE and v.reason.startswith(NOT_PLACED)) or \
                (v.on_maintenance == OnMaintenance.MIGRATE and v.reason.startswith(NOT_MOVED)):
            why += f"; {v.reason}"
        act = {OnMaintenance.REPLACE: DrainAction.REPLACE, OnMaintenance.MIGRATE: DrainAction.MIGRATE}.get(
            OnMaintenance(v.on_maintenance), DrainAction.STOP)
        steps.append(Step(v.id, v.name, act, why))
    return steps
