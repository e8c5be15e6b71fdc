"""The rollout's durable state, kept by the scheduler (``/v1/rollouts``, in its database:
SQLite by default, PostgreSQL at scale), as Argo Rollouts keeps its state in the
cluster's API: every operator's `fleet-rollout` (and the console, and `hybctl`) sees
every rollout, and the scheduler refuses a rollout over hosts another active rollout
has (``hyb.rollout.overlap``, naming it and the hosts).

Every host transition is a compare-and-set on the host's state, written with its record
(the decision and its measured numbers) in one transaction, and only under the
rollout's lease: each write carries the lease's fence, a number the scheduler handed
out with the lease (one more with every take), so a controller whose lease lapsed and
was taken over holds an older fence and cannot write behind its successor's back
(``StaleFence``, naming who took the lease and when). The lease has a TTL; the holder
renews it. A controller killed by SIGKILL leaves a lease that lapses after the TTL, or
at once for the next run on the same machine (its holder names a process that is gone:
the next run takes it over by its fence).

A scheduler that does not answer is asked again for ``retry_s`` (a replica restarting);
after that, or at once on a database error of the scheduler's (a full disk), the call
fails with ``StoreUnavailable``: one line naming the scheduler and the cause. Every transition
written before it stands; the next run resumes from there.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass

from api.states import RolloutState
from tools.fleet_rollout.clients import Scheduler, SchedulerError, SchedulerUnreachable
from tools.fleet_rollout.inventory import Host
from tools.fleet_rollout.plan import Plan
from tools.fleet_rollout.spec import RolloutSpec

# What an operator's command may set, and the scheduler's verb for it (not fenced:
# that is how an operator talks to a running controller).
VERBS = {RolloutState.PAUSED: "pause", RolloutState.RUNNING: "resume", RolloutState.ABORTING: "abort",
         RolloutState.ROLLING_BACK: "rollback"}


HOLDERS_ASKED = 100  # host names a holders query carries


class StoreError(RuntimeError):
    pass


class StoreUnavailable(StoreError):
    """The scheduler did not answer, or its database failed: nothing was written."""


class LeaseHeld(StoreError):
    pass


class LeaseLost(StoreError):
    """This controller may no longer write under the lease (it lapsed, was released, or
    is another principal's)."""


class StaleFence(LeaseLost):
    """Another controller took the lease since: the message names who and when."""


class StaleState(StoreError):
    """The host was not in the state the writer thought (another writer moved it)."""


class NotFound(StoreError):
    pass


ERRORS = {"hyb.rollout.lease_held": LeaseHeld, "hyb.rollout.lease_lost": LeaseLost,
          "hyb.rollout.stale_fence": StaleFence, "hyb.rollout.not_yours": LeaseLost,
          "hyb.rollout.stale_state": StaleState, "hyb.rollout.not_found": NotFound}


@dataclass
class HostRow:
    name: str
    wave: int
    seq: int
    rack: str
    address: str
    host: Host
    state: str
    data: dict
    updated: float


@dataclass
class Lease:
    holder: str  # the controller's name for itself
    principal: str  # whose token took it
    fence: int
    expires: float


@dataclass
class RolloutRow:
    name: str
    spec: RolloutSpec
    state: str
    reason: str
    wave: int
    waves: int
    skipped: list[dict]
    created: float
    updated: float
    counts: list[dict]
    lease: Lease | None  # none: nobody holds it, or it lapsed


def default_holder() -> str:
    return f"{os.environ.get('USER', 'root')}@{socket.gethostname()}:{os.getpid()}"


def dead_here(holder: str) -> bool:
    """``holder`` (a default_holder) names a process of this machine that is gone."""
    where, _, pid = holder.rpartition(":")
    if not where.endswith("@" + socket.gethostname()) or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def _host_row(d: dict) -> HostRow:
    host = Host.from_dict(d["host"]) if d.get("host") else Host(d["name"], d["address"], d["rack"])
    return HostRow(d["name"], d["wave"], d["seq"], d["rack"], d["address"], host, d["state"], d["data"], d["updated"])


class Store:
    """``scheduler``: the scheduler's API with an admin token; ``holder``: who this
    controller is (the lease's name for it). ``fence``: the fence of the lease this
    controller took last, which its writes carry (None: it took none)."""

    def __init__(self, scheduler: Scheduler, holder: str | None = None, *, retry_s: float = 15.0):
        self.api = scheduler
        self.holder = holder or default_holder()
        self.retry_s = retry_s
        self.where = scheduler.url
        self.fence: int | None = None

    def close(self) -> None:
        pass  # the scheduler client is its caller's

    def _req(self, method: str, path: str, **kw) -> dict:  # type: ignore[no-untyped-def]
        end = time.monotonic() + self.retry_s
        while True:
            try:
                return self.api.request(method, path, **kw)
            except SchedulerUnreachable as e:
                # no answer may be a replica restarting; a database error (a full disk) lasts
                if time.monotonic() >= end or e.code == "hyb.store.unavailable":
                    raise StoreUnavailable(f"rollout state at {self.where}: {e}") from None
                time.sleep(1.0)
            except SchedulerError as e:
                raise ERRORS.get(e.code, StoreError)(str(e)) from None

    def _path(self, name: str, *rest: str) -> str:
        return "/".join(("/v1/rollouts", name, *rest)).rstrip("/")

    # ------------------------------------------------------------ rollouts

    def create(self, spec: RolloutSpec, plan: Plan) -> None:
        """Refused (StoreError) when the name exists or a host is in another active rollout."""
        self._req("POST", "/v1/rollouts", json={
            "name": spec.name, "kind": spec.kind, "policy_digest": spec.policy_digest,
            "spec": json.loads(spec.to_json()),
            "waves": [[{"name": h.name, "address": h.address, "rack": h.rack, "host": h.to_dict()} for h in w]
                      for w in plan.waves],
            "skipped": [{"host": h.name, "reason": why} for h, why in plan.skipped]})

    def rollout(self, name: str) -> RolloutRow:
        r = self._req("GET", self._path(name))
        x = r.get("lease")
        lease = Lease(x["holder"], x["principal"], x["fence"], x["expires"]) if x else None
        return RolloutRow(r["name"], RolloutSpec.model_validate(r["spec"]), r["state"], r["reason"], r["wave"],
                          r["waves"], r["skipped"], r["created"], r["updated"], r["counts"], lease)

    def find(self, name: str) -> RolloutRow | None:
        """The rollout, or None if the scheduler has none of that name."""
        try:
            return self.rollout(name)
        except NotFound:
            return None

    def state(self, name: str) -> tuple[str, int]:
        """(state, wave): what a running controller polls."""
        r = self.rollout(name)
        return r.state, r.wave

    def rollouts(self) -> list[str]:
        return [r["name"] for r in self._req("GET", "/v1/rollouts")["items"]]

    def holders(self, hosts: list[str]) -> list[tuple[str, str, list[str]]]:
        """(rollout, its state, the ones of ``hosts`` it holds) for each active rollout that
        holds any of them, as the scheduler's overlap rule has it; asked in parts (a URL's
        length)."""
        held: dict[str, tuple[str, list[str]]] = {}
        for i in range(0, len(hosts), HOLDERS_ASKED):
            got = self._req("GET", "/v1/rollouts", params={"holding": hosts[i:i + HOLDERS_ASKED]})["items"]
            for r in got:
                held.setdefault(r["name"], (r["state"], []))[1].extend(r["holds"] or [])
        return [(name, state, hs) for name, (state, hs) in held.items()]

    def set_rollout(self, name: str, state: str, reason: str = "", *, expect: str, wave: int | None = None,
                    fenced: bool = True, detail: dict | None = None) -> None:
        """Rollout-level transition from ``expect`` (else StaleState, naming who changed
        it): the controller's (fenced by its lease), or an operator's command
        (``fenced=False``: pause, resume, abort, rollback)."""
        if fenced:
            self._req("POST", self._path(name, "state"), json={
                "fence": self._fence(), "state": state, "expect": expect, "reason": reason, "wave": wave,
                "detail": detail or {}})
            return
        if state not in VERBS:
            raise StoreError(f"an operator cannot set a rollout {state}")
        self._req("POST", self._path(name, VERBS[state]), json={"expect": expect, "reason": reason})

    def _fence(self) -> int:
        if self.fence is None:
            raise LeaseLost("this controller has not taken the rollout's lease")
        return self.fence

    # ------------------------------------------------------------ hosts

    def _hosts(self, name: str, wave: int | None, brief: bool) -> list[HostRow]:
        params: dict[str, str | int] = {"brief": "true" if brief else "false"}
        if wave is not None:
            params["wave"] = wave
        return [_host_row(d) for d in self._req("GET", self._path(name, "hosts"), params=params)["items"]]

    def hosts(self, name: str, *, wave: int | None = None) -> list[HostRow]:
        return self._hosts(name, wave, brief=False)

    def brief(self, name: str, *, wave: int | None = None) -> list[HostRow]:
        """Hosts without their recorded data (baselines are large), for scheduling: ``data``
        holds only ``rollback_failed``, ``host`` only name, address and rack."""
        return self._hosts(name, wave, brief=True)

    def host(self, name: str, host: str) -> HostRow:
        return _host_row(self._req("GET", self._path(name, "hosts", host)))

    def move(self, name: str, host: str, frm: str, to: str, detail: dict | None = None,
             data: dict | None = None) -> HostRow:
        """host: ``frm`` -> ``to``, with the decision's record; ``data`` merges into the
        host's durable data (what later steps need: the baseline, the prior state).
        Returns the host as written (the next step needs no read)."""
        return _host_row(self._req("POST", self._path(name, "hosts", host, "transition"), json={
            "fence": self._fence(), "from": frm, "to": to, "detail": detail or {}, "data": data or {}}))

    def note(self, name: str, host: str, detail: dict) -> None:
        """A record without a state change (a retried RPC, an undecided gate)."""
        self._req("POST", self._path(name, "hosts", host, "note"), json={"fence": self._fence(), "detail": detail})

    def transitions(self, name: str, host: str | None = None) -> list[dict]:
        return self._req("GET", self._path(name, "transitions"), params={"host": host} if host else {})["items"]

    # ------------------------------------------------------------ lease

    def acquire(self, name: str, ttl_s: float) -> int:
        """Take the lease; its fence, which this controller's writes carry from now on.
        LeaseHeld while another controller's lease is live; this controller's own live
        lease, and the lease of a process of this machine that is gone, are taken over at
        once (by their fence: if another controller took the lease meanwhile, LeaseHeld)."""
        held = self.lease(name)
        mine_or_gone = held is not None and (held.holder == self.holder or dead_here(held.holder))
        out = self._req("POST", self._path(name, "lease"), json={
            "holder": self.holder, "ttl_s": ttl_s, "replace_fence": held.fence if mine_or_gone else None})
        self.fence = int(out["fence"])
        return self.fence

    def renew(self, name: str, ttl_s: float) -> None:
        self._req("PUT", self._path(name, "lease"), json={"fence": self._fence(), "ttl_s": ttl_s})

    def release(self, name: str) -> None:
        self._req("DELETE", self._path(name, "lease"), params={"fence": self._fence()})

    def lease(self, name: str) -> Lease | None:
        return self.rollout(name).lease
