"""Daemons the end-to-end tests start: each stopped by its PID (SIGTERM, then
SIGKILL), never by name, and always in a finally."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx

from api import hostd_pb2_grpc as pb_grpc

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def grpc_stub(port: int, certs: Path) -> tuple[pb_grpc.HostdStub, grpc.Channel]:
    """A scheduler-side client of hostd with the dev CA's client certificate."""
    creds = grpc.ssl_channel_credentials((certs / "ca.crt").read_bytes(),
                                         (certs / "scheduler.key").read_bytes(),
                                         (certs / "scheduler.crt").read_bytes())
    ch = grpc.secure_channel(f"localhost:{port}", creds)
    return pb_grpc.HostdStub(ch), ch


class Daemon:
    def __init__(self, argv: list[str], env: dict[str, str], log: Path):
        self.argv, self.env, self.log = argv, env, log
        self.proc: subprocess.Popen | None = None

    def spawn(self, **extra_env: str) -> subprocess.Popen:
        self.proc = subprocess.Popen(self.argv, cwd=REPO, env=self.env | extra_env,
                                     stdout=open(self.log, "a"), stderr=subprocess.STDOUT)
        return self.proc

    def died(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"{self.argv[2]} exited {self.proc.returncode}:\n"
                                 + self.log.read_text()[-3000:])

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Hostd(Daemon):
    """`hostd serve`; ready when it has written its ready file."""

    def __init__(self, cfg: Path, env: dict[str, str], log: Path):
        super().__init__([sys.executable, "-m", "hostd.cli", "--config", str(cfg), "serve",
                          "--ready-file", str(cfg.parent / "ready")], env, log)
        self.cfg = cfg
        self.port = 0

    def start(self, **extra_env: str) -> "Hostd":
        ready = self.cfg.parent / "ready"
        ready.unlink(missing_ok=True)
        self.spawn(**extra_env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if ready.exists() and ready.read_text().strip():
                self.port = int(ready.read_text().split()[1])
                return self
            self.died()
            time.sleep(0.1)
        raise AssertionError("hostd did not become ready:\n" + self.log.read_text()[-3000:])


class Scheduler(Daemon):
    """`scheduler serve`; ready when /readyz answers 200."""

    def __init__(self, cfg: Path, port: int, env: dict[str, str], log: Path):
        super().__init__([sys.executable, "-m", "scheduler.cli", "serve", "--config", str(cfg)], env, log)
        self.url = f"http://127.0.0.1:{port}"

    def start(self) -> "Scheduler":
        self.spawn()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            self.died()
            time.sleep(0.2)
        raise AssertionError("scheduler did not become ready:\n" + self.log.read_text()[-3000:])
