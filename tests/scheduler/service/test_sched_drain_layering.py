"""The drain loop holds no query of its own (scheduler/service/drains.py): it reads
through the repos and changes VMs through ``VmService``, the one owner of a VM's
status. Checked on the source (``ast``), like tests/test_import_direction.py: no
SQLAlchemy import, no statement run (``execute``, ``scalars``, a connection of its
own), and a session it opens is only handed to repo functions, never used itself."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
DRAINS = REPO / "scheduler/service/drains.py"

# What runs SQL or works the ORM's unit of work, on a session, a connection or an engine.
QUERYING = {"execute", "exec_driver_sql", "scalars", "scalar", "query", "connect", "connection",
            "merge", "flush", "expunge", "refresh"}
OPENS = {"read", "write", "snapshot", "batch_write", "feed_read"}  # Store's transactions


def own_queries(source: str) -> list[str]:
    """Where ``source`` queries the database itself, one line each."""
    tree = ast.parse(source)
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sqlalchemy":
            bad.append(f"{node.lineno}: imports from {node.module}")
        elif isinstance(node, ast.Import):
            bad += [f"{node.lineno}: imports {a.name}" for a in node.names if a.name.split(".")[0] == "sqlalchemy"]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in QUERYING:
            bad.append(f"{node.lineno}: calls .{node.func.attr}()")
    # the names its sessions go by (``with self.store.read() as s``), wherever they are used
    sessions = {item.optional_vars.id for node in ast.walk(tree) if isinstance(node, ast.With)
                for item in node.items
                if isinstance(item.optional_vars, ast.Name) and isinstance(item.context_expr, ast.Call)
                and isinstance(item.context_expr.func, ast.Attribute) and item.context_expr.func.attr in OPENS}
    bad += [f"{node.lineno}: uses {node.value.id}.{node.attr} (a session)" for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in sessions]
    return sorted(bad, key=lambda b: int(b.split(":")[0]))


def test_the_drain_loop_queries_nothing_itself() -> None:
    assert own_queries(DRAINS.read_text()) == []


def test_the_check_sees_a_query_written_in_the_drain_loop() -> None:
    """The checker itself, on the shapes a drain wrote its VMs' status with."""
    source = '''
from sqlalchemy import update
def stop(self, vm_id):
    with self.store.write() as s:
        s.execute(update(Vm).where(Vm.id == vm_id).values(status="deleting"))
def plan_for(self, host):
    with self.store.read() as s:
        h = host_repo.get_host(session=s, name=host)
        s.expunge(h)
def round(self):
    with self.store.engine.connect() as c:
        return c
'''
    assert own_queries(source) == [
        "2: imports from sqlalchemy",
        "5: calls .execute()",
        "5: uses s.execute (a session)",
        "9: calls .expunge()",
        "9: uses s.expunge (a session)",
        "11: calls .connect()",
    ]
