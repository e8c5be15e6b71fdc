"""How a refusal names the active rollouts that hold hosts: the scheduler's overlap
refusal (a rollout created or rolled back over hosts another holds) and fleet-rollout's
"fits none" refusal (a plan whose hosts another rollout has just converted) say it the
same way, from here."""

from __future__ import annotations

from collections.abc import Iterable

from api.states import RolloutState

SHOWN = 10  # hosts named per holding rollout

# A rollout no controller drives keeps its hosts until an operator ends it.
IDLE = (RolloutState.PAUSED, RolloutState.HALTED)


def holders_text(held: Iterable[tuple[str, str, list[str]]]) -> str:
    """``held``'s (rollout, its state, the hosts it holds) as one clause each, joined by
    "; ": up to ``SHOWN`` hosts named, and what ends the hold: an idle rollout's abort; for one a
    controller drives, its status (it lets go when it ends) and a running one's abort."""
    parts = []
    for other, state, hosts in held:
        more = f" and {len(hosts) - SHOWN} more" if len(hosts) > SHOWN else ""
        part = f"{other} ({state}) holds {', '.join(hosts[:SHOWN])}{more}"
        if state in IDLE:
            part += (f" (a {state} rollout keeps its hosts until it is aborted: `fleet-rollout abort {other}` "
                     f"frees them, or `hybctl rollout abort {other}` for its controller to act on)")
        else:  # a controller drives it; it lets go when it ends
            stop = f", or `fleet-rollout abort {other}`" if state == RolloutState.RUNNING else ""
            part += f" (`fleet-rollout status {other}` shows it; it keeps them until it ends{stop})"
        parts.append(part)
    return "; ".join(parts)


def holders_subject(n_rollouts: int) -> str:
    """ "another active rollout" or "N other active rollouts"."""
    return "another active rollout" if n_rollouts == 1 else f"{n_rollouts} other active rollouts"
