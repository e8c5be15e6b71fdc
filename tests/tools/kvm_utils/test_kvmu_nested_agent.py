"""The nested-SVM guest's command agent (tools/dev/nested_agent.py) on a pty here, as it runs
on the guest's ttyS1: one JSON request a line, one JSON answer a line, hard timeouts; and
what NestedGuest says before it starts anything."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tools.dev import nested_svm

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def agent():
    master, slave = os.openpty()
    proc = subprocess.Popen([sys.executable, str(REPO / "tools/dev/nested_agent.py"), os.ttyname(slave)],
                            stdin=subprocess.DEVNULL, start_new_session=True)
    buf = bytearray()

    def line(timeout: float = 10) -> str:
        deadline = time.monotonic() + timeout
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            assert left > 0, f"no line from the agent in {timeout} s: {bytes(buf)!r}"
            ready = select.poll()  # not select(): a worker may hold descriptors past 1,024
            ready.register(master, select.POLLIN)
            if ready.poll(left * 1000):
                buf.extend(os.read(master, 4096))
        out, _, rest = bytes(buf).partition(b"\n")
        buf[:] = rest
        return out.decode().strip()

    def ask(req: dict | str, timeout: float = 10) -> dict:
        os.write(master, (req if isinstance(req, str) else json.dumps(req)).encode() + b"\n")
        return json.loads(line(timeout))

    try:
        assert line() == "NESTED-AGENT-READY"
        yield ask
    finally:
        proc.kill()
        proc.wait()
        os.close(master)
        os.close(slave)


def test_agent_runs_a_command_and_answers_one_line(agent) -> None:
    r = agent({"id": 1, "cmd": "echo out; echo err >&2; exit 3", "timeout": 10})
    assert (r["id"], r["rc"], r["out"], r["err"], r["timed_out"]) == (1, 3, "out\n", "err\n", False)
    # no echo of the request (raw, -echo): the next answer is the next command's
    assert agent({"id": 2, "cmd": "printf 'a\\nb'", "timeout": 10})["out"] == "a\nb"


def test_agent_kills_a_command_past_its_timeout(agent) -> None:
    t0 = time.monotonic()
    r = agent({"id": 7, "cmd": "sleep 60 & sleep 60", "timeout": 0.5}, timeout=15)
    assert r["id"] == 7 and r["timed_out"] and r["rc"] != 0
    assert time.monotonic() - t0 < 8           # SIGINT to the group, SIGKILL 5 s later at most


def test_agent_answers_a_bad_request_and_skips_noise(agent) -> None:
    r = agent('{"id": 3}')
    assert r["id"] is None and r["rc"] == -1 and "KeyError" in r["err"]
    assert agent('garbage\n{"id": 4, "cmd": "true"}')["id"] == 4


def test_init_line_is_one_kernel_argument() -> None:
    """PID 1's command is passed as one double-quoted kernel argument: no quote inside."""
    assert '"' not in nested_svm._init_cmd() and "\n" not in nested_svm._init_cmd()


def test_boot_names_a_missing_image_and_starts_nothing(tmp_path: Path) -> None:
    g = nested_svm.NestedGuest(tmp_path / "g", image_dir=tmp_path / "none")
    with pytest.raises(nested_svm.NestedError, match=r"none: no vmlinuz, initrd.img, online.raw"):
        g.boot()
    assert g.proc is None
    with pytest.raises(nested_svm.NestedError, match="not booted"):
        g.run("true")


def test_result_json_is_the_last_json_line() -> None:
    r = nested_svm.Result(0, 'noise\n{"a": 1}\n{"b": 2}\ntrailer\n', "", 0.1, False)
    assert r.json() == {"b": 2}
    with pytest.raises(nested_svm.NestedError, match="no JSON line"):
        nested_svm.Result(1, "nothing", "err", 0.1, False).json()
