"""An active probe of the IO service: how long one small request to it takes.

``io_probe`` in hostd.toml, one of
- ``tcp:HOST:PORT``: connect and close (the accept path: listen backlog, the service's
  accept thread getting a CPU);
- ``http://HOST:PORT/PATH`` (or https): a GET answered below 500;
- ``command:ARGV...``: a command exiting 0 (a storage client's health command).

Every probe has a timeout: a target that does not answer, or a command that hangs (it is
killed with its process group), is a failed probe, never a stuck hostd.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import time
from dataclasses import dataclass

import httpx

KINDS = ("tcp", "http", "command")


class ProbeSpecError(ValueError):
    pass


@dataclass(frozen=True)
class Probe:
    kind: str  # "tcp" | "http" | "command"
    target: str  # "host:port", a URL, or a command line
    timeout_s: float = 1.0

    @classmethod
    def parse(cls, spec: str, timeout_s: float = 1.0) -> "Probe | None":
        """None for "" (no probe); ProbeSpecError naming what is wrong otherwise."""
        if not spec:
            return None
        if spec.startswith(("http://", "https://")):
            return cls("http", spec, timeout_s)
        kind, sep, target = spec.partition(":")
        if not sep or kind not in ("tcp", "command"):
            raise ProbeSpecError(f"{spec!r}: use tcp:HOST:PORT, http(s)://URL or command:ARGV (kinds: "
                                 f"{', '.join(KINDS)})")
        if kind == "tcp":
            host, _, port = target.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ProbeSpecError(f"{spec!r}: tcp needs HOST:PORT")
        elif not shlex.split(target):
            raise ProbeSpecError(f"{spec!r}: command needs a command line")
        return cls(kind, target, timeout_s)

    @property
    def spec(self) -> str:
        """The ``io_probe`` string this probe was parsed from."""
        return self.target if self.kind == "http" else f"{self.kind}:{self.target}"

    def __call__(self) -> tuple[bool, float, str]:
        """(ok, seconds, error) of one probe."""
        t0 = time.perf_counter()
        try:
            err = {"tcp": self._tcp, "http": self._http, "command": self._command}[self.kind]()
        except Exception as e:  # noqa: BLE001 - any failure of the probe is a failed probe
            err = f"{type(e).__name__}: {e}"
        return not err, time.perf_counter() - t0, err

    def _tcp(self) -> str:
        host, _, port = self.target.rpartition(":")
        with socket.create_connection((host.strip("[]"), int(port)), timeout=self.timeout_s):
            return ""

    def _http(self) -> str:
        r = httpx.get(self.target, timeout=self.timeout_s, verify=False)  # the service's own cert is its business
        return "" if r.status_code < 500 else f"HTTP {r.status_code}"

    def _command(self) -> str:
        p = subprocess.Popen(shlex.split(self.target), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
        try:
            rc = p.wait(self.timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            return f"timed out after {self.timeout_s} s"
        return "" if rc == 0 else f"exit {rc}"
