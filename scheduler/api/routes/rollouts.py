"""/v1/rollouts: fleet-rollout's durable state (scope admin). A host belongs to at most
one active rollout; a controller writes under the rollout's lease, each write carrying
the lease's fence; an operator's verbs (pause, resume, abort, rollback) need no lease,
and say which state they expect to replace."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request, Response

from scheduler import policies
from scheduler.api.deps import CurrentPrincipal
from scheduler.api.errors import ERRORS
from scheduler.schemas.rollouts import (MAX_HOSTS, LeaseOut, LeaseRenew, LeaseTake, RolloutCreate,
                                        RolloutHostNote, RolloutHostOut, RolloutHostsOut, RolloutHostTransition,
                                        RolloutOut, RolloutsOut, RolloutStateChange, RolloutVerb, TransitionsOut)
from scheduler.service.rollouts import RolloutService

HOLDING_MAX = 1000  # host names a query asks about (a URL's length: ask in parts)

router = APIRouter(prefix="/v1/rollouts", tags=["rollouts"], responses=ERRORS)


def _svc(request: Request) -> RolloutService:
    return request.app.state.rollouts


@router.post("", response_model=RolloutOut, status_code=201)
def create_rollout(body: RolloutCreate, request: Request, p: CurrentPrincipal) -> RolloutOut:
    """Running at wave 0. 409 `hyb.rollout.exists`, or `hyb.rollout.overlap` when another
    active rollout holds one of its hosts (nothing is created)."""
    policies.rollouts(p)
    return _svc(request).create(body, actor=p.name)


@router.get("", response_model=RolloutsOut, response_model_exclude_unset=True)  # ``holds`` when asked
def list_rollouts(request: Request, p: CurrentPrincipal,
                  holding: list[str] | None = Query(None, max_length=HOLDING_MAX,
                                                    description="only the active rollouts that hold any of these "
                                                                "hosts (a host a rollout skipped it does not "
                                                                "hold), each with the ones it holds (`holds`): "
                                                                "who keeps a host from a new rollout")
                  ) -> RolloutsOut:
    """Oldest first."""
    policies.rollouts(p)
    return _svc(request).list(holding=holding)


@router.get("/{name}", response_model=RolloutOut)
def get_rollout(name: str, request: Request, p: CurrentPrincipal) -> RolloutOut:
    policies.rollouts(p)
    return _svc(request).get(name)


@router.get("/{name}/hosts", response_model=RolloutHostsOut)
def rollout_hosts(name: str, request: Request, p: CurrentPrincipal, wave: int | None = Query(None, ge=0, le=MAX_HOSTS),
                  brief: bool = Query(False, description="without the host's record and data (only "
                                                         "rollback_failed of its data): what a controller polls")
                  ) -> RolloutHostsOut:
    """In rollout order."""
    policies.rollouts(p)
    return _svc(request).hosts(name, wave=wave, brief=brief)


@router.get("/{name}/hosts/{host}", response_model=RolloutHostOut)
def rollout_host(name: str, host: str, request: Request, p: CurrentPrincipal) -> RolloutHostOut:
    policies.rollouts(p)
    return _svc(request).host(name, host)


@router.get("/{name}/transitions", response_model=TransitionsOut)
def transitions(name: str, request: Request, p: CurrentPrincipal,
                host: str | None = Query(None, description='one host\'s, or "-" for the rollout\'s own')
                ) -> TransitionsOut:
    """Oldest first."""
    policies.rollouts(p)
    return _svc(request).transitions(name, host=host)


@router.post("/{name}/hosts/{host}/transition", response_model=RolloutHostOut)
def move_host(name: str, host: str, body: RolloutHostTransition, request: Request,
              p: CurrentPrincipal) -> RolloutHostOut:
    """Compare-and-set of the host's state, under the lease: 409 `hyb.rollout.stale_fence`
    (naming who took the lease since) or `hyb.rollout.lease_lost` unless `fence` is the
    live lease's, 403 `hyb.rollout.not_yours` unless the caller took it,
    `hyb.rollout.stale_state` (naming who moved the host) unless the host is in `from`."""
    policies.rollouts(p)
    return _svc(request).move(name, host, body, actor=p.name)


@router.post("/{name}/hosts/{host}/note", status_code=204, response_class=Response)
def note_host(name: str, host: str, body: RolloutHostNote, request: Request, p: CurrentPrincipal) -> Response:
    """A record without a state change, under the lease."""
    policies.rollouts(p)
    _svc(request).note(name, host, body, actor=p.name)
    return Response(status_code=204)


@router.post("/{name}/state", response_model=RolloutOut)
def set_state(name: str, body: RolloutStateChange, request: Request, p: CurrentPrincipal) -> RolloutOut:
    """The controller's rollout-level transition, under the lease, from the state it
    `expect`s (409 `hyb.rollout.stale_state` naming who changed it)."""
    policies.rollouts(p)
    return _svc(request).set_state(name, body, actor=p.name)


def _operate(name: str, verb: str, request: Request, p: CurrentPrincipal, body: RolloutVerb) -> RolloutOut:
    """Every verb replaces the state the operator saw (`expect`): 409
    `hyb.rollout.stale_state`, naming who changed it since and when, otherwise."""
    policies.rollouts(p)
    return _svc(request).operate(name, verb, actor=p.name, expect=body.expect, reason=body.reason)


@router.post("/{name}/pause", response_model=RolloutOut)
def pause(name: str, request: Request, p: CurrentPrincipal, body: RolloutVerb) -> RolloutOut:
    """The controller stops at its next step. Applies to running (else 409
    `hyb.rollout.bad_state`); from the state in `expect` (else 409
    `hyb.rollout.stale_state`), as every verb."""
    return _operate(name, "pause", request, p, body)


@router.post("/{name}/resume", response_model=RolloutOut)
def resume(name: str, request: Request, p: CurrentPrincipal, body: RolloutVerb) -> RolloutOut:
    """Running again. Applies to paused, halted or done (a done rollout's failed rollbacks
    are retried)."""
    return _operate(name, "resume", request, p, body)


@router.post("/{name}/abort", response_model=RolloutOut)
def abort(name: str, request: Request, p: CurrentPrincipal, body: RolloutVerb) -> RolloutOut:
    """Hosts mid-change are rolled back. Applies to running, paused, halted or aborting."""
    return _operate(name, "abort", request, p, body)


@router.post("/{name}/rollback", response_model=RolloutOut)
def rollback(name: str, request: Request, p: CurrentPrincipal, body: RolloutVerb) -> RolloutOut:
    """Every changed host is rolled back, last wave first. Applies to running, paused,
    halted, done, aborted or rolling_back."""
    return _operate(name, "rollback", request, p, body)


@router.post("/{name}/lease", response_model=LeaseOut)
def take_lease(name: str, body: LeaseTake, request: Request, p: CurrentPrincipal) -> LeaseOut:
    """The lease, with the next fence (one more than any handed out before). 409
    `hyb.rollout.lease_held` while another controller's lease is live, unless
    `replace_fence` names its fence."""
    policies.rollouts(p)
    return _svc(request).acquire(name, body, actor=p.name)


@router.put("/{name}/lease", response_model=LeaseOut)
def renew_lease(name: str, body: LeaseRenew, request: Request, p: CurrentPrincipal) -> LeaseOut:
    """Refused as a controller's write is, unless `fence` is the caller's live lease."""
    policies.rollouts(p)
    return _svc(request).renew(name, body, actor=p.name)


@router.delete("/{name}/lease", status_code=204, response_class=Response)
def release_lease(name: str, request: Request, p: CurrentPrincipal, fence: int = Query(ge=1)) -> Response:
    """Ends the lease at `fence` (403 `hyb.rollout.not_yours` if another principal took
    it); a lease taken since, or already ended, stays as it is."""
    policies.rollouts(p)
    _svc(request).release(name, fence, actor=p.name)
    return Response(status_code=204)
