"""What `fleet-rollout plan` and `status` print: rich tables, or JSON."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from api.states import RolloutHostState, RolloutState
from tools.fleet_rollout.plan import Plan
from tools.fleet_rollout.store import Store

# The hosts that need an operator's eye in `status`.
PROBLEMS = (RolloutHostState.FAILED, RolloutHostState.ROLLING_BACK, RolloutHostState.ROLLED_BACK,
            RolloutHostState.SKIPPED)


def render_plan(plan: Plan, console: Console) -> None:
    t = Table(title=f"{plan.hosts} hosts in {len(plan.waves)} waves")
    for col in ("wave", "hosts", "racks", "first hosts"):
        t.add_column(col, justify="right" if col in ("wave", "hosts", "racks") else "left")
    for i, w in enumerate(plan.waves):
        names = ", ".join(h.name for h in w[:4]) + (", ..." if len(w) > 4 else "")
        t.add_row(str(i) + (" (canary)" if i == 0 and len(w) == 1 else ""), str(len(w)),
                  str(len({h.rack for h in w})), names)
    console.print(t)
    if plan.skipped:
        s = Table(title=f"{len(plan.skipped)} hosts skipped (not attempted)")
        s.add_column("host")
        s.add_column("why")
        for h, why in plan.skipped:
            s.add_row(h.name, why)
        console.print(s)


def status_dict(store: Store, name: str) -> dict:
    """The rollout as `status --json` prints it. ``skipped``: every host left out, at
    plan time (``"at": "plan"``, not in the rollout) or when its turn came (``"at":
    "run"``, with its wave; also under ``problems``), each with why."""
    r = store.rollout(name)
    problems = [{"host": h.name, "wave": h.wave, "state": h.state, **_reasons(store, name, h.name)}
                for h in store.brief(name) if h.state in PROBLEMS]
    skipped = [{"host": s["host"], "reason": s["reason"], "at": "plan"} for s in r.skipped]
    skipped += [{"host": p["host"], "reason": p["reason"], "at": "run", "wave": p["wave"]}
                for p in problems if p["state"] == RolloutHostState.SKIPPED]
    return {"name": name, "kind": r.spec.kind, "state": r.state, "reason": r.reason, "wave": r.wave,
            "waves": r.counts, "hosts": sum(sum(c.values()) for c in r.counts), "skipped": skipped,
            "lease": {"holder": r.lease.holder, "principal": r.lease.principal, "fence": r.lease.fence,
                      "expires": r.lease.expires} if r.lease else None,
            "policy_digest": r.spec.policy_digest, "problems": problems}


def _reasons(store: Store, name: str, host: str) -> dict[str, str]:
    """Why the host failed (the step's failure), and why its rollback failed, if it did."""
    out = {"reason": "", "rollback": ""}
    for t in store.transitions(name, host):
        d = t["detail"]
        if t["to"] == RolloutHostState.FAILED and d.get("rollback") in ("failed", "foreign"):
            out["rollback"] = str(d.get("reason", ""))
        elif t["to"] in (RolloutHostState.FAILED, RolloutHostState.SKIPPED) and d.get("reason"):
            out["reason"] = str(d["reason"])
    return out


def render_status(st: dict, console: Console) -> None:
    head = f"rollout {st['name']} ({st['kind']}): {st['state']}"
    if st["reason"]:
        head += f" - {st['reason']}"
    console.print(head, highlight=False, markup=False)
    if st["lease"]:
        x = st["lease"]
        console.print(f"run by {x['principal']}'s controller {x['holder']} (fence {x['fence']})", highlight=False,
                      markup=False)
    t = Table()
    t.add_column("wave", justify="right")
    for s in RolloutHostState:
        t.add_column(s.replace("_", " "), justify="right")
    for i, c in enumerate(st["waves"]):
        mark = " <" if i == st["wave"] and st["state"] in (RolloutState.RUNNING, RolloutState.PAUSED,
                                                           RolloutState.HALTED) else ""
        t.add_row(f"{i}{mark}", *[str(c.get(s, "")) for s in RolloutHostState])
    console.print(t)
    if st["problems"]:
        p = Table(title="hosts failed or skipped")
        for col in ("host", "wave", "state", "reason", "rollback"):
            p.add_column(col)
        for x in st["problems"]:
            p.add_row(x["host"], str(x["wave"]), x["state"], x["reason"], x["rollback"])
        console.print(p)
    at_plan = [s for s in st["skipped"] if s["at"] == "plan"]
    if at_plan:
        console.print(f"{len(at_plan)} hosts skipped at plan time (status --json lists them)")
