"""The closed sets of state names, one ``enum.StrEnum`` each.

They live in ``api/`` because every side speaks them and ``api/`` is the one package
all sides may import (``tests/test_import_direction.py``): the scheduler stores them,
serves them in its REST schema (``api/openapi.json`` lists the same values), counts
them in its metrics and shows them in its console; ``hybctl`` and ``fleet-rollout``
read and write them over HTTP. A member is its value (``AdminState.DRAINING ==
"draining"``, ``str(AdminState.DRAINING) == "draining"``), so database columns, JSON
bodies, metric labels and templates carry plain text, and a new member reaches every
list of the set at once. ``tests/api/test_states_home.py`` fails when a module of ours
spells one of these states as a literal (in a comparison, a collection, a default)
instead of importing it from here.

Rules about states (which rollouts hold hosts, which VM statuses hold resources, when
a host is down) stay with the code that owns the rule; they name the members here.
"""

from __future__ import annotations

from enum import StrEnum


class AdminState(StrEnum):
    """A host's admin state, set by an operator or a rollout (cordon, drain, uncordon):
    only an active host takes new VMs; a draining one also has its VMs moved away."""

    ACTIVE = "active"
    CORDONED = "cordoned"
    DRAINING = "draining"


class HostState(StrEnum):
    """What a host is: its admin state, or down when its heartbeats stopped (a down host
    keeps its admin state, which shows again when it beats)."""

    ACTIVE = "active"
    CORDONED = "cordoned"
    DRAINING = "draining"
    DOWN = "down"


class VmStatus(StrEnum):
    """A VM's status in the scheduler: pending (placed, not yet sent to its hostd),
    creating (its hostd is creating it), running, failed, deleting (being shut down on
    its hostd), stopped (shut down for good, its record kept; it holds nothing)."""

    PENDING = "pending"
    CREATING = "creating"
    RUNNING = "running"
    FAILED = "failed"
    DELETING = "deleting"
    STOPPED = "stopped"


class RolloutState(StrEnum):
    """A fleet rollout's state (the scheduler keeps it, `fleet-rollout` drives it)."""

    RUNNING = "running"
    PAUSED = "paused"
    HALTED = "halted"
    ABORTING = "aborting"
    ABORTED = "aborted"
    ROLLING_BACK = "rolling_back"
    ROLLED_BACK = "rolled_back"
    DONE = "done"


class RolloutHostState(StrEnum):
    """A host's state in a rollout, in the order a host goes through them
    (``tools/fleet_rollout/engine.py`` tells the machine): each names the step still to
    do on it."""

    PENDING = "pending"
    BASELINED = "baselined"
    CORDONED = "cordoned"
    CARVING = "carving"
    DRAINING = "draining"
    REBOOTING = "rebooting"
    SOAKING = "soaking"
    RESTORING = "restoring"
    VERIFIED = "verified"
    SKIPPED = "skipped"
    FAILED = "failed"
    ROLLING_BACK = "rolling_back"
    ROLLED_BACK = "rolled_back"


class HostClass(StrEnum):
    """What an operator asks first about a host (`GET /v1/fleet/hosts`): down, failed
    by its active rollout, being converted by one, held out of active, carved, or not."""

    UNCONVERTED = "unconverted"
    CONVERTING = "converting"
    CARVED = "carved"
    CORDONED = "cordoned"
    DOWN = "down"
    FAILED = "failed"


class OnMaintenance(StrEnum):
    """What a drain of its host may do to a VM (its request's ``on_maintenance``, like
    GCE's onHostMaintenance): replace it (a new VM from the same request elsewhere), stop
    it, move it live to another host (migrate), or wait for its owner (block). A request
    that does not say gets the fleet's default (the scheduler's ``drain.on_maintenance``)."""

    REPLACE = "replace"
    STOP = "stop"
    BLOCK = "block"
    MIGRATE = "migrate"


class MigrationState(StrEnum):
    """Where a VM's live move stands in the scheduler (``vms.migration_state``; "" when
    none runs): preparing (the target is claimed, hostd's PrepareMigration may have been
    sent), migrating (the source's MigrateVM may have been sent: the VM runs on one of
    the two, and which one is asked of both hostds before anything is undone)."""

    PREPARING = "preparing"
    MIGRATING = "migrating"


class MigrationPhase(StrEnum):
    """What a live move is doing now, as the scheduler shows it (``migration.phase``):
    preparing (the target is being claimed and prepared), starting (MigrateVM went to the
    source, its job not sampled yet), disks (the job copies the raw disks: disk bytes
    remain), memory (the disks are mirrored, memory is copied until the rest fits the
    downtime), settling (the job is over: the move is being completed on the target, or
    undone). ``scheduler/migration_view.py`` ``phase_of`` is the rule."""

    PREPARING = "preparing"
    STARTING = "starting"
    DISKS = "disks"
    MEMORY = "memory"
    SETTLING = "settling"


class MigrationResult(StrEnum):
    """How a live move ended (a VM's ``last_migration.result``, the audit's ``vm.migrate``
    result, ``hyb_sched_migrations_total``'s label with ``started``): done (it runs on the
    target) or failed (undone: it runs on the source)."""

    DONE = "done"
    FAILED = "failed"


class DrainAction(StrEnum):
    """What a drain does next to a VM on a draining host (`GET /v1/hosts/{name}/drain`)."""

    REPLACE = "replace"
    STOP = "stop"
    MIGRATE = "migrate"
    RETRY = "retry"  # a replacement failed: it is deleted, and the next round replaces again
    DELETE_OLD = "delete_old"
    WAIT = "wait"
    DONE = "done"


class VfMigration(StrEnum):
    """How a VM's SR-IOV VF takes a live move (a VF request's ``migration``; hostd.proto
    ``VfMigration``). A passed-through function cannot be migrated, so a VM moves live
    only when each VF says how: ``failover`` (created with QEMU's virtio-net failover
    pair: a virtio-net standby on the host's failover bridge, the VF as its primary with
    the same MAC; the guest's net_failover driver keeps the traffic on the standby while
    the VF is unplugged for the move, and the target plugs its own VF), ``interrupt``
    (the VM accepts losing its VF for the move: hostd unplugs it on the source, the target
    plugs its own after arrival) or ``none`` (the default: refused, naming the field)."""

    NONE = "none"
    FAILOVER = "failover"
    INTERRUPT = "interrupt"
