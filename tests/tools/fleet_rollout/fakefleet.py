"""An in-memory fleet for the engine's logic tests: each fake host keeps what hostd
keeps (carved digest, journal, VMs, an IO-health history) and counts every side
effect, so a test can say "carved exactly once" after any number of controller
crashes. The real fleet (real hostd processes on host trees) is tests/fleet/."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

from tools.fleet_rollout.clients import HostInfo, HostRefused, HostUnreachable, SchedulerError, SchedulerUnreachable
from tools.fleet_rollout.gates import Sample


class Crash(BaseException):
    """The controller process died (everything after it must not run)."""


@dataclass
class FakeHost:
    digest: str = ""
    policy: str = ""
    operation: str = ""  # who made the carve (hostd's compare-and-set, as in carve_service)
    carves: int = 0  # carves that changed the host
    uncarves: int = 0
    psi: float = 1.0
    degraded_after_carve: bool = False
    broken_carve: bool = False
    unreachable: bool = False
    started: float = field(default_factory=time.time)
    # the IO-health history stats plays back: the level before the first change, then
    # (since, level) for each change made through set_psi
    before: float | None = None
    changes: list[tuple[float, float]] = field(default_factory=list)

    def set_psi(self, psi: float) -> None:
        if not self.changes:
            self.before = self.psi
        self.psi = psi
        self.changes.append((time.time(), psi))

    def psi_at(self, t: float) -> float:
        """The PSI level the host had at ``t``."""
        for since, level in reversed(self.changes):
            if since <= t:
                return level
        return self.psi if self.before is None else self.before


class FakeFleet:
    """Plays HostdClients and Scheduler for the engine."""

    def __init__(self, names: list[str]):
        self.hosts = {n: FakeHost() for n in names}
        self.admin = dict.fromkeys(names, "active")
        self.admin_owner = dict.fromkeys(names, "")
        self.admin_log: list[tuple[str, str, str]] = []  # (host, state, owner) of every admin change taken
        self.crash_at: int | None = None  # crash the controller at the N-th side effect
        self.effects = 0
        self.dead = False
        self.scheduler_down = False  # every scheduler call gets no answer
        self.fleet_rise_at_carve: float | None = None  # every host's PSI goes to this at the next carve
        self.lock = threading.Lock()

    def _h(self, address: str) -> FakeHost:
        if self.dead:
            raise Crash()
        h = self.hosts[address.split(":")[0]]
        if h.unreachable:
            raise HostUnreachable(f"{address}: unavailable")
        return h

    def _effect(self) -> None:
        """A side effect happened; maybe the controller dies right after it."""
        with self.lock:
            self.effects += 1
            if self.crash_at is not None and self.effects >= self.crash_at:
                self.dead = True
                raise Crash()

    # HostdClients
    def info(self, address: str) -> HostInfo:
        h = self._h(address)
        return HostInfo("0.1.0", h.digest, 3 if h.digest else 0, [], 0, 0, h.started, h.policy, h.operation,
                        "fleet-rollout" if h.operation else "")

    @staticmethod
    def _compare(h: FakeHost, expected: str, target: str, operation: str) -> None:
        if expected == h.digest or (target == "" == h.digest) or (target == h.digest and operation == h.operation):
            return
        raise HostRefused(f"hyb.carve.conflict [expected_digest]: the host is carved with {h.digest} "
                          f"(operation {h.operation}), not {expected!r}")

    def carve(self, address: str, policy: str, digest: str, *, expected: str, operation: str) -> SimpleNamespace:
        h = self._h(address)
        if h.broken_carve:
            raise HostRefused("hyb.carve.failed [hugepages]: write refused; rolled back")
        self._compare(h, expected, digest, operation)
        changed = h.digest != digest
        h.operation = operation
        if changed:
            h.digest, h.policy = digest, policy
            h.carves += 1
            if h.degraded_after_carve:
                h.set_psi(30.0)
            if self.fleet_rise_at_carve is not None:  # load rose across the fleet, carve or not
                for other in self.hosts.values():
                    other.set_psi(self.fleet_rise_at_carve)
                self.fleet_rise_at_carve = None
            self._effect()
        return SimpleNamespace(changed=changed, steps=["x"] * 3 if changed else [], cannot_move=[],
                               reboot_required=[])

    def uncarve(self, address: str, *, drained: bool, expected: str, operation: str) -> SimpleNamespace:
        h = self._h(address)
        self._compare(h, expected, "", operation)
        if h.digest:
            h.digest = h.policy = h.operation = ""
            h.uncarves += 1
            h.set_psi(1.0)
            self._effect()
        return SimpleNamespace(steps=[])

    def stats(self, address: str, last: int) -> tuple[float, list[Sample]]:
        h = self._h(address)
        rnd = random.Random(hash(address))
        now = time.time()
        times = [now - i * 0.05 for i in range(min(last, 200))][::-1]
        return 0.05, [Sample(t, max(0.0, h.psi_at(t) + rnd.gauss(0, 0.2)), None, 0.0, 0) for t in times]

    def vm_ids(self, address: str) -> set[str]:
        self._h(address)
        return set()

    def close(self) -> None:
        pass

    # Scheduler
    def _sched(self) -> None:
        if self.dead:
            raise Crash()
        if self.scheduler_down:
            raise SchedulerUnreachable("scheduler GET /v1/hosts: connection refused")

    def host(self, name: str) -> dict:
        self._sched()
        return {"admin_state": self.admin[name], "admin_owner": self.admin_owner[name] or None}

    def set_state(self, name: str, state: str, *, rollout: str, fence: int, reason: str = "") -> None:
        """The scheduler's rule: the rollout's hold is rollout:<name> (the fence is the
        scheduler's to check: tests/scheduler/api/); another owner's hold is refused
        (scheduler/service/hosts.py)."""
        self._sched()
        owner = f"rollout:{rollout}"
        if self.admin[name] != "active" and self.admin_owner[name] not in ("", owner):
            raise SchedulerError(f"{name} is {self.admin[name]} by {self.admin_owner[name]}",
                                 "hyb.host.admin_owned")
        self.admin_log.append((name, state, owner))
        self.admin_owner[name] = "" if state == "active" else owner
        if self.admin[name] != state:
            self.admin[name] = state
            self._effect()
