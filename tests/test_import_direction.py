"""The dependency direction of ../shared/DESIGN.md, checked on every import statement
of the product packages (module level and inside functions alike):

- ``api`` imports nothing of ours: it is the contract both daemons stand on;
- ``scheduler`` and ``hostd`` never import each other;
- ``tools.fleet_rollout`` and ``tools.hybctl`` talk to the others through ``api`` only;
- ``tools.dev`` (development scripts, the library the tests and benches share) may import
  anything, and no product module imports it;
- inside ``hostd`` the layers only look down:
  helpers -> discover -> health -> carve -> domain -> apply -> rpc -> the command line;
- inside ``scheduler``, the web console is a client beside the API: it imports nothing of
  ``scheduler.api`` (it calls the services, after the rules of ``scheduler.policies``),
  and of the API only the app factory, which composes both, imports the console.

The walk reads source files (``ast``), so it also sees imports that a test run never
executes, and it fails on a module it cannot place in a layer.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
OURS = ("api", "hostd", "scheduler", "tools")

# hostd's layers, lowest first. A module may import its own layer and the ones below.
HOSTD_LAYERS: tuple[tuple[str, ...], ...] = (
    ("hostd.errors", "hostd.cpulist", "hostd.metrics"),
    ("hostd.discover",),
    ("hostd.health",),
    ("hostd.carve",),
    ("hostd.domain",),
    ("hostd.apply",),
    ("hostd.rpc", "hostd.config"),  # the config is read by the wiring (the daemon, the CLI)
    ("hostd.commands", "hostd.cli"),
)
# The console and the API: siblings that the app factory composes.
CONSOLE, API, FACTORY = "scheduler.console", "scheduler.api", "scheduler.api.app"
# What each top-level part may import of ours (besides itself).
ALLOWED = {
    "api": (),
    "hostd": ("api",),
    "scheduler": ("api",),
    "tools.kvm_utils": (),
    "tools.fleet_rollout": ("api",),
    "tools.hybctl": ("api",),
    "tools.dev": ("api", "hostd", "scheduler", "tools.kvm_utils", "tools.fleet_rollout", "tools.hybctl"),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_module(name: str) -> bool:
    p = REPO.joinpath(*name.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) for every import of ours in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # ``from hostd import commands`` imports the module hostd.commands
            names = [f"{base}.{a.name}" if is_module(f"{base}.{a.name}") else base for a in node.names]
        else:
            continue
        out += [(node.lineno, n) for n in names if n.split(".")[0] in OURS]
    return out


def part_of(module: str) -> str:
    for part in sorted(ALLOWED, key=len, reverse=True):
        if module == part or module.startswith(part + "."):
            return part
    return module.split(".")[0]


def hostd_layer(module: str) -> int:
    for i, layer in enumerate(HOSTD_LAYERS):
        if any(module == m or module.startswith(m + ".") for m in layer):
            return i
    raise LookupError(module)


def product_files() -> list[Path]:
    files = []
    for top in ("api", "hostd", "scheduler", "tools"):
        files += [p for p in (REPO / top).rglob("*.py") if "migrations" not in p.parts
                  and not p.name.endswith(("_pb2.py", "_pb2_grpc.py"))]
    return sorted(files)


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def violations() -> list[str]:
    bad = []
    for path in product_files():
        me = module_name(path)
        mine = part_of(me)
        for line, target in imports_of(path):
            theirs = part_of(target)
            where = f"{path.relative_to(REPO)}:{line}: {me} imports {target}"
            if theirs != mine and theirs not in ALLOWED.get(mine, ()):
                bad.append(f"{where} ({mine} may import {list(ALLOWED.get(mine, ())) or 'nothing of ours'})")
            elif mine == theirs == "hostd" and hostd_layer(target) > hostd_layer(me):
                bad.append(f"{where} (a lower layer importing a higher one)")
            elif within(me, CONSOLE) and within(target, API):
                bad.append(f"{where} (the console calls services, never the API's modules)")
            elif within(me, API) and me != FACTORY and within(target, CONSOLE):
                bad.append(f"{where} (only the app factory, {FACTORY}, composes the console)")
    return bad


def test_every_hostd_module_has_a_layer() -> None:
    unplaced = []
    for p in product_files():
        if module_name(p).startswith("hostd."):
            try:
                hostd_layer(module_name(p))
            except LookupError:
                unplaced.append(module_name(p))
    assert unplaced == [], "add these to HOSTD_LAYERS: " + ", ".join(unplaced)


def test_imports_follow_the_dependency_direction() -> None:
    assert violations() == []


@pytest.mark.parametrize("source, part, target", [
    ("from hostd.carve.plan import plan_host\n", "scheduler/fake.py", "hostd.carve.plan"),
    ("import scheduler.fit\n", "hostd/fake.py", "scheduler.fit"),
    ("def f():\n    from hostd.rpc.daemon import start\n", "hostd/carve/fake.py", "hostd.rpc.daemon"),
    ("from ..apply import vms\n", "hostd/domain/fake.py", "hostd.apply"),
    ("from tools.dev.procs import Hostd\n", "tools/fleet_rollout/fake.py", "tools.dev.procs"),
    ("from scheduler.api.routes import hosts\n", "scheduler/console/fake.py", "scheduler.api.routes"),
    ("def f():\n    from scheduler.api.deps import Principal\n", "scheduler/console/fake.py", "scheduler.api.deps"),
    ("from ..api import app\n", "scheduler/console/fake.py", "scheduler.api"),
    ("from scheduler.console import routes\n", "scheduler/api/routes/fake.py", "scheduler.console"),
])
def test_the_walk_sees_what_it_must_refuse(tmp_path: Path, monkeypatch, source, part, target) -> None:
    """The checker itself: a forbidden import, also lazy or relative, is found."""
    f = tmp_path / part
    f.parent.mkdir(parents=True)
    f.write_text(source)
    monkeypatch.setattr(__import__(__name__), "REPO", tmp_path)
    assert [t for _, t in imports_of(f)] == [target]
    assert len(violations()) == 1


def test_the_app_factory_may_compose_the_console(tmp_path: Path, monkeypatch) -> None:
    f = tmp_path / "scheduler/api/app.py"
    f.parent.mkdir(parents=True)
    f.write_text("from scheduler.console import routes as console_routes\n")
    monkeypatch.setattr(__import__(__name__), "REPO", tmp_path)
    assert violations() == []
