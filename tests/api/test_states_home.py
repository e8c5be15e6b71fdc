"""Each closed set of state names has one home, ``api/states.py``: a module of ``api/``,
``scheduler/``, ``tools/fleet_rollout/`` or ``tools/hybctl/`` that spells one of those
states as a literal where code decides on states keeps its own copy of the set, and a
copy goes stale when the set grows (a status table without its draining hosts, a gauge
without its stopped VMs). hostd's ledger states have theirs, ``hostd/apply/ledger.py``
(``VmState``): an uncarve's list of VMs on the host without the moving ones, a gauge
without them, were such copies.

The walk reads the sources (``ast``) and looks where a copy would be: a comparison
(``==``, ``in`` ...), an element of a tuple, list or set literal (``Literal[...]``
included), the keys of a mapping keyed by states, a default (of an argument, of a
class field, a column's ``default=``), a ``case`` pattern. A word in a message, a log
line or an f-string is text, not a copy, and is not looked at.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from api.states import (AdminState, HostClass, HostState, MigrationState, RolloutHostState, RolloutState,
                        VmStatus)
from hostd.apply.ledger import VmState

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("api", "scheduler", "tools/fleet_rollout", "tools/hybctl")
HOME = "api/states.py"
# Alembic revisions record the schema as it was when they were written: they must not
# follow the enums. The gRPC stubs are generated.
SKIP = ("scheduler/migrations/",)
# DrainAction and OnMaintenance are left out: their words (replace, stop, migrate) are
# each other's.
ENUMS = (AdminState, HostState, VmStatus, RolloutState, RolloutHostState, HostClass, MigrationState)
STATES = frozenset(str(m) for e in ENUMS for m in e)
# (file, code on the line): why that literal is not one of the states. Kept small; an
# entry that no longer matches a finding fails too.
ALLOWED = {
    ("tools/fleet_rollout/render.py", 'd.get("rollback") in ("failed", "foreign")'):
        "how a rollback ended (a transition's detail the engine writes), not a host state",
}
HOSTD_ROOTS, HOSTD_HOME = ("hostd",), "hostd/apply/ledger.py"
HOSTD_STATES = frozenset(str(m) for m in VmState)
HOSTD_ALLOWED = {
    ("hostd/apply/migration.py", 'CRASH_POINTS = ("prepared", "migrating", "migrated")'):
        "the crash tests' points in a migration, named after its steps",
}


def copies(tree: ast.AST, states: frozenset[str] = STATES) -> Iterator[tuple[int, str, str]]:
    """(line, state, where) for each state literal of ``tree`` in a place of decision."""
    def _state(node: ast.AST | None) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in states:
            return node.value
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for x in (node.left, *node.comparators):
                if (s := _state(x)) is not None:
                    yield x.lineno, s, "a comparison"
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            for x in node.elts:
                if (s := _state(x)) is not None:
                    yield x.lineno, s, "a collection"
        elif isinstance(node, ast.Dict):
            # a record's field names are not states ({"failed": [hosts]}): only a mapping
            # whose keys (two or more) are all states counts
            keys = [_state(k) for k in node.keys]
            if len(keys) > 1 and all(keys):
                for k, s in zip(node.keys, keys):
                    yield k.lineno, str(s), "a mapping's keys"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for x in (*node.args.defaults, *node.args.kw_defaults):
                if (s := _state(x)) is not None:
                    yield x.lineno, s, "a default"
        elif isinstance(node, ast.ClassDef):
            for st in node.body:
                if isinstance(st, (ast.Assign, ast.AnnAssign)) and (s := _state(st.value)) is not None:
                    yield st.lineno, s, "a field's default"
        elif isinstance(node, ast.keyword) and node.arg in ("default", "server_default"):
            if (s := _state(node.value)) is not None:
                yield node.value.lineno, s, "a default"
        elif isinstance(node, ast.MatchValue):
            if (s := _state(node.value)) is not None:
                yield node.value.lineno, s, "a case"


def sources(roots: tuple[str, ...], home: str) -> Iterator[Path]:
    for root in roots:
        for p in sorted((REPO / root).rglob("*.py")):
            rel = p.relative_to(REPO).as_posix()
            if rel != home and not rel.startswith(SKIP) and "_pb2" not in p.name:
                yield p


@pytest.mark.parametrize("roots, home, states, allowed", [
    (ROOTS, HOME, STATES, ALLOWED), (HOSTD_ROOTS, HOSTD_HOME, HOSTD_STATES, HOSTD_ALLOWED)], ids=["api", "hostd"])
def test_no_module_keeps_its_own_copy_of_a_state_set(roots, home, states, allowed) -> None:  # type: ignore[no-untyped-def]
    found, allowed_used = [], set()
    for p in sources(roots, home):
        rel = p.relative_to(REPO).as_posix()
        text = p.read_text()
        lines = text.splitlines()
        for line, state, where in sorted(set(copies(ast.parse(text, filename=rel), states))):
            key = next((k for k in allowed if k[0] == rel and k[1] in lines[line - 1]), None)
            if key is not None:
                allowed_used.add(key)
                continue
            found.append(f"{rel}:{line}: {state!r} in {where}: import it from {home}")
    assert not found, "state literals outside their home:\n" + "\n".join(found)
    assert allowed_used == set(allowed), f"allow-list entries that match nothing: {set(allowed) - allowed_used}"


def test_the_walk_finds_each_kind_of_copy() -> None:
    src = '''
from typing import Literal
A = ("active", "cordoned")
B = Literal["pending", "running"]
def f(x, state="paused", *, to="verified"):
    if x.status == "stopped" or "carving" in x.states:
        return {"draining": 1, "down": 2}
    match x:
        case "halted":
            pass
    log.info("host %s is %s", x, "active")
    return f"{x} failed", {"skipped": [], "name": 1}, {"failed": [x]}
class C:
    state: str = "converting"
col = mapped_column(String(16), default="unconverted")
'''
    got = sorted((line, s) for line, s, _ in copies(ast.parse(src)))
    assert got == [(3, "active"), (3, "cordoned"), (4, "pending"), (4, "running"), (5, "paused"), (5, "verified"),
                   (6, "carving"), (6, "stopped"), (7, "down"), (7, "draining"), (9, "halted"),
                   (14, "converting"), (15, "unconverted")]


def test_a_host_state_is_an_admin_state_or_down() -> None:
    assert [str(s) for s in HostState] == [str(s) for s in AdminState] + ["down"]
