"""Tests, development tools and benches find and stop their own processes by PID, process
group or session, never the machine's by name: ``pgrep -f``, ``pkill`` and ``killall``
also match whatever else runs on the machine (another worker's daemons, another
engineer's run), so a test that uses them fails, or kills, because of someone else.

The walk reads Python files with ``ast`` (string constants: an argument list such as
``["pkill", "-f", ...]`` or a shell command line; comments and docstrings may name the
commands, e.g. to say that a pattern is matched "like pgrep -f") and shell scripts line
by line without their comments.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WHERE = ("tests", "tools/dev", "bench")
SELF = Path(__file__).resolve()  # its own examples of what it refuses

# In a command line: pkill or killall as a command word, or pgrep with an option that has f
# (-f, -af, -fl ...; --full).
COMMAND = re.compile(r"(?:^|[\s;&|(`'\"/])(?:pkill|killall|pgrep(?=\s)(?:\s+-\S+)*?\s+(?:-[a-zA-Z]*f\b|--full))(?=$|[\s;&|)`'\"])")
NAMES = {"pkill", "killall"}


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _argv_hit(node: ast.List | ast.Tuple) -> bool:
    """An argument list whose program is pkill/killall, or pgrep with -f."""
    words = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    if not words or not node.elts or not isinstance(node.elts[0], ast.Constant):
        return False
    program = words[0].rsplit("/", 1)[-1]
    return program in NAMES or (program == "pgrep" and any(
        w == "--full" or (w.startswith("-") and not w.startswith("--") and "f" in w) for w in words[1:]))


def python_hits(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(), str(path))
    skip = _docstrings(tree)
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple)) and _argv_hit(node):
            lines.add(node.lineno)
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
              and COMMAND.search(node.value)):
            lines.add(node.lineno)
    return sorted(lines)


def shell_hits(path: Path) -> list[int]:
    out = []
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        code = re.sub(r"(?:^|\s)#.*", "", line)  # a comment: '#' starting a word
        if COMMAND.search(code):
            out.append(n)
    return out


def is_shell(path: Path) -> bool:
    if path.suffix in (".sh", ".bash"):
        return True
    if path.suffix or not path.is_file():
        return False
    with path.open("rb") as f:
        head = f.readline(100)
    return head.startswith(b"#!") and (b"sh" in head)


def hits(root: Path = REPO) -> list[str]:
    out = []
    for top in WHERE:
        for path in sorted((root / top).rglob("*")):
            if path.resolve() == SELF or ".venv" in path.parts or "__pycache__" in path.parts:
                continue
            if path.suffix == ".py":
                found = python_hits(path)
            elif is_shell(path):
                found = shell_hits(path)
            else:
                continue
            out += [f"{path.relative_to(root)}:{n}" for n in found]
    return out


def test_no_test_tool_or_bench_finds_or_kills_processes_by_name() -> None:
    found = hits()
    assert found == [], ("find or stop processes by the PID you started, or by its process group or "
                         "session (start_new_session=True, os.killpg), not by name: " + ", ".join(found))


@pytest.mark.parametrize("name, source, line", [
    ("a.py", 'import subprocess\nsubprocess.run(["pkill", "-f", "hostd serve"])\n', 2),
    ("a.py", 'import subprocess\n\nsubprocess.run(("/usr/bin/killall", "qemu"))\n', 3),
    ("a.py", 'import subprocess\nsubprocess.run(["pgrep", "-af", "^sleep 30$"], check=False)\n', 2),
    ("a.py", 'import os\nos.system(f"pgrep -f {name} >/dev/null")\n', 2),
    ("a.py", 'import subprocess\nsubprocess.run("sleep 1; pkill sleep", shell=True)\n', 2),
    ("a.sh", '#!/bin/sh\n# stop it\npkill -f scheduler || true\n', 3),
    ("run", '#!/bin/bash\nset -e\nfoo && killall -9 qemu-system-x86_64\n', 3),
])
def test_the_walk_sees_what_it_must_refuse(tmp_path: Path, name: str, source: str, line: int) -> None:
    """The checker itself: an argument list, a shell line or a command in a string is found
    with its file and line."""
    f = tmp_path / "tests" / name
    f.parent.mkdir()
    f.write_text(source)
    assert hits(tmp_path) == [f"tests/{name}:{line}"]


@pytest.mark.parametrize("name, source", [
    ("a.py", '"""Matched against the command line, like pgrep -f."""\n'),
    ("a.py", 'x = 1  # the pattern is matched like pkill -f would\n'),
    ("a.py", 'import subprocess\nsubprocess.run(["pgrep", "-P", "123"])\n'),  # children of a PID of ours
    ("a.py", 'import os\nos.killpg(pgid, 9)\nname = "killall_guests"\n'),
    ("a.sh", '#!/bin/sh\n# never pkill here: kill "$pid"\nkill "$pid"\n'),
])
def test_the_walk_leaves_what_is_no_command(tmp_path: Path, name: str, source: str) -> None:
    f = tmp_path / "tests" / name
    f.parent.mkdir()
    f.write_text(source)
    assert hits(tmp_path) == []
