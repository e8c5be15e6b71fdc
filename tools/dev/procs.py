"""Daemons the end-to-end tests start: each stopped by its PID (SIGTERM, then
SIGKILL), never by name, and always in a finally."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx

from api import hostd_pb2_grpc as pb_grpc

REPO = Path(__file__).resolve().parents[2]


# Ports the tests hand their daemons: below the kernel's ephemeral range (32768-60999),
# so no outgoing connection and no ``bind(0)`` elsewhere takes one between the pick and
# the daemon's bind, and each reserved for this process's life by a lock file, so two
# pytest workers (or a bench beside the suite) never pick the same one.
# (Per user: a directory another user made is not writable here; a bind still fails
# on a port taken by anyone.)
PORTS = range(20000, 32000)
PORT_LOCKS = Path(f"/tmp/hyb-ports-{os.getuid()}")
_held: list[int] = []  # the lock files' descriptors, open until this process exits


def free_port() -> int:
    PORT_LOCKS.mkdir(mode=0o700, exist_ok=True)
    rng = random.Random()
    for _ in range(500):
        port = rng.choice(PORTS)
        fd = os.open(PORT_LOCKS / str(port), os.O_RDONLY | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))
        except OSError:
            os.close(fd)
            continue
        _held.append(fd)
        return port
    raise RuntimeError(f"no free port in {PORTS.start}-{PORTS.stop - 1} after 500 tries")


def grpc_stub(port: int, certs: Path) -> tuple[pb_grpc.HostdStub, grpc.Channel]:
    """A scheduler-side client of hostd with the dev CA's client certificate."""
    creds = grpc.ssl_channel_credentials((certs / "ca.crt").read_bytes(),
                                         (certs / "scheduler.key").read_bytes(),
                                         (certs / "scheduler.crt").read_bytes())
    ch = grpc.secure_channel(f"localhost:{port}", creds)
    return pb_grpc.HostdStub(ch), ch


POLICY = """
[io_service]
cpus = "{io}"
{host}[[hugepages.pools]]
size = "2M"
count_per_node = {pages}
[hugepages]
io_floor_percent = 5
[disks]
allow = ["{disk}"]
default_bytes_sec = 104857600
default_iops = 5000
"""


def hostd_workdir(tmp: Path, smoke_guest: dict, *, pages: int, disk: str,
                  host_cpus_per_node: int | None = None, io_cpus: str = "0") -> Path:
    """What a live hostd needs under ``tmp``: a dev CA and certificates (returned: the
    ``tls`` dir), the smoke guest in ``images``, and ``policy.toml``: ``io_cpus`` (CPU 0) for the IO
    service, ``pages`` 2 MiB pages, ``disk`` as the only allow-listed disk (100 MiB/s,
    5000 IOPS by default)."""
    certs = tmp / "tls"
    subprocess.run(["bash", str(REPO / "tools/dev/make-dev-ca.sh"), str(certs)], check=True, capture_output=True)
    from hostd.apply.images import ImageStore
    ImageStore(tmp / "images").add("smoke", "1", "kernel",
                                   {"kernel": smoke_guest["kernel"], "initrd": smoke_guest["initrd"]},
                                   cmdline="console=ttyS0 panic=-1")
    host = "" if host_cpus_per_node is None else f"[host]\ncpus_per_node = {host_cpus_per_node}\n"
    (tmp / "policy.toml").write_text(POLICY.format(io=io_cpus, host=host, pages=pages, disk=disk))
    return certs


def write_hostd_config(path: Path, *, policy: Path, state: Path, images: Path, certs: Path,
                       libvirt_uri: str, listen: str = "127.0.0.1:0", **extra: object) -> Path:
    """A hostd.toml for tests: TCG guests, mTLS from the dev CA, no metrics port,
    no <locked/> (this sandbox refuses RLIMIT_MEMLOCK); ``extra`` adds keys."""
    keys: dict[str, object] = {
        "virt_type": "qemu", "policy": str(policy), "state_dir": str(state), "image_dir": str(images),
        "listen": listen, "metrics_listen": "", "tls_cert": str(certs / "hostd.crt"),
        "tls_key": str(certs / "hostd.key"), "tls_ca": str(certs / "ca.crt"),
        "lock_guest_memory": False, "libvirt_uri": libvirt_uri, **extra}
    path.write_text("".join(f"{k} = {toml_value(v)}\n" for k, v in keys.items()))
    return path


def toml_value(v: object) -> str:
    """A scalar as a TOML value (the configs the tests and the fleet simulator write)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    return json.dumps(str(v))  # a JSON string is a valid TOML basic string


class Daemon:
    def __init__(self, argv: list[str], env: dict[str, str], log: Path):
        self.argv, self.env, self.log = argv, env, log
        self.proc: subprocess.Popen | None = None

    def spawn(self, **extra_env: str) -> subprocess.Popen:
        with open(self.log, "a") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(self.argv, cwd=REPO, env=self.env | extra_env,
                                         stdout=log, stderr=subprocess.STDOUT)
        return self.proc

    @contextlib.contextmanager
    def _stopped_unless_ready(self) -> Iterator[None]:
        """A start that fails or is interrupted (a run stopped by SIGTERM or Ctrl-C while
        a fixture waits for its daemon) stops what it spawned: the caller never got the
        object its teardown would stop."""
        try:
            yield
        except BaseException:
            self.stop()
            raise

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
        with self._stopped_unless_ready():
            return self._wait_ready(ready)

    def _wait_ready(self, ready: Path) -> "Hostd":
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if ready.exists() and ready.read_text().strip():
                self.port = int(ready.read_text().split()[1])
                return self
            self.died()
            time.sleep(0.1)
        raise AssertionError("hostd did not become ready:\n" + self.log.read_text()[-3000:])


class Scheduler(Daemon):
    """`scheduler serve` on ``port`` (several may share one config); ready when /readyz
    answers 200."""

    def __init__(self, cfg: Path, port: int, env: dict[str, str], log: Path, *, ca: Path | None = None,
                 client_cert: tuple[Path, Path] | None = None):
        """``ca``: the server speaks HTTPS with a certificate this CA signed; ``client_cert``
        (certificate, key): what the readiness probe presents to an mTLS server."""
        super().__init__([sys.executable, "-m", "scheduler.cli", "serve", "--config", str(cfg),
                          "--port", str(port)], env, log)
        self.url = f"{'https' if ca else 'http'}://127.0.0.1:{port}"
        self.verify: ssl.SSLContext | bool = True
        if ca:
            self.verify = ssl.create_default_context(cafile=str(ca))
            if client_cert:
                self.verify.load_cert_chain(str(client_cert[0]), str(client_cert[1]))

    def start(self) -> "Scheduler":
        self.spawn()
        with self._stopped_unless_ready():
            return self.wait_ready()

    def wait_ready(self) -> "Scheduler":
        deadline = time.monotonic() + 60
        # one client for the polls: a client made with the default trust costs ~30 ms of
        # CPU (the system CA store loaded), five times a second while a server starts
        with httpx.Client(timeout=2, verify=self.verify) as c:
            while time.monotonic() < deadline:
                try:
                    if c.get(f"{self.url}/readyz").status_code == 200:
                        return self
                except httpx.HTTPError:
                    pass
                self.died()
                time.sleep(0.2)
        raise AssertionError("scheduler did not become ready:\n" + self.log.read_text()[-3000:])
