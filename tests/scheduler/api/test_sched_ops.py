"""The scheduler as an operator runs it: `scheduler serve` stops on SIGTERM within its
grace period although a client keeps a request open, and `/readyz` says not ready while
its database refuses writes (a real full file system: a tmpfs of a few MiB), ready again
once space is back."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from tools.dev.procs import Scheduler, free_port
from tools.dev.smallfs import fill, small_tmpfs

from sched_helpers import host_body
from test_sched_tls import config

# xdist: own scheduler process: not the machine group
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("sched-ops")]


def test_sigterm_stops_the_scheduler_within_its_grace_although_a_request_stays_open(tmp_path: Path) -> None:
    """A client sends a request's headers and half its body, then waits: without a bound
    uvicorn waits for that connection for ever ("Waiting for connections to close")."""
    s = Scheduler(config(tmp_path, None, plaintext=True, shutdown_grace_s=2), free_port(), dict(os.environ),
                  tmp_path / "s.log").start()
    port = int(s.url.rsplit(":", 1)[1])
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
            c.sendall(b"POST /v1/hosts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer adm\r\n"
                      b"Content-Type: application/json\r\nContent-Length: 4096\r\n\r\n{\"name\": ")
            time.sleep(0.5)  # the request is in flight: its handler waits for the rest of the body
            assert s.proc is not None and s.proc.poll() is None
            t0 = time.monotonic()
            s.proc.terminate()
            try:
                rc = s.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pytest.fail("scheduler still running 20 s after SIGTERM with shutdown_grace_s = 2:\n"
                            + s.log.read_text()[-2000:])
            took = time.monotonic() - t0
        assert rc in (0, -15), s.log.read_text()[-2000:]  # uvicorn re-raises the SIGTERM it caught
        assert took < 12, f"stopped {took:.1f} s after SIGTERM, grace 2 s"
    finally:
        s.stop()


@pytest.fixture
def small_fs(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A 16 MiB tmpfs the test can fill (root only: mount)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    with small_tmpfs(tmp_path / "small", "16m") as d:
        yield d


@pytest.mark.root
def test_readyz_is_503_while_the_database_refuses_writes_and_200_once_it_stores_them(small_fs: Path,
                                                                                     tmp_path: Path) -> None:
    cfg = config(tmp_path, None, plaintext=True)
    cfg.write_text(cfg.read_text().replace(f'url = "sqlite:///{tmp_path}/s.db"', f'url = "sqlite:///{small_fs}/s.db"'))
    s = Scheduler(cfg, free_port(), dict(os.environ), tmp_path / "s.log").start()
    adm = {"Authorization": "Bearer adm"}
    hst = {"Authorization": "Bearer hst"}
    try:
        assert httpx.get(f"{s.url}/readyz", timeout=10).status_code == 200
        ballast = fill(small_fs)
        refused = 0
        for i in range(40):  # registrations grow the database (and its WAL) until a write is refused
            r = httpx.post(f"{s.url}/v1/hosts", json=host_body(f"oss-{i}"), headers=hst, timeout=30)
            if r.status_code == 503:
                assert r.json()["error"]["code"] == "hyb.store.unavailable", r.text
                refused += 1
                break
            assert r.status_code == 201, r.text
        assert refused, "the full file system never refused a write"
        r = httpx.get(f"{s.url}/readyz", timeout=10)
        assert r.status_code == 503, r.text
        assert "database refuses writes since" in r.json()["error"]["message"], r.text
        assert "full" in r.json()["error"]["message"], r.text
        assert httpx.get(f"{s.url}/healthz", timeout=10).status_code == 200  # alive, only not ready
        ballast.unlink()
        r = httpx.get(f"{s.url}/readyz", timeout=10)
        assert r.status_code == 200, r.text
        assert httpx.post(f"{s.url}/v1/hosts", json=host_body("oss-after"), headers=hst, timeout=30).status_code == 201
        assert httpx.get(f"{s.url}/v1/hosts/oss-after", headers=adm, timeout=10).status_code == 200
    finally:
        s.stop()
