"""The controller: drives each host through its states, wave by wave, and survives
its own death.

Per host: pending -> baselined -> cordoned -> carving [-> draining -> carving]
[-> rebooting] -> soaking -> restoring -> verified, or -> failed -> rolling_back ->
rolled_back, or pending/baselined -> skipped (another owner holds the host). A carve
that hostd refuses because it would strand the host's VMs (hyb.carve.vms_would_not_fit;
nothing changed) drains the host through the scheduler, which moves the VMs as each
allows (on_maintenance, disruption budgets), and carves again once it is drained; a
drain that does not finish in ``steps.drain_timeout_s`` fails the host with what it
waits for. Each state names the step still to do; a
step's side effect is idempotent (cordon; Carve by policy digest and operation id; a
reboot is detected by hostd's start time, never redone) and its transition is written
after it, with what it measured. So a controller SIGKILLed anywhere redoes at most the
step it was in, which then changes nothing, and never skips one.

One owner per host change. The rollout cordons as ``rollout:<name>`` (the scheduler
derives that owner from the fence of the lease this run took) and takes only a host
nobody else holds (another owner's cordon skips the host; it is never taken as the
state to restore). Carve and Uncarve are compare-and-sets on the digest recorded at
the baseline, under the operation ``rollout/<name>/<host>/carve``: a host changed by
someone else meanwhile is refused by hostd, a host is verified only after reading back
the rollout's own carve, and a rollback reads whose carve it is before it drains
anything and undoes only a carve that is still its own (otherwise it reports who
changed it and leaves the host alone, undrained).

Outages pause, they do not fail: a hostd or scheduler that does not answer for
``limits.unreachable_s`` holds the host where it is and pauses the rollout with the
reason; a gate that passed is kept (``restoring``), and ``resume`` carries on.

The rollout: one wave at a time; at most ``limits.concurrency`` hosts in flight and
``limits.per_rack`` per rack; a wave whose failures exceed its budget halts the
rollout; a gate that cannot decide pauses it. Operators pause, resume, abort and roll
back through the store (tools/fleet_rollout/cli.py); a running controller sees that
at its next step boundary.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from api.states import AdminState, DrainAction, RolloutHostState, RolloutState
from tools.fleet_rollout.clients import (
    HostdClients,
    HostError,
    HostInfo,
    HostRefused,
    HostUnreachable,
    Scheduler,
    SchedulerError,
    SchedulerUnreachable,
    run_hook,
)
from tools.fleet_rollout.gates import Sample, Verdict, judge, judgeable
from tools.fleet_rollout.spec import RolloutSpec
from tools.fleet_rollout.store import HostRow, LeaseLost, StaleState, Store, StoreError, StoreUnavailable

log = logging.getLogger(__name__)

DONE = (RolloutHostState.VERIFIED, RolloutHostState.ROLLED_BACK, RolloutHostState.SKIPPED)
FAILED = (RolloutHostState.FAILED, RolloutHostState.ROLLING_BACK, RolloutHostState.ROLLED_BACK)
# The rollout states in which the controller drives hosts.
ACTIVE = (RolloutState.RUNNING, RolloutState.ABORTING, RolloutState.ROLLING_BACK)
ROLLBACK_FROM = (RolloutHostState.BASELINED, RolloutHostState.CORDONED, RolloutHostState.CARVING,
                 RolloutHostState.DRAINING, RolloutHostState.REBOOTING, RolloutHostState.SOAKING,
                 RolloutHostState.RESTORING, RolloutHostState.VERIFIED)


class Pause(Exception):
    """Stop driving this host and pause the rollout (a gate could not decide)."""


class Stop(Exception):
    """The rollout is no longer running: leave the host where it is."""


def owner_of(rollout: str) -> str:
    """Who the scheduler's cordons of this rollout name."""
    return f"rollout:{rollout}"


def operation_of(rollout: str, host: str, step: str) -> str:
    """The operation id of this rollout's carve (``step`` "carve") or rollback of a host:
    the same on every retry, so hostd knows a retry of a done carve."""
    return f"rollout/{rollout}/{host}/{step}"


@dataclass
class Options:
    lease_ttl_s: float = 15.0
    poll_s: float = 0.5
    stats_wait_s: float = 30.0  # how long a baseline/soak may wait for samples beyond its window


class Engine:
    def __init__(self, store: Store, name: str, hostd: HostdClients, scheduler: Scheduler | None,
                 opts: Options | None = None, on_event: Callable[[str, str, str], None] | None = None):
        self.store = store
        self.name = name
        self.hostd = hostd
        self.scheduler = scheduler
        self.opts = opts or Options()
        self.spec: RolloutSpec = store.rollout(name).spec
        self.on_event = on_event or (lambda host, frm, to: None)
        self._lost = threading.Event()
        self._seen = ("", 0, 0.0)  # the rollout's (state, wave) and when it was read
        self._seen_lock = threading.Lock()
        # Hosts whose rollback failed before (unreachable, refused) get one more try per run
        # when the operator rolls back or aborts: that is how they ask to retry.
        self._retried: set[str] = set()
        self.steps = 0  # host steps taken (the bench divides CPU by it)
        self.owner = owner_of(name)
        # A host as its last transition wrote it: its driver's next step reads no more
        # (one thread drives a host at a time).
        self._written: dict[str, HostRow] = {}

    # ---------------------------------------------------------------- the rollout

    def run(self) -> str:
        """Drive the rollout until it is done, halted, paused, aborted or rolled back;
        return that state. Holds the lease meanwhile (LeaseHeld if another run does)."""
        self.store.acquire(self.name, self.opts.lease_ttl_s)
        # Rollbacks that could not finish before (refused, no answer): each run tries them
        # once more, whichever command started it (resume repairs a done rollout too).
        self._unfinished = {h.name for h in self.store.brief(self.name)
                            if h.state == RolloutHostState.FAILED and h.data.get("rollback_failed")}
        stop_renew = threading.Event()
        renewer = threading.Thread(target=self._renew, args=(stop_renew,), name="lease", daemon=True)
        renewer.start()
        try:
            return self._loop()
        finally:
            stop_renew.set()
            renewer.join()
            if not self._lost.is_set():
                try:
                    self.store.release(self.name)
                except StoreError as e:  # it lapses after its TTL instead
                    log.error("could not release the lease of %s (it lapses in %.0f s): %s", self.name,
                              self.opts.lease_ttl_s, e)

    def _renew(self, stop: threading.Event) -> None:
        while not stop.wait(self.opts.lease_ttl_s / 3):
            try:
                self.store.renew(self.name, self.opts.lease_ttl_s)
            except LeaseLost:
                log.error("lost the lease of %s: stopping", self.name)
                self._lost.set()
                return
            except StoreUnavailable as e:  # the next renewal may get through; writes are fenced anyway
                log.warning("could not renew the lease of %s: %s", self.name, e)

    def _rollout_state(self) -> tuple[str, int]:
        """The rollout's (state, wave), read at most once per poll interval however many
        host threads ask (an operator's pause is seen within it)."""
        with self._seen_lock:
            state, wave, at = self._seen
            if time.monotonic() - at >= self.opts.poll_s:
                state, wave = self.store.state(self.name)
                self._seen = (state, wave, time.monotonic())
            return state, wave

    def _set_rollout(self, state: str, reason: str = "", **kw) -> None:  # type: ignore[no-untyped-def]
        """The controller's rollout-level transition, from the state it decided on
        (``expect``): StaleState if an operator changed it meanwhile."""
        try:
            self.store.set_rollout(self.name, state, reason, **kw)
        finally:
            with self._seen_lock:
                self._seen = ("", 0, 0.0)

    def _state(self) -> str:
        return "lost" if self._lost.is_set() else self._rollout_state()[0]

    def _loop(self) -> str:
        pool = ThreadPoolExecutor(max_workers=self.spec.limits.concurrency, thread_name_prefix="host")
        running: dict[str, Future] = {}
        # What the hosts were last listed under: (state, wave, the hosts being driven). The
        # work can change only when one of these does (a driver ends, an operator's
        # command), so the list is not read again until then.
        listed: tuple[str, int, frozenset[str]] | None = None
        try:
            while True:
                for n in [n for n, f in running.items() if f.done()]:
                    running.pop(n).result()  # a bug in a driver surfaces here, not silently
                state, wave = self._rollout_state()
                if self._lost.is_set():
                    return "lost"
                if state not in ACTIVE:
                    if running:  # let in-flight hosts reach a step boundary
                        self._until_one_ends(running)
                        continue
                    return state
                if running and listed == (state, wave, frozenset(running)):
                    self._until_one_ends(running)
                    continue
                hosts = self._work(state, wave)
                if not hosts and not running:
                    try:
                        nxt = self._next(state, wave)
                    except StaleState:  # an operator's command came first: read it
                        continue
                    if nxt is not None:
                        return nxt
                    continue
                self._dispatch(hosts, running, pool)
                listed = (state, wave, frozenset(running))
                self._until_one_ends(running)
        finally:
            pool.shutdown(wait=True)

    def _until_one_ends(self, running: dict[str, Future]) -> None:
        """Wait for a host's driver to end, at most a poll interval (the rollout's state
        is read again after it)."""
        if running:
            wait(list(running.values()), timeout=self.opts.poll_s, return_when=FIRST_COMPLETED)
        else:
            time.sleep(self.opts.poll_s)

    def _work(self, state: str, wave: int) -> list[HostRow]:
        """The hosts that still need driving, in order."""
        if state == RolloutState.RUNNING:
            todo = [h for h in self.store.brief(self.name, wave=wave)
                    if h.state not in DONE
                    and not (h.state == RolloutHostState.FAILED and h.data.get("rollback_failed"))]
            again = self._unfinished - self._retried
            if again:
                todo += [h for h in self.store.brief(self.name)
                         if h.name in again and h.state == RolloutHostState.FAILED]
            return todo

        def retry(h: HostRow) -> bool:
            return not h.data.get("rollback_failed") or h.name not in self._retried
        if state == RolloutState.ABORTING:  # hosts mid-change go back; verified ones stay
            return [h for h in self.store.brief(self.name)
                    if h.state in ROLLBACK_FROM[:-1] + (RolloutHostState.FAILED, RolloutHostState.ROLLING_BACK)
                    and retry(h)]
        # rolling_back: the whole rollout, newest wave first
        todo = [h for h in self.store.brief(self.name)
                if h.state in ROLLBACK_FROM + (RolloutHostState.FAILED, RolloutHostState.ROLLING_BACK) and retry(h)]
        if not todo:
            return []
        last = max(h.wave for h in todo)
        return [h for h in todo if h.wave == last]

    def _next(self, state: str, wave: int) -> str | None:
        """Nothing left in this wave: the next wave, or the rollout's end (returned)."""
        if state == RolloutState.ABORTING:
            self._set_rollout(RolloutState.ABORTED, "aborted by the operator; hosts mid-change rolled back",
                              expect=state)
            return RolloutState.ABORTED
        if state == RolloutState.ROLLING_BACK:
            stuck = [h.name for h in self.store.brief(self.name)
                     if h.state == RolloutHostState.FAILED and h.data.get("rollback_failed")]
            final = RolloutState.ROLLED_BACK if not stuck else RolloutState.HALTED
            self._set_rollout(final, f"could not roll back: {', '.join(stuck)}" if stuck else "", expect=state)
            return final
        hosts = self.store.brief(self.name, wave=wave)
        failures = sum(1 for h in hosts if h.state in FAILED)
        budget = self.spec.max_failures(wave)
        if failures > budget:
            why = f"wave {wave}: {failures} failed hosts, over its budget of {budget}"
            self._set_rollout(RolloutState.HALTED, why, detail={"failed": [h.name for h in hosts if h.state in FAILED]},
                              expect=state)
            return RolloutState.HALTED
        r = self.store.rollout(self.name)
        if wave + 1 < r.waves:
            self._set_rollout(RolloutState.RUNNING, wave=wave + 1, detail={"wave_done": wave, "failed": failures},
                              expect=state)
            return None
        skipped = [h.name for h in self.store.brief(self.name) if h.state == RolloutHostState.SKIPPED]
        self._set_rollout(RolloutState.DONE, expect=state, reason=f"{r.waves} waves" + (
            f"; {len(skipped)} hosts skipped (another owner's): {', '.join(skipped[:10])}"
            + (" ..." if len(skipped) > 10 else "") if skipped else ""))
        return RolloutState.DONE

    def _dispatch(self, hosts: list[HostRow], running: dict[str, Future], pool: ThreadPoolExecutor) -> None:
        racks = Counter(h.rack for h in hosts if h.name in running)
        cap = self.spec.limits.concurrency
        # Hosts already mid-way (a resumed run) first: they hold a rack's slot anyway.
        for h in sorted(hosts, key=lambda h: (h.state == RolloutHostState.PENDING, h.seq)):
            if len(running) >= cap:
                break
            if h.name in running or racks[h.rack] >= self.spec.limits.per_rack:
                continue
            racks[h.rack] += 1
            running[h.name] = pool.submit(self._drive, h.name)

    # ---------------------------------------------------------------- one host

    def _drive(self, host: str) -> None:
        try:
            while True:
                st = self._state()
                if st not in ACTIVE:
                    return
                h = self._written.pop(host, None) or self.store.host(self.name, host)
                step = self._step_for(st, h)
                if step is None:
                    return
                self.steps += 1
                step(h)
        except (Stop, LeaseLost, StaleState) as e:
            log.info("%s: %s", host, e)
        except Pause as e:
            try:
                self._set_rollout(RolloutState.PAUSED, str(e), expect=RolloutState.RUNNING)
            except StaleState:
                log.info("%s: not paused (%s): the rollout is no longer running", host, e)

    def _step_for(self, rollout_state: str, h: HostRow) -> Callable[[HostRow], None] | None:
        undoing = rollout_state in (RolloutState.ABORTING, RolloutState.ROLLING_BACK)
        if h.data.get("rollback_failed") and h.state == RolloutHostState.FAILED:
            if h.name in self._retried:
                return None
            self._retried.add(h.name)
            return self._begin_rollback
        if undoing and h.state in ROLLBACK_FROM + (RolloutHostState.FAILED,):
            return self._begin_rollback
        return {RolloutHostState.PENDING: self._baseline, RolloutHostState.BASELINED: self._cordon,
                RolloutHostState.CORDONED: self._begin_change, RolloutHostState.CARVING: self._change,
                RolloutHostState.DRAINING: self._drain, RolloutHostState.REBOOTING: self._await_reboot,
                RolloutHostState.SOAKING: self._soak,
                RolloutHostState.RESTORING: self._restore, RolloutHostState.FAILED: self._begin_rollback,
                RolloutHostState.ROLLING_BACK: self._rollback}.get(h.state)

    def _move(self, h: HostRow, to: str, detail: dict | None = None, data: dict | None = None) -> None:
        self._written[h.name] = self.store.move(self.name, h.name, h.state, to, detail, data)
        self.on_event(h.name, h.state, to)

    def _fail(self, h: HostRow, why: str, detail: dict | None = None) -> None:
        log.warning("%s failed in %s: %s", h.name, h.state, why)
        self._move(h, RolloutHostState.FAILED, {"step": h.state, "reason": why, **(detail or {})},
                   {"failed_in": h.state})

    def _wait(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if self._state() not in ACTIVE:
                raise Stop("the rollout is no longer running")
            time.sleep(min(left, self.opts.poll_s))

    def _rpc(self, fn: Callable, *args, **kw):  # type: ignore[no-untyped-def,type-arg]
        """A hostd or scheduler call, retried while it gets no answer (or a 5xx), for
        limits.unreachable_s: a restarting hostd, a scheduler replica going away. Past
        that, a running rollout pauses with the reason (the host stays where it is); a
        rollback or an abort records the host's rollback as failed, which the operator's
        next rollback or abort retries."""
        end = time.monotonic() + self.spec.limits.unreachable_s
        while True:
            try:
                return fn(*args, **kw)
            except (HostUnreachable, SchedulerUnreachable) as e:
                if time.monotonic() >= end:
                    if self._state() == RolloutState.RUNNING:
                        raise Pause(f"no answer for {self.spec.limits.unreachable_s:.0f} s: {e}") from None
                    raise
                self._wait(1.0)

    def _admin(self, name: str, state: str) -> None:
        """Cordon, drain or uncordon as this rollout, under the fence of its lease (the
        scheduler records the hold as ``rollout:<name>``, and refuses a lost lease)."""
        if self.scheduler:
            self._rpc(self.scheduler.set_state, name, state, rollout=self.name, fence=self.store.fence,
                      reason=f"fleet-rollout {self.name} ({self.spec.kind})")

    def _end_hold(self, name: str) -> None:
        """Uncordon the host if this rollout holds it (a host it gave back, or another
        owner's, is left as it is)."""
        if self.scheduler:
            admin = self._rpc(self.scheduler.host, name)
            held = admin.get("admin_state", AdminState.ACTIVE) != AdminState.ACTIVE
            if held and admin.get("admin_owner") == self.owner:
                self._admin(name, AdminState.ACTIVE)

    def _held_by_other(self, admin: dict) -> str:
        """Why the scheduler's host is not ours to take ("" if it is): another owner's
        cordon or drain (an unowned one counts: nobody can say it is over)."""
        if admin.get("admin_state", AdminState.ACTIVE) == AdminState.ACTIVE or admin.get("admin_owner") == self.owner:
            return ""
        since = admin.get("admin_since")
        when = time.strftime(" since %Y-%m-%dT%H:%M:%SZ", time.gmtime(since)) if since else ""
        reason = f": {admin['admin_reason']}" if admin.get("admin_reason") else ""
        return f"{admin['admin_state']} by {admin.get('admin_owner') or '(no owner recorded)'}{when}{reason}"

    def _skip(self, h: HostRow, why: str) -> None:
        """Leave a host another owner holds as it is (nothing was changed on it)."""
        log.warning("%s skipped: %s", h.name, why)
        self._move(h, RolloutHostState.SKIPPED, {"reason": why})

    def _baseline(self, h: HostRow) -> None:
        try:
            info = self._rpc(self.hostd.info, h.address)
            admin = self._rpc(self.scheduler.host, h.name) if self.scheduler else {}
            held = self._held_by_other(admin)
            if held:
                return self._skip(h, f"the host is {held}")
            if self.spec.kind == "convert" and info.carved_digest not in ("", self.spec.policy_digest):
                # converted by someone else since the plan: a conversion is not theirs to redo
                return self._skip(h, f"converted since the plan: the host is {info.carve_owner()}")
            base = self._window(h, self.spec.steps.baseline_s, since=None)
            vms = sorted(self._rpc(self.hostd.vm_ids, h.address)) if self.spec.kind == "hostd" else []
        except (HostError, SchedulerError) as e:
            return self._fail(h, str(e))
        self._move(h, RolloutHostState.BASELINED, {"samples": len(base), "hostd": info.to_dict(),
                                    "admin_state": admin.get("admin_state", "")},
                   {"prior_digest": info.carved_digest, "prior_policy": info.carved_policy,
                    "prior_started": info.started, "prior_version": info.version, "vms": vms,
                    "baseline": [s.to_dict() for s in base]})

    def _cordon(self, h: HostRow) -> None:
        try:
            self._admin(h.name, AdminState.CORDONED)
        except SchedulerError as e:
            if e.code == "hyb.host.admin_owned":  # taken since the baseline: not ours to change
                return self._skip(h, str(e))
            return self._fail(h, str(e))
        self._move(h, RolloutHostState.CORDONED)

    def _begin_change(self, h: HostRow) -> None:
        # The intent is written before the side effect: a resumed run in "carving" asks
        # hostd again, and hostd's idempotency (digest, version) says whether it happened.
        self._move(h, RolloutHostState.CARVING, data={"change_started": time.time()})

    def _change(self, h: HostRow) -> None:
        if self.spec.kind == "hostd":
            return self._upgrade(h)
        try:
            r = self._rpc(self.hostd.carve, h.address, self.spec.policy_text, self.spec.policy_digest,
                          expected=h.data.get("prior_digest", ""), operation=operation_of(self.name, h.name, "carve"))
            mine = self._own_carve(h)
        except HostRefused as e:
            if e.code == "hyb.carve.vms_would_not_fit" and self.scheduler and self.spec.steps.drain_timeout_s > 0:
                return self._begin_drain(h, str(e))
            return self._fail(h, f"carve: {e}")
        except HostError as e:
            return self._fail(h, f"carve: {e}")
        if mine:
            return self._fail(h, f"carve: {mine}")
        detail = {"changed": r.changed, "steps": len(r.steps), "cannot_move": list(r.cannot_move),
                  "reboot_required": list(r.reboot_required)}
        if r.reboot_required and self.spec.steps.reboot_command:
            return self._move(h, RolloutHostState.REBOOTING, detail)
        self._move(h, RolloutHostState.SOAKING, detail, {"soak_since": time.time()})

    def _begin_drain(self, h: HostRow, why: str) -> None:
        """The carve would strand VMs: hold the host draining (as this rollout; it was
        cordoned by it) so the scheduler moves them."""
        try:
            self._admin(h.name, AdminState.DRAINING)
        except SchedulerError as e:
            return self._fail(h, f"drain: {e}")
        log.info("%s: draining: %s", h.name, why)
        self._move(h, RolloutHostState.DRAINING, {"reason": why}, {"drain_since": time.time()})

    def _drain(self, h: HostRow) -> None:
        """Wait for the scheduler's drain; then carve again (the host stays draining, as
        this rollout's, until its uncordon)."""
        since = h.data.get("drain_since", time.time())
        while True:
            try:
                view = self._rpc(self.scheduler.drain_status, h.name)  # type: ignore[union-attr]
            except SchedulerError as e:
                return self._fail(h, f"drain: {e}")
            if view["drained"]:
                return self._move(h, RolloutHostState.CARVING, {"drained_s": round(time.time() - since, 1)},
                                  {"change_started": time.time()})
            if time.time() - since > self.spec.steps.drain_timeout_s:
                waits = [f"{st['name']} ({st['vm'][:8]}): {st['why']}" for st in view["steps"]
                         if st["action"] != DrainAction.DONE]
                return self._fail(h, f"the drain did not finish in {self.spec.steps.drain_timeout_s:.0f} s; "
                                     f"{view['left']} VM(s) left: " + "; ".join(waits[:10]),
                                  {"drain": view["steps"]})
            self._wait(min(self.opts.poll_s * 4, 5.0))

    def _own_carve(self, h: HostRow) -> str:
        """Read the host back: "" if it carries this rollout's carve, else what it carries
        and who made it (a carve or uncarve by someone else since)."""
        if self.spec.kind == "hostd":
            return ""
        info = self._rpc(self.hostd.info, h.address)
        if (info.carved_digest, info.carve_operation) == (self.spec.policy_digest,
                                                            operation_of(self.name, h.name, "carve")):
            return ""
        return f"read back, the host is {info.carve_owner()}, not this rollout's carve"

    def _upgrade(self, h: HostRow) -> None:
        try:
            info = self.hostd.info(h.address)
        except HostUnreachable:
            info = None
        if info is None or info.version != self.spec.hostd_version:
            rc, out = run_hook(self.spec.steps.upgrade_command, h.name, h.address, self.spec.steps.upgrade_timeout_s)
            if rc != 0:
                return self._fail(h, f"upgrade command: {out}")
            info = self._await_start(h, self.spec.steps.upgrade_timeout_s)
            if info is None:
                return self._fail(h, "hostd did not come back after the upgrade")
        if info.version != self.spec.hostd_version:
            return self._fail(h, f"hostd reports {info.version}, not {self.spec.hostd_version}")
        lost = set(h.data.get("vms", [])) - self.hostd.vm_ids(h.address)
        if lost:
            return self._fail(h, f"VMs lost in the upgrade: {', '.join(sorted(lost))}")
        self._move(h, RolloutHostState.SOAKING, {"version": info.version, "vms": len(h.data.get("vms", []))},
                   {"soak_since": time.time()})

    def _await_start(self, h: HostRow, timeout_s: float) -> HostInfo | None:
        """hostd back with a start time after the change began (a restart happened)."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            try:
                info = self.hostd.info(h.address)
                if info.started > h.data.get("prior_started", 0):
                    return info
            except HostError:
                pass
            self._wait(1.0)
        return None

    def _await_reboot(self, h: HostRow) -> None:
        # The intent is recorded before the command runs, so a resumed run never reboots
        # the host twice: it only waits for hostd's new start time (or fails the host).
        if not h.data.get("reboot_ran"):
            self.store.move(self.name, h.name, RolloutHostState.REBOOTING, RolloutHostState.REBOOTING,
                            {"reboot": "command started"},
                            {"reboot_ran": time.time()})
            rc, out = run_hook(self.spec.steps.reboot_command, h.name, h.address, self.spec.steps.reboot_timeout_s)
            if rc != 0:
                return self._fail(self.store.host(self.name, h.name), f"reboot command: {out}")
        info = self._await_start(h, self.spec.steps.reboot_timeout_s)
        h = self.store.host(self.name, h.name)
        if info is None:
            return self._fail(h, "hostd did not come back after the reboot")
        if info.reboot_pending:
            return self._fail(h, "back from the reboot without the boot-time changes: "
                                 + " ".join(info.reboot_pending))
        self._move(h, RolloutHostState.SOAKING, {"rebooted": True}, {"soak_since": time.time()})

    def _window(self, h: HostRow, seconds: float, since: float | None) -> list[Sample]:
        """IO-health samples of ``h`` covering ``seconds`` (after ``since`` if given),
        waiting for hostd to have them."""
        if seconds <= 0:
            return []
        deadline = time.monotonic() + seconds + self.opts.stats_wait_s
        span = seconds + (time.time() - since if since is not None else 0.0)
        interval = 1.0  # a guess until hostd says: ask for what the window needs, not all 900
        while True:
            last = min(900, math.ceil(span / interval) + 3)
            got_interval, samples = self._rpc(self.hostd.stats, h.address, last=last)
            if got_interval <= 0:
                raise HostError(f"{h.name}: the IO-health signal is off (io_health_interval_s = 0)")
            if got_interval < interval and last < 900:  # finer than guessed: ask again for enough
                interval = got_interval
                continue
            interval = got_interval
            start = (since if since is not None else time.time() - seconds)
            got = [s for s in samples if s.at >= start]
            if (judgeable(got) + 1) * interval >= seconds or time.monotonic() > deadline:
                return got
            self._wait(min(interval, seconds))

    def _soak(self, h: HostRow) -> None:
        since = h.data.get("soak_since", time.time())
        self._wait(since + self.spec.steps.soak_s - time.time())
        try:
            soak = self._window(h, self.spec.steps.soak_s, since=since)
        except HostError as e:
            return self._fail(h, f"soak: {e}")
        baseline = [Sample.from_dict(d) for d in h.data.get("baseline", [])]
        measured = self.spec.steps.baseline_s > 0
        controls, controls_baseline, used = self._controls(h, since, baseline if measured else [])
        v: Verdict = judge(soak, baseline if measured else None, controls, self.spec.gate, controls_baseline)
        detail = {"verdict": v.to_dict(), "controls": used, "samples": len(soak),
                  "controls_baseline_samples": len(controls_baseline)}
        if v.decision == "undecided":
            self.store.note(self.name, h.name, {"gate": "undecided", **detail})
            raise Pause(f"{h.name}: the gate could not decide ({'; '.join(v.reasons)})")
        if v.decision == "fail":
            return self._fail(h, "gate: " + "; ".join(v.reasons), detail)
        self._move(h, RolloutHostState.RESTORING, detail)

    def _restore(self, h: HostRow) -> None:
        """The gate passed: check the host still carries this rollout's carve, then end
        the rollout's cordon. An outage here pauses; the passed gate is kept."""
        try:
            mine = self._own_carve(h)
            if mine:
                return self._fail(h, mine)
            self._admin(h.name, AdminState.ACTIVE)
        except (HostError, SchedulerError) as e:
            return self._fail(h, str(e))
        self._move(h, RolloutHostState.VERIFIED)

    def _controls(self, h: HostRow, since: float,
                  baseline: list[Sample]) -> tuple[list[Sample], list[Sample], list[str]]:
        """Unconverted hosts of this rollout over the same window, other racks first; a
        host that did not answer, or sampled too little of the window, is passed over.
        Also their samples over the host's ``baseline`` window, where their history
        (hostd keeps 900 samples) still holds it: a rise they share is the fleet's
        (``gates.judge``)."""
        want = self.spec.gate.controls
        if not want:
            return [], [], []
        pending = [c for c in self.store.brief(self.name) if c.state == RolloutHostState.PENDING]
        pending.sort(key=lambda c: (c.rack == h.rack, c.seq))
        start = since
        if baseline:
            b0, b1 = min(s.at for s in baseline), max(s.at for s in baseline)
            start = min(start, b0)
        out: list[Sample] = []
        out_baseline: list[Sample] = []
        used: list[str] = []
        for c in pending:
            if len(used) >= want:
                break
            try:
                samples = self._history(c.address, start)
            except HostError:
                continue
            got = [s for s in samples if s.at >= since]
            if judgeable(got) >= self.spec.gate.min_samples:  # one silent for part of the window is no control
                out += got
                used.append(c.name)
                if baseline:
                    out_baseline += [s for s in samples if b0 <= s.at <= b1]
        return out, out_baseline, used

    def _history(self, address: str, start: float) -> list[Sample]:
        """A control's IO-health samples since ``start``, as far as its history (hostd
        keeps 900) reaches: asked for a window's worth at one a second, then again for
        enough at the interval the host answered with, if that is finer. Not retried: a
        control that does not answer is passed over (``HostError``)."""
        want = math.ceil(time.time() - start) + 5
        interval, samples = self.hostd.stats(address, last=min(900, want))
        if 0 < interval < 1 and want < 900:
            _, samples = self.hostd.stats(address, last=min(900, math.ceil(want / interval)))
        return samples

    # ---------------------------------------------------------------- rollback

    def _begin_rollback(self, h: HostRow) -> None:
        self._move(h, RolloutHostState.ROLLING_BACK, {"from": h.state}, {"rollback_from": h.state})

    def _rollback(self, h: HostRow) -> None:
        """Put the host's carve back as it was before (uncarve, or carve its earlier
        policy again), only if the carve is still this rollout's. Whose carve it is is
        read first; only a carve to undo drains the host (as this rollout), and the undo
        is a compare-and-set on the carve read, so a carve someone else makes meanwhile
        is refused by hostd. A carve someone else made since is left alone, with no
        drain, and reported with who made it. The rollout's own hold ends."""
        prior = h.data.get("prior_digest", "")
        foreign = ""
        try:
            if self.spec.kind == "hostd":
                raise HostError("rolling back a hostd upgrade: run a rollout with the previous version")
            after = info = self._rpc(self.hostd.info, h.address)
            if info.carved_digest == prior:
                pass  # never changed, or rolled back already
            elif info.carve_operation != operation_of(self.name, h.name, "carve"):
                foreign = f"not rolled back: the host is {info.carve_owner()}, not this rollout's carve"
            else:
                self._admin(h.name, AdminState.DRAINING)
                op = operation_of(self.name, h.name, "rollback")
                if prior:  # it had a policy: carve that one again
                    self._rpc(self.hostd.carve, h.address, h.data.get("prior_policy", ""), prior,
                              expected=info.carved_digest, operation=op)
                else:  # it had none: uncarve
                    self._rpc(self.hostd.uncarve, h.address, drained=True, expected=info.carved_digest, operation=op)
                after = self._rpc(self.hostd.info, h.address)
                if after.carved_digest != prior:
                    raise HostError(f"after the rollback the host is {after.carve_owner()}, not "
                                    f"{'carved with ' + prior[:12] if prior else 'uncarved'}")
            self._end_hold(h.name)
        except (HostError, SchedulerError) as e:
            log.error("%s: rollback failed: %s", h.name, e)
            self._give_up(h, {"rollback": "failed", "reason": str(e)}, str(e))
            return
        if foreign:
            log.error("%s: %s", h.name, foreign)
            self._give_up(h, {"rollback": "foreign", "reason": foreign}, foreign)
            return
        self._move(h, RolloutHostState.ROLLED_BACK, {"digest": after.carved_digest}, {"rollback_failed": ""})

    def _give_up(self, h: HostRow, detail: dict, why: str) -> None:
        """The host's rollback failed: recorded, and not tried again in this run (the
        operator's next rollback, abort or resume tries it once more)."""
        self._retried.add(h.name)
        self._move(h, RolloutHostState.FAILED, detail, {"rollback_failed": why})
