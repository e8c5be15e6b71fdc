"""Rollout request/response bodies (``/v1/rollouts``: fleet-rollout's durable state).

Every string that lands in a column of a fixed size has that size as its bound, and the
free-text ones may not carry NUL (PostgreSQL refuses it in text): a bad value is a 422
naming the field, never a database error. The JSON objects (spec, host, data, detail)
are the controller's own and pass through unread, as long as JSON can carry them."""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, field_validator

from api.states import RolloutHostState, RolloutState

ROLLOUT = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
# A host of a rollout: a DNS name or an address, as an inventory names it; never "-",
# which names the rollout itself in a transition.
ROLLOUT_HOST = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,254}$"
PRINTABLE = r"^[^\x00-\x1f\x7f]*$"
TEXT = r"^[^\x00]*$"
STATE = r"^[a-z][a-z0-9_]{0,15}$"
MAX_HOSTS = 100_000


def _finite(v: Any) -> None:
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError("JSON has no NaN or infinite numbers")
    if isinstance(v, dict):
        for x in v.values():
            _finite(x)
    elif isinstance(v, list):
        for x in v:
            _finite(x)


def _json_object(v: dict[str, Any]) -> dict[str, Any]:
    """Python's JSON reader takes NaN and Infinity, which no JSON answer can carry back."""
    _finite(v)
    return v


JsonObject = Annotated[dict[str, Any], AfterValidator(_json_object)]
Holder = Annotated[str, Field(min_length=1, max_length=255, pattern=PRINTABLE,
                              examples=["ops@deploy-1:4242"],
                              description="the controller's name for itself (a label, shown with the lease and "
                                          "each of its records; it grants nothing: the fence does)")]
Fence = Annotated[StrictInt, Field(ge=1, examples=[7],
                             description="the fence the scheduler handed out with the lease (POST .../lease): "
                                         "refused unless it is the lease's current one, live, and the caller's "
                                         "principal took it (409 hyb.rollout.stale_fence naming who took the "
                                         "lease since, hyb.rollout.lease_lost, 403 hyb.rollout.not_yours)")]
HostState = Annotated[str, Field(pattern=STATE, examples=[RolloutHostState.CORDONED])]


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RolloutHostIn(_In):
    name: str = Field(pattern=ROLLOUT_HOST)
    address: str = Field(max_length=255, pattern=PRINTABLE, description="hostd's gRPC host:port")
    rack: str = Field(max_length=64, pattern=PRINTABLE)
    host: JsonObject = Field(description="the controller's record of the host, returned as given")


class RolloutSkip(_In):
    host: str = Field(min_length=1, max_length=255, pattern=PRINTABLE)
    reason: str = Field(pattern=TEXT)


class RolloutCreate(_In):
    name: str = Field(pattern=ROLLOUT)
    kind: str = Field(min_length=1, max_length=16, pattern=PRINTABLE, examples=["convert"])
    policy_digest: str = Field(pattern=r"^([0-9a-fA-F]{64})?$", description="sha256 of the policy; empty: none")
    spec: JsonObject = Field(description="the rollout's spec, stored and returned as given")
    waves: list[Annotated[list[RolloutHostIn], Field(min_length=1)]] = Field(
        min_length=1, description=f"the hosts, wave by wave; each host once, {MAX_HOSTS} at most")
    skipped: list[RolloutSkip] = Field(default_factory=list, description="hosts the plan left out, and why")

    @field_validator("waves")
    @classmethod
    def _hosts_once(cls, waves: list[list[RolloutHostIn]]) -> list[list[RolloutHostIn]]:
        total = sum(len(w) for w in waves)
        if total > MAX_HOSTS:
            raise ValueError(f"{total} hosts, over the limit of {MAX_HOSTS}")
        seen: dict[str, str] = {}
        for i, wave in enumerate(waves):
            for j, h in enumerate(wave):
                if h.name in seen:
                    raise ValueError(f"host {h.name} is in the rollout twice ({seen[h.name]} and [{i}][{j}])")
                seen[h.name] = f"[{i}][{j}]"
        return waves


class RolloutHostTransition(_In):
    fence: Fence
    from_: HostState = Field(alias="from", description="the state the writer expects the host in")
    to: HostState
    detail: JsonObject = Field(default_factory=dict, description="the decision's record (the transition's)")
    data: JsonObject = Field(default_factory=dict, description="merged into the host's data (key by key)")


class RolloutHostNote(_In):
    fence: Fence
    detail: JsonObject


class RolloutStateChange(_In):
    fence: Fence
    state: RolloutState
    expect: RolloutState = Field(description="compare-and-set: refused (409 hyb.rollout.stale_state, naming who "
                                             "set the state and when) unless the rollout is in this state (an "
                                             "operator's pause came first)")
    reason: str = Field("", pattern=TEXT)
    wave: int | None = Field(None, ge=0, description="the wave the rollout is at from now; none: unchanged")
    detail: JsonObject = Field(default_factory=dict)


class RolloutVerb(_In):
    expect: RolloutState = Field(examples=[RolloutState.RUNNING],
                                 description="compare-and-set: the state the operator saw; refused (409 "
                                             "hyb.rollout.stale_state, naming who set the state and when) unless "
                                             "the rollout is still in it (its controller or another operator "
                                             "moved it since)")
    reason: str = Field("", pattern=TEXT, examples=["change freeze"])


class LeaseTake(_In):
    holder: Holder
    ttl_s: float = Field(gt=0, le=3600)
    replace_fence: StrictInt | None = Field(None, ge=0, description="take the lease from the controller at this fence, "
                                                              "whose process the caller found dead, even before "
                                                              "it lapses (a compare-and-set on the lease)")


class LeaseRenew(_In):
    fence: Fence
    ttl_s: float = Field(gt=0, le=3600)


class LeaseOut(BaseModel):
    holder: str
    principal: str = Field(description="whose token took the lease: only it may write under the fence")
    fence: int = Field(description="the number every write under this lease carries; one more with every take")
    taken: float = Field(description="unix time")
    expires: float = Field(description="unix time")


class RolloutSkipOut(BaseModel):
    host: str
    reason: str


class RolloutOut(BaseModel):
    name: str
    kind: str
    policy_digest: str
    spec: dict[str, Any]
    state: str
    reason: str
    wave: int
    waves: int
    skipped: list[RolloutSkipOut]
    created: float
    updated: float
    created_by: str
    lease: LeaseOut | None = Field(description="none: nobody holds it, or it lapsed")
    counts: list[dict[str, int]] = Field(description="per wave, the number of hosts in each state")


class RolloutListedOut(RolloutOut):
    holds: list[str] | None = Field(None, description="only with `?holding=...`: which of the hosts asked about "
                                                      "this rollout holds, in its order")


class RolloutsOut(BaseModel):
    items: list[RolloutListedOut]


class RolloutHostOut(BaseModel):
    name: str
    wave: int
    seq: int
    rack: str
    address: str
    host: dict[str, Any] | None = Field(description="none in a brief listing")
    state: str
    data: dict[str, Any] = Field(description="brief: only rollback_failed, when set")
    updated: float


class RolloutHostsOut(BaseModel):
    items: list[RolloutHostOut]


class TransitionOut(BaseModel):
    id: int
    host: str = Field(description='the host, or "-" for the rollout itself')
    from_: str = Field(serialization_alias="from")
    to: str
    at: float
    holder: str = Field(description="the controller's name, or \"<verb> by <principal>\" for an operator's verb")
    principal: str = Field(description="whose token wrote it (\"\" for records older than fences)")
    fence: int | None = Field(description="the lease's fence of a controller's write; none: an operator's")
    detail: dict[str, Any]


class TransitionsOut(BaseModel):
    items: list[TransitionOut]
