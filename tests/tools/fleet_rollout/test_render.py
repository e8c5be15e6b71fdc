"""What `fleet-rollout status` prints (tools/fleet_rollout/render.py), from a rollout the
scheduler keeps (conftest.py): a column per host state, so every host of a wave is
counted where it is."""

from __future__ import annotations

import io

from rich.console import Console

from api.states import RolloutHostState
from tools.fleet_rollout.inventory import Host
from tools.fleet_rollout.plan import make_plan
from tools.fleet_rollout.render import render_status, status_dict
from tools.fleet_rollout.spec import parse_spec

STEPS = ["pending", "baselined", "cordoned", "carving", "draining"]


def test_the_status_table_counts_a_host_in_each_state(rollouts) -> None:  # type: ignore[no-untyped-def]
    s = rollouts()
    spec = parse_spec({"name": "r1", "policy": "p", "policy_text": "x"})
    s.create(spec, make_plan([Host(f"h{i}", f"h{i}:1", "r0") for i in range(3)], spec))
    s.acquire("r1", 10)
    for frm, to in zip(STEPS, STEPS[1:]):  # the canary is being drained for its carve
        s.move("r1", "h0", frm, to)
    s.move("r1", "h1", "pending", "baselined")
    st = status_dict(s, "r1")
    assert [sum(w.values()) for w in st["waves"]] == [1, 2]

    console = Console(file=io.StringIO(), width=400)
    render_status(st, console)
    lines = console.file.getvalue().splitlines()
    head = next([c.strip() for c in line.split("┃")] for line in lines if "┃" in line)
    assert head[1:-1] == ["wave"] + [str(x).replace("_", " ") for x in RolloutHostState]
    rows = [[c.strip() for c in line.split("│")] for line in lines if "│" in line]
    counts = [{col: cell for col, cell in zip(head, row) if cell} for row in rows]
    assert counts == [{"wave": "0 <", "draining": "1"}, {"wave": "1", "pending": "1", "baselined": "1"}]
