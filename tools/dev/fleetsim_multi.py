"""tools/dev/fleetsim_multi: one process serving several simulated hosts, each a real hostd.

Past what separate processes allow (a ``hostd serve`` costs ~81 MiB RSS / ~43 MiB PSS and
~0.5 CPU-s to start, mostly the interpreter and its imports), ``SimFleet(hosts_per_process=K)``
starts this module instead: one Python process that runs K real hostd daemons, each
through ``hostd.rpc.daemon.start(cfg)`` with its own config (own host tree as root, state
dir, gRPC port, libvirt test-driver URI, scheduler registration), exactly what
``hostd serve`` runs, minus one interpreter per host.

    python tools/dev/fleetsim_multi.py HOST_DIR...

Each HOST_DIR holds ``hostd.toml``; once its daemon serves, ``HOST_DIR/ready`` gets
"<pid> <port>" (the port it bound: a port taken between the fleet picking it and the
bind is replaced here, and the fleet reads the new one). SIGTERM or SIGINT stops every
daemon (``Daemon.stop``) and exits 0.

What K daemons share in one process: the interpreter and its imports, libvirt's event
loop (``start_event_loop`` starts it once per process), the GIL; each has its own
Prometheus registry (``Metrics()``; ``metrics_listen = ""``: no HTTP port), gRPC server
and its thread pool, IO-health sampler and probe threads, registrar, libvirt watchdog.
A fault that acts on the process (SIGKILL, SIGSTOP) therefore acts on all K hosts.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

log = logging.getLogger("fleetsim.multi")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_host(host_dir: Path, retries: int = 3):  # type: ignore[no-untyped-def]
    """Start the hostd daemon of one simulated host; a taken port is replaced (a new
    listen and advertise address) up to ``retries`` times."""
    from hostd.config import load_config
    from hostd.rpc.daemon import start

    cfg = load_config(host_dir / "hostd.toml")
    for attempt in range(retries + 1):
        try:
            return start(cfg)
        except Exception as e:
            if attempt == retries or "listen" not in str(e) and "bind" not in str(e).lower():
                raise
            port = _free_port()
            log.warning("%s: %s; retrying on port %d", host_dir.name, e, port)
            cfg = cfg.model_copy(update={"listen": f"127.0.0.1:{port}", "advertise_address": f"localhost:{port}"})
    raise AssertionError("unreachable")


def main(argv: list[str] | None = None) -> int:
    dirs = [Path(a) for a in (argv if argv is not None else sys.argv[1:])]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s")
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    daemons = []
    try:
        for d in dirs:
            if done.is_set():
                break
            t0 = time.monotonic()
            daemon = start_host(d)
            daemons.append(daemon)
            (d / "ready").write_text(f"{os.getpid()} {daemon.port}\n")
            log.info("%s serving on port %d (start %.2f s)", d.name, daemon.port, time.monotonic() - t0)
        done.wait()
    finally:
        log.info("stopping %d daemons", len(daemons))
        stoppers = [threading.Thread(target=d.stop, args=(2.0,)) for d in daemons]
        for t in stoppers:
            t.start()
        for t in stoppers:
            t.join(timeout=20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
