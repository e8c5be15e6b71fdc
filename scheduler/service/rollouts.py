"""Fleet rollouts' durable state (``/v1/rollouts``), kept for ``fleet-rollout`` as a
cluster API keeps a controller's: every operator's rollouts see each other, and a host
belongs to at most one active rollout.

A controller writes only under the rollout's lease, and every write carries the lease's
fence: a number the scheduler hands out with each take (one more each time, never
reused), which only the principal that took the lease may use. A controller whose lease
lapsed and was taken over holds an older fence, so it cannot write behind its
successor's back, and the refusal names who took the lease and when. Each host step is
a compare-and-set on the host's state, written with its record in one transaction.
The operator's verbs (pause, resume, abort, rollback) are not fenced: they are how an
operator talks to a running controller, which reads the rollout's state; they are a
compare-and-set on the state the operator saw (``expect``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone

from sqlalchemy.orm import Session

from api.overlap import holders_subject, holders_text
from api.states import RolloutState
from scheduler.db.engine import Store
from scheduler.db.models import Rollout, RolloutLease, RolloutTransition
from scheduler.errors import (InvalidRequest, RolloutBadState, RolloutExists, RolloutLeaseHeld, RolloutLeaseLost,
                              RolloutNotYours, RolloutOverlap, RolloutStaleFence, RolloutStaleState)
from scheduler.repo import audit as audit_repo
from scheduler.repo import rollouts as repo
from scheduler.schemas.rollouts import (LeaseOut, LeaseRenew, LeaseTake, RolloutCreate, RolloutHostNote,
                                        RolloutHostOut, RolloutHostsOut, RolloutHostTransition, RolloutListedOut,
                                        RolloutOut, RolloutsOut, RolloutStateChange, TransitionOut, TransitionsOut)

log = logging.getLogger(__name__)

# verb: (the state it sets, the states it applies to). Resume applies to a done rollout
# too: a new run retries the rollbacks that could not finish (hosts left held).
VERBS = {
    "pause": (RolloutState.PAUSED, (RolloutState.RUNNING,)),
    "resume": (RolloutState.RUNNING, (RolloutState.PAUSED, RolloutState.HALTED, RolloutState.DONE)),
    "abort": (RolloutState.ABORTING, (RolloutState.RUNNING, RolloutState.PAUSED, RolloutState.HALTED,
                                      RolloutState.ABORTING)),
    "rollback": (RolloutState.ROLLING_BACK, (RolloutState.RUNNING, RolloutState.PAUSED, RolloutState.HALTED,
                                             RolloutState.DONE, RolloutState.ABORTED, RolloutState.ROLLING_BACK)),
}


def owner_of(rollout: str) -> str:
    """The owner a rollout's hold on a host is recorded as (cordon, drain): only the
    principal holding that rollout's lease may act as it (``check_fence``)."""
    return f"rollout:{rollout}"


class RolloutService:
    def __init__(self, *, store: Store, clock: Callable[[], float] = time.time):
        self.store = store
        self.clock = clock  # lease expiry too: a test lapses a lease by moving its clock

    # ------------------------------------------------------------ rollouts

    def create(self, body: RolloutCreate, *, actor: str) -> RolloutOut:
        """A new rollout, running at wave 0: refused when the name exists, or when another
        active rollout holds one of its hosts. The check and the insert are one step
        against a concurrent create (PostgreSQL: the creation lock; SQLite: the writer
        lock), so two operators cannot both take a host."""
        now = self.clock()
        hosts = [h.name for wave in body.waves for h in wave]
        with self.store.write() as s:
            repo.lock_creation(session=s)
            old = repo.find_rollout(session=s, name=body.name)
            if old is not None:
                raise RolloutExists(f"rollout {body.name} exists and is {old.state}", field="name")
            _refuse_overlap(s, body.name, hosts, field="waves")
            r = repo.add_rollout(session=s, name=body.name, kind=body.kind, policy_digest=body.policy_digest,
                                 spec=body.spec, waves=body.waves, skipped=[x.model_dump() for x in body.skipped],
                                 now=now, created_by=actor)
            n = len(hosts)
            repo.record(session=s, rollout=body.name, host=repo.ROLLOUT, frm="", to=RolloutState.RUNNING, at=now,
                        holder=actor, principal=actor, detail={"hosts": n, "waves": len(body.waves)})
            audit_repo.record(session=s, principal=actor, action="rollout.create", target=body.name, now=now,
                              detail={"kind": body.kind, "hosts": n, "waves": len(body.waves)})
            out = _one(s, r, now)
        log.info("rollout created name=%s kind=%s hosts=%d waves=%d by=%s", body.name, body.kind, n,
                 len(body.waves), actor)
        return out

    def list(self, *, holding: Sequence[str] | None = None) -> RolloutsOut:
        """Every rollout; with ``holding``, only the active ones that hold any of those
        hosts (the overlap refusal's rule), each with the ones it holds."""
        now = self.clock()
        with self.store.read() as s:
            counts, leases = repo.counts(session=s), repo.leases(session=s)
            held: dict[str, list[str]] | None = None
            if holding is not None:
                held = {}
                for other, _state, host in repo.overlaps(session=s, hosts=list(dict.fromkeys(holding)), besides=""):
                    held.setdefault(other, []).append(host)
            items = []
            for r in repo.list_rollouts(session=s):
                if held is not None and r.name not in held:
                    continue
                out = _rollout_out(r, counts.get(r.name, {}), leases.get(r.name), now, cls=RolloutListedOut)
                if held is not None:
                    out.holds = held[r.name]
                items.append(out)
            return RolloutsOut(items=items)

    def get(self, name: str) -> RolloutOut:
        now = self.clock()
        with self.store.read() as s:
            return _one(s, repo.get_rollout(session=s, name=name), now)

    def set_state(self, name: str, body: RolloutStateChange, *, actor: str) -> RolloutOut:
        """The controller's rollout-level transition (the next wave, halted, done ...),
        fenced by its lease, and a compare-and-set on the state it decided from
        (``expect``): an operator's pause or abort in between is not overwritten."""
        now = self.clock()
        with self.store.write() as s:
            r = repo.get_rollout(session=s, name=name, lock="update")
            x = check_fence(s, name, body.fence, actor=actor, now=now)
            if body.wave is not None and body.wave >= r.waves:
                raise InvalidRequest(f"rollout {name} has waves 0 to {r.waves - 1}, not {body.wave}", field="wave")
            before = r.state
            if before != body.expect:
                raise RolloutStaleState(f"rollout {name}: expected state {body.expect}, found {before}"
                                        f"{_set_by(s, name, repo.ROLLOUT)}", field="expect")
            _change(s, r, body.state, reason=body.reason, wave=body.wave, holder=x.holder, principal=actor,
                    fence=x.fence, detail=body.detail, now=now)
            out = _one(s, r, now)
        log.info("rollout state name=%s %s -> %s wave=%d holder=%s fence=%d reason=%r", name, before, body.state,
                 out.wave, x.holder, body.fence, body.reason)
        return out

    def operate(self, name: str, verb: str, *, actor: str, expect: str, reason: str) -> RolloutOut:
        """An operator's verb, unfenced, a compare-and-set on the state the operator saw
        (``expect``); recorded and audited as "<verb> by <actor>"."""
        to, allowed = VERBS[verb]
        now = self.clock()
        who = f"{verb} by {actor}"
        with self.store.write() as s:
            r = repo.get_rollout(session=s, name=name, lock="update")
            before = r.state
            if before != expect:
                raise RolloutStaleState(f"rollout {name}: expected state {expect}, found {before}"
                                        f"{_set_by(s, name, repo.ROLLOUT)}", field="expect")
            if before not in allowed:
                raise RolloutBadState(f"rollout {name} is {before}: {verb} applies to {' or '.join(allowed)}")
            _change(s, r, to, reason=f"{who}: {reason}" if reason else who, wave=None, holder=who, principal=actor,
                    fence=None, detail={}, now=now)
            audit_repo.record(session=s, principal=actor, action=f"rollout.{verb}", target=name, now=now,
                              detail={"from": before, "to": to, "reason": reason})
            out = _one(s, r, now)
        log.info("rollout %s name=%s %s -> %s by=%s reason=%r", verb, name, before, to, actor, reason)
        return out

    # ------------------------------------------------------------ hosts

    def hosts(self, name: str, *, wave: int | None, brief: bool) -> RolloutHostsOut:
        with self.store.read() as s:
            repo.get_rollout(session=s, name=name)
            rows = (repo.brief_hosts if brief else repo.hosts)(session=s, rollout=name, wave=wave)
        return RolloutHostsOut(items=[RolloutHostOut(**h) for h in rows])

    def host(self, name: str, host: str) -> RolloutHostOut:
        with self.store.read() as s:
            repo.get_rollout(session=s, name=name)
            return RolloutHostOut(**repo.host_out(repo.get_host(session=s, rollout=name, name=host)))

    def move(self, name: str, host: str, body: RolloutHostTransition, *, actor: str) -> RolloutHostOut:
        """host: ``from`` -> ``to`` with the decision's record, iff the writer's fence is
        the live lease's and the host is in ``from``; ``data`` merges into the host's data."""
        now = self.clock()
        with self.store.write() as s:
            repo.get_rollout(session=s, name=name, lock="share")
            x = check_fence(s, name, body.fence, actor=actor, now=now)
            h = repo.get_host(session=s, rollout=name, name=host, lock=True)
            if h.state != body.from_:
                raise RolloutStaleState(f"{host}: expected state {body.from_}, found {h.state}"
                                        f"{_set_by(s, name, host)}", field="from")
            repo.move_host(session=s, h=h, to=body.to, data=body.data, now=now)
            repo.record(session=s, rollout=name, host=host, frm=body.from_, to=body.to, at=now, holder=x.holder,
                        principal=actor, fence=x.fence, detail=body.detail)
            out = RolloutHostOut(**repo.host_out(h))
        log.debug("rollout host name=%s host=%s %s -> %s holder=%s fence=%d", name, host, body.from_, body.to,
                  x.holder, x.fence)
        return out

    def note(self, name: str, host: str, body: RolloutHostNote, *, actor: str) -> None:
        """A record without a state change (a retried call, an undecided gate), fenced."""
        now = self.clock()
        with self.store.write() as s:
            repo.get_rollout(session=s, name=name, lock="share")
            x = check_fence(s, name, body.fence, actor=actor, now=now)
            h = repo.get_host(session=s, rollout=name, name=host, lock=True)  # the state as of the record
            repo.record(session=s, rollout=name, host=host, frm=h.state, to=h.state, at=now, holder=x.holder,
                        principal=actor, fence=x.fence, detail=body.detail)

    def transitions(self, name: str, *, host: str | None) -> TransitionsOut:
        with self.store.read() as s:
            repo.get_rollout(session=s, name=name)
            return TransitionsOut(items=[TransitionOut(**t) for t in repo.transitions(session=s, rollout=name,
                                                                                      host=host)])

    # ------------------------------------------------------------ lease

    def acquire(self, name: str, body: LeaseTake, *, actor: str) -> LeaseOut:
        """The lease with the next fence, when nobody holds it, it lapsed or was released,
        or its fence is ``replace_fence`` (the caller found that controller's process
        dead). A live lease is otherwise refused, naming its holder."""
        now = self.clock()
        with self.store.write() as s:
            repo.get_rollout(session=s, name=name, lock="update")
            x = repo.lease(session=s, rollout=name)
            replaced = None
            if x is not None and x.expires > now:
                if body.replace_fence != x.fence:
                    raise RolloutLeaseHeld(f"rollout {name} is being run by {_holder(x)} (fence {x.fence}, lease "
                                           f"until {_iso(x.expires)}; it lapses if that run dies, or send "
                                           f"replace_fence {x.fence} to take it from a controller found dead)",
                                           field="holder")
                replaced = _holder(x)
            x = repo.take_lease(session=s, rollout=name, holder=body.holder, principal=actor, now=now,
                                expires=now + body.ttl_s)
            out = _lease_out(x)
        if replaced is not None:
            log.warning("rollout lease name=%s taken by %s's controller %s (fence %d) from %s, found dead", name,
                        actor, out.holder, out.fence, replaced)
        return out

    def renew(self, name: str, body: LeaseRenew, *, actor: str) -> LeaseOut:
        now = self.clock()
        with self.store.write() as s:
            repo.get_rollout(session=s, name=name, lock="update")
            x = check_fence(s, name, body.fence, actor=actor, now=now)
            repo.extend_lease(session=s, x=x, expires=now + body.ttl_s)
            return _lease_out(x)

    def release(self, name: str, fence: int, *, actor: str) -> None:
        """Ends the lease at ``fence`` if it is still live and the caller's; a lease taken
        since (a later fence), or one already ended, stays as it is."""
        now = self.clock()
        with self.store.write() as s:
            repo.get_rollout(session=s, name=name, lock="update")
            x = repo.lease(session=s, rollout=name)
            if x is None or x.fence != fence or x.expires <= now:
                return
            if x.principal != actor:
                raise RolloutNotYours(f"rollout {name}: the lease at fence {fence} is {_holder(x)}'s, not "
                                      f"{actor}'s", field="fence")
            repo.end_lease(session=s, x=x, now=now)


def check_fence(s: Session, name: str, fence: int, *, actor: str, now: float) -> RolloutLease:
    """The rollout's lease, if ``fence`` is its current one, live, and ``actor`` took it.
    Refused otherwise, naming who took the lease and when: RolloutStaleFence (a later
    fence was handed out since), RolloutNotYours (another principal's lease),
    RolloutLeaseLost (it lapsed or was released), InvalidRequest (a fence never handed
    out). The caller holds the rollout's row lock (share or update), which every take
    of the lease waits for."""
    x = repo.lease(session=s, rollout=name)
    latest = x.fence if x is not None else 0
    if x is None or fence > latest:
        raise InvalidRequest(f"rollout {name}: fence {fence} was never handed out (the latest is {latest}); "
                             f"take the lease (POST /v1/rollouts/{name}/lease) for one", field="fence")
    if fence < latest:
        raise RolloutStaleFence(f"rollout {name}: fence {fence} is stale: {_holder(x)} took the lease at fence "
                                f"{latest} at {_iso(x.taken)}", field="fence")
    if x.principal != actor:
        raise RolloutNotYours(f"rollout {name}: the lease at fence {fence} is {_holder(x)}'s, not {actor}'s",
                              field="fence")
    if x.expires <= now:
        raise RolloutLeaseLost(f"rollout {name}: the lease at fence {fence} ({_holder(x)}, taken at "
                               f"{_iso(x.taken)}) ended at {_iso(x.expires)}: it lapsed or was released",
                               field="fence")
    return x


def _holder(x: RolloutLease) -> str:
    return f"{x.principal or '(unrecorded)'}'s controller {x.holder}"


def _set_by(s: Session, name: str, host: str) -> str:
    """Who set the state a writer did not expect, and when (the latest record)."""
    t: RolloutTransition | None = repo.last_transition(session=s, rollout=name, host=host)
    if t is None:
        return ""
    when = _iso(t.at)
    if t.fence is not None:
        return f" (written by {t.principal}'s controller {t.holder} under fence {t.fence} at {when})"
    if not t.from_state:
        return f" (created by {t.holder} at {when})"
    return f" ({t.holder} at {when})"  # "pause by alice": an operator's verb


def _change(s: Session, r: Rollout, state: str, *, reason: str, wave: int | None, holder: str, principal: str,
            fence: int | None, detail: dict, now: float) -> None:
    """The rollout's new state and its record. A rollout that ended holds no host, so one
    that starts again (resume or rollback of a done or aborted rollout) must not hold a
    host another rollout has taken since: checked as a create is."""
    if r.state in repo.TERMINAL and state not in repo.TERMINAL:
        repo.lock_creation(session=s)
        _refuse_overlap(s, r.name, repo.held_hosts(session=s, rollout=r.name), field=None)
    before = r.state
    repo.set_rollout(session=s, r=r, state=state, reason=reason, wave=r.wave if wave is None else wave, now=now)
    repo.record(session=s, rollout=r.name, host=repo.ROLLOUT, frm=before, to=state, at=now, holder=holder,
                principal=principal, fence=fence, detail={"reason": reason, "wave": wave, **detail})


def _one(s: Session, r: Rollout, now: float) -> RolloutOut:
    return _rollout_out(r, repo.counts(session=s, names=[r.name]).get(r.name, {}),
                        repo.lease(session=s, rollout=r.name), now)


def _lease_out(x: RolloutLease) -> LeaseOut:
    return LeaseOut(holder=x.holder, principal=x.principal, fence=x.fence, taken=x.taken, expires=x.expires)


def _rollout_out(r: Rollout, counts: dict[int, dict[str, int]], lease: RolloutLease | None,
                 now: float, cls: type[RolloutOut] = RolloutOut) -> RolloutOut:
    live = lease if lease is not None and lease.expires > now else None
    return cls(**repo.rollout_fields(r), counts=[counts.get(w, {}) for w in range(r.waves)],
               lease=_lease_out(live) if live is not None else None)


def _refuse_overlap(s: Session, name: str, hosts: list[str], *, field: str | None) -> None:
    """RolloutOverlap naming each other active rollout that holds any of ``hosts`` and
    the hosts it holds, as ``api.overlap`` words it."""
    found = repo.overlaps(session=s, hosts=hosts, besides=name)
    if not found:
        return
    held: dict[tuple[str, str], list[str]] = {}
    for other, state, host in found:
        held.setdefault((other, state), []).append(host)
    raise RolloutOverlap(f"rollout {name} shares hosts with {holders_subject(len(held))} (a host belongs to at "
                         f"most one): {holders_text((o, st, hs) for (o, st), hs in held.items())}", field=field)


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")
