"""A run stopped by a signal leaves nothing it started behind.

- SIGTERM (timeout(1) signals pytest's controller and its workers; a CI limit; an
  operator's ``kill``) ends a run as Ctrl-C does, so the fixtures' teardowns run
  (tests/conftest.py). Python's default is to die on the spot.
- The throwaway PostgreSQL server (``tools.dev.schedbench.postgres``: the suite's
  PostgreSQL group and the benches) stops when the process that started it dies without
  stopping it (SIGKILL), by its parent-death signal. A run killed by SIGTERM before that
  change left the suite's server running for two hours.
- A daemon a fixture is waiting for (``tools.dev.procs``: a scheduler, a hostd) is
  stopped by the start that spawned it when the wait is interrupted.

Both run real processes: a pytest of one test, a real PostgreSQL 15.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tools.dev.schedbench import PG_BIN

REPO = Path(__file__).resolve().parents[1]


def _wait_for(cond, what: str, proc: subprocess.Popen | None = None, timeout: float = 60) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert proc is None or proc.poll() is None, f"{what}: the process ended first ({proc.returncode})"
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.05)


def test_sigterm_ends_a_run_with_its_fixtures_torn_down(tmp_path: Path) -> None:
    started, torn = tmp_path / "started", tmp_path / "torn-down"
    (tmp_path / "test_victim.py").write_text(textwrap.dedent(f"""
        import pathlib
        import time

        import pytest


        @pytest.fixture
        def held():
            pathlib.Path({str(started)!r}).write_text("up")
            yield
            pathlib.Path({str(torn)!r}).write_text("torn down")


        def test_waits(held):
            time.sleep(120)
    """))
    # the suite's conftest as a plugin: this run's test is outside tests/
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-c", str(REPO / "setup.cfg"),
                             "--rootdir", str(REPO), "-p", "no:cacheprovider", "-q", str(tmp_path / "test_victim.py")],
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        _wait_for(started.exists, "the test's fixture set up", proc)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert torn.exists(), out
    assert proc.returncode == 2, out  # pytest's "interrupted"
    assert "KeyboardInterrupt" in out and "signal SIGTERM" in out, out


def test_the_postgresql_server_stops_when_its_starter_is_killed() -> None:
    assert (PG_BIN / "postgres").exists(), f"PostgreSQL 15 is installed by make deps ({PG_BIN})"
    starter = subprocess.Popen(
        [sys.executable, "-c", "import time\nfrom tools.dev.schedbench import postgres\n"
                               "with postgres({}) as (_u, _port, pid):\n    print(pid, flush=True)\n    time.sleep(120)\n"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, text=True,
        start_new_session=True)
    pid, base = 0, None
    try:
        pid = int(starter.stdout.readline())  # type: ignore[union-attr]
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        base = Path(argv[argv.index("-D") + 1]).parent  # made by postgres(), its data directory in it
        starter.kill()  # SIGKILL: no finally of its own runs
        starter.wait()
        _wait_for(lambda: not _alive(pid), "the postmaster gone after its starter was killed", timeout=30)
    finally:
        if starter.poll() is None:
            starter.kill()
            starter.wait()
        if pid and _alive(pid):
            os.kill(pid, signal.SIGKILL)
        if base is not None and base.name.startswith("hyb-bench-pg-"):
            shutil.rmtree(base, ignore_errors=True)


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for its new parent to reap it."""
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return False


def test_a_daemon_whose_start_is_interrupted_is_stopped(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A run stopped while a fixture waits for its scheduler to be ready: the fixture
    never got the object its teardown would stop, so ``start`` stops what it spawned.
    The daemon is a stand-in that never gets ready; the interrupt is raised where the
    wait would see it."""
    from tools.dev import procs

    s = procs.Scheduler(tmp_path / "none.toml", 1, dict(os.environ), tmp_path / "s.log")
    s.argv = [sys.executable, "-c", "import time; time.sleep(120)"]

    def interrupted(self):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt
    monkeypatch.setattr(procs.Scheduler, "wait_ready", interrupted)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            s.start()
        assert s.proc is not None and s.proc.poll() is not None, "the spawned daemon still runs"
    finally:
        if s.proc is not None and s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()
