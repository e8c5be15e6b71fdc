"""The rollout spec: what to roll, to which hosts, how fast, and what the gates allow.

Read from TOML (``tools/fleet_rollout/rollout.example.toml`` documents every key).
Validation errors name the field (``waves.percent[2]: over 100``) and nothing is touched.
The spec is stored with the rollout, so a resumed run uses the spec it started with.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from api.bounds import POLICY_BYTES_MAX, check_policy_text
from api.policy import policy_digest

NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


class SpecError(ValueError):
    """The spec is invalid; ``field`` names the key."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Inventory(_Strict):
    # "scheduler": the scheduler's registered hosts; otherwise an Ansible-style
    # inventory file (INI or YAML) whose hosts carry rack/labels as host variables.
    source: str = "scheduler"
    # label=value,... ; "rack" selects the failure domain; every pair must match.
    select: str = ""


class Waves(_Strict):
    canary: Annotated[int, Field(ge=0, le=100)] = 1  # hosts alone in the first wave
    # Cumulative share of the fleet converted at the end of each wave after the canary.
    percent: list[Annotated[float, Field(gt=0)]] = Field(default_factory=lambda: [1.0, 5.0, 25.0, 100.0])
    # Failed hosts a wave may have before the rollout halts: one number for every wave,
    # or one per wave (the canary first).
    max_failures: list[Annotated[int, Field(ge=0)]] = Field(default_factory=lambda: [0])

    @field_validator("percent")
    @classmethod
    def _percent(cls, v: list[float]) -> list[float]:
        for i, p in enumerate(v):
            if p > 100:
                raise ValueError(f"[{i}] {p} is over 100")
            if i and p <= v[i - 1]:
                raise ValueError(f"[{i}] {p} must be above the wave before ({v[i - 1]})")
        if not v or v[-1] != 100:
            raise ValueError("the last wave must reach 100")
        return v


class Limits(_Strict):
    concurrency: Annotated[int, Field(ge=1, le=10000)] = 20  # hosts in flight fleet-wide
    per_rack: Annotated[int, Field(ge=1)] = 1  # hosts in flight per failure domain
    rpc_timeout_s: Annotated[float, Field(gt=0, le=600)] = 10.0
    # A host that does not answer for this long fails its step (a hostd restarting under
    # systemd comes back well within it; a dead host does not).
    unreachable_s: Annotated[float, Field(ge=0, le=3600)] = 30.0


class Steps(_Strict):
    baseline_s: Annotated[float, Field(ge=0, le=86400)] = 60.0  # IO-health window before the change
    soak_s: Annotated[float, Field(ge=0, le=86400)] = 120.0  # window after it, judged by the gate
    # Where the policy needs boot-time changes: run this (argv; {host} and {address}
    # replaced), then wait for hostd to come back with a new start time.
    reboot_command: list[str] = Field(default_factory=list)
    reboot_timeout_s: Annotated[float, Field(gt=0)] = 900.0
    # kind = "hostd": the command that installs and restarts the new hostd on a host.
    upgrade_command: list[str] = Field(default_factory=list)
    upgrade_timeout_s: Annotated[float, Field(gt=0)] = 300.0
    # A carve hostd refuses because it would strand the host's VMs: drain the host (the
    # scheduler moves the VMs that allow it) and carve again, failing the host when the
    # drain has not finished after this long; 0: fail the host at once, as before.
    drain_timeout_s: Annotated[float, Field(ge=0, le=7 * 86400)] = 1800.0


class Gate(_Strict):
    """A converted host's soak window is compared with its own baseline and with
    unconverted control hosts over the same window (Mann-Whitney U, one-sided: is the
    converted host worse?). A metric fails when the difference is significant at
    ``alpha`` *and* larger than its allowance; absolute ceilings fail on their own."""

    alpha: Annotated[float, Field(gt=0, lt=1)] = 0.01
    min_samples: Annotated[int, Field(ge=3)] = 10
    controls: Annotated[int, Field(ge=0, le=50)] = 3
    # Allowed rise of the median over the baseline/controls, in percent, per metric.
    probe_p99_rise_pct: Annotated[float, Field(ge=0)] = 10.0
    psi_rise_pct: Annotated[float, Field(ge=0)] = 50.0
    # Absolute ceilings over the soak window (None: no ceiling).
    psi_some_avg10_max: Annotated[float, Field(ge=0, le=100)] | None = 10.0
    foreign_cpu_max: Annotated[float, Field(ge=0)] | None = 0.05  # CPU-seconds per second on io_cpus
    probe_failed_max: Annotated[int, Field(ge=0)] | None = 0


class RolloutSpec(_Strict):
    name: str = Field(pattern=NAME)
    # convert: carve unconverted hosts; policy: carve a new policy on converted hosts
    # (a host whose VMs it would not hold is drained first, or skipped with
    # steps.drain_timeout_s = 0); hostd: a new hostd version.
    kind: Literal["convert", "policy", "hostd"] = "convert"
    policy: str = ""  # path of the carve policy (relative to the spec file); convert/policy
    hostd_version: str = ""  # kind = "hostd": the version every host must report afterwards
    inventory: Inventory = Inventory()
    waves: Waves = Waves()
    limits: Limits = Limits()
    steps: Steps = Steps()
    gate: Gate = Gate()
    # Filled in by load_spec: the policy's text (stored with the rollout) and its digest.
    policy_text: str = ""

    @model_validator(mode="after")
    def _kind_needs(self) -> RolloutSpec:
        if self.kind in ("convert", "policy") and not self.policy:
            raise ValueError("policy: required for kind = " + repr(self.kind))
        if self.kind == "hostd":
            if not self.hostd_version:
                raise ValueError("hostd_version: required for kind = 'hostd'")
            if not self.steps.upgrade_command:
                raise ValueError("steps.upgrade_command: required for kind = 'hostd'")
        return self

    @property
    def policy_digest(self) -> str:
        return policy_digest(self.policy_text) if self.policy_text else ""

    def max_failures(self, wave: int) -> int:
        m = self.waves.max_failures
        return m[wave] if wave < len(m) else m[-1]

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str) -> RolloutSpec:
        return cls.model_validate_json(text)


def _field(err: dict) -> str:
    loc = err.get("loc", ())
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "spec"


def parse_spec(data: dict, base: Path | None = None) -> RolloutSpec:
    try:
        spec = RolloutSpec.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        msg = err["msg"].removeprefix("Value error, ")
        field = _field(err)
        if field == "spec" and ": " in msg:  # a model-level check names its key itself
            field, msg = msg.split(": ", 1)
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        raise SpecError(field, msg) from None
    if spec.policy and not spec.policy_text:
        path = Path(spec.policy)
        if base is not None and not path.is_absolute():
            path = base / path
        spec = spec.model_copy(update={"policy_text": read_policy(path)})
    return spec


def read_policy(path: Path) -> str:
    """The policy file's text, refused here, naming the file, when hostd would refuse it
    for its size, its nesting or its syntax (api.bounds; checked before TOML parses it):
    before any host is asked, and without reading more than hostd takes."""
    try:
        with open(path, "rb") as f:
            raw = f.read(POLICY_BYTES_MAX + 1)
    except OSError as e:
        raise SpecError("policy", f"{path}: {e.strerror}") from None
    try:
        text = raw.decode()
        check_policy_text(text)
        tomllib.loads(text)
    except UnicodeDecodeError:
        raise SpecError("policy", f"{path}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as e:
        raise SpecError("policy", f"{path}: not TOML: {e}") from None
    except ValueError as e:
        raise SpecError("policy", f"{path}: {e}") from None
    return text


def load_spec(path: Path) -> RolloutSpec:
    try:
        data = tomllib.loads(path.read_text())
    except OSError as e:
        raise SpecError(str(path), e.strerror or str(e)) from None
    except tomllib.TOMLDecodeError as e:
        raise SpecError(str(path), f"not TOML: {e}") from None
    if "policy_text" in data:
        raise SpecError("policy_text", "unknown key")
    return parse_spec(data, path.parent)
