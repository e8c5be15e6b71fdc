"""Rollout request/response bodies (``/v1/rollouts``: fleet-rollout's durable state).

Every string that lands in a column of a fixed size has that size as its bound, and the
free-text ones may not carry NUL (PostgreSQL refuses it in text): a bad value is a 422
naming the field, never a database error. The JSON objects (spec, host, data, detail)
are the controller's own and pass through unread, as long as JSON can carry them."""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

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
                              description="the controller that holds (or asks for) the rollout's lease")]
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
    holder: Holder
    from_: HostState = Field(alias="from", description="the state the writer expects the host in")
    to: HostState
    detail: JsonObject = Field(default_factory=dict, description="the decision's record (the transition's)")
    data: JsonObject = Field(default_factory=dict, description="merged into the host's data (key by key)")


class RolloutHostNote(_In):
    holder: Holder
    detail: JsonObject


class RolloutStateChange(_In):
    holder: Holder
    state: RolloutState
    reason: str = Field("", pattern=TEXT)
    wave: int | None = Field(None, ge=0, description="the wave the rollout is at from now; none: unchanged")
    detail: JsonObject = Field(default_factory=dict)
    expect: RolloutState | None = Field(None, description="compare-and-set: refused (409 hyb.rollout.stale_state) "
                                        "unless the rollout is in this state (an operator's pause came first)")


class RolloutVerb(_In):
    reason: str = Field("", pattern=TEXT, examples=["change freeze"])


class LeaseTake(_In):
    holder: Holder
    ttl_s: float = Field(gt=0, le=3600)
    replace_holder: str | None = Field(None, min_length=1, max_length=255, pattern=PRINTABLE,
                                       description="take the lease from this holder, whose process the caller "
                                                   "found dead, even before it lapses")


class LeaseRenew(_In):
    holder: Holder
    ttl_s: float = Field(gt=0, le=3600)


class LeaseOut(BaseModel):
    holder: str
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


class RolloutsOut(BaseModel):
    items: list[RolloutOut]


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
    holder: str
    detail: dict[str, Any]


class TransitionsOut(BaseModel):
    items: list[TransitionOut]
