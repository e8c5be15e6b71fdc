"""How the console shows things: times, counts, an audit record's detail, a state's
colour, a policy's name, a principal. Jinja filters and globals, installed on the
console's template environment by ``install``; pure functions, no request."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from api.states import AdminState, HostClass, HostState, RolloutHostState, RolloutState, VmStatus
from scheduler.policies import Principal


def when(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def num(v: Any) -> str:
    """A count with thousands separators (168,000,000); anything else as it is."""
    if isinstance(v, bool) or v is None:
        return "-" if v is None else str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:,.0f}" if v.is_integer() else f"{v:,.2f}"
    return str(v)


def size(v: Any) -> str:
    """Bytes as an operator reads them (512 MiB, 1.5 GiB); anything else as ``num``."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return num(v)
    x = float(v)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(x) < 1024 or unit == "TiB":
            return f"{x:.0f} {unit}" if unit == "B" or x.is_integer() else f"{x:.1f} {unit}"
        x /= 1024
    return num(v)  # not reached


def detail_rows(detail: Any) -> list[tuple[str, str]]:
    """An audit record's detail as rows (key, value as text): a table, not raw JSON."""
    if not isinstance(detail, dict):
        return [("", json.dumps(detail))] if detail not in (None, "", {}) else []
    return [(str(k), v if isinstance(v, str) else json.dumps(v, sort_keys=True, separators=(", ", ": ")))
            for k, v in sorted(detail.items())]


# A state's colour on every page (console.css: .st-ok green, -busy blue, -held amber,
# -bad red, -idle grey), keyed by the states' own names (api/states.py). The legend in
# _tones.html says what each colour means.
TONES: dict[str, str] = {}
for _tone, _members in (
        ("ok", (HostState.ACTIVE, VmStatus.RUNNING, RolloutState.DONE, RolloutHostState.VERIFIED, HostClass.CARVED)),
        ("busy", (AdminState.DRAINING, VmStatus.CREATING, VmStatus.DELETING, RolloutState.ABORTING,
                  RolloutState.ROLLING_BACK, RolloutHostState.BASELINED, RolloutHostState.CARVING,
                  RolloutHostState.REBOOTING, RolloutHostState.SOAKING, RolloutHostState.RESTORING,
                  HostClass.CONVERTING)),
        ("held", (AdminState.CORDONED, VmStatus.STOPPED, RolloutState.PAUSED, RolloutState.ABORTED,
                  RolloutState.ROLLED_BACK, RolloutHostState.SKIPPED)),
        ("bad", (HostState.DOWN, VmStatus.FAILED, RolloutState.HALTED)),
        ("idle", (VmStatus.PENDING, HostClass.UNCONVERTED))):
    TONES.update(dict.fromkeys(map(str, _members), _tone))


def policy_label(digest: str | None, names: dict[str, str]) -> str:
    """A carve policy by its name (the rollout that carried it), else its digest's first
    12 characters; the whole digest goes in the title."""
    if not digest:
        return "-"
    return names.get(digest.lower()) or digest[:12]


def principal_label(p: Principal) -> str:
    return p.name + (" (admin)" if p.admin else f" (tenant {p.tenant})" if p.tenant else "")


def install(env: Any) -> None:
    env.filters["when"] = when
    env.filters["pct"] = lambda v: "-" if v is None else f"{v * 100:.1f} %"
    env.filters["tojson_attr"] = lambda v: json.dumps(v, sort_keys=True)
    env.filters["num"] = num
    env.filters["size"] = size
    env.filters["detail_rows"] = detail_rows
    env.filters["tone"] = lambda v: TONES.get(str(v), "plain")
    env.globals["policy_label"] = policy_label
    env.globals["principal_label"] = principal_label
