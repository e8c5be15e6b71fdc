"""`make demo`'s simulated hosts: a few real hostd processes on generated host trees
(tools/dev/fleetsim.py), registered with the demo's scheduler, beside this machine's hostd.
One of them (the last) gets a degraded IO signal the moment it is carved, so the
demo's rollout shows a gate failing and that host rolled back.

Usage: python -m tools.dev.simhosts WORKDIR N SCHEDULER_URL HOST_TOKEN_FILE
ADMIN_TOKEN_FILE CERTS_DIR. Writes WORKDIR/ready when every host is registered; stops every
process it started on SIGTERM.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

from tools.dev.fleetsim import SimFleet


def main(argv: list[str]) -> int:
    work, n, url, host_token, admin_token, certs = Path(argv[0]), int(argv[1]), argv[2], *map(Path, argv[3:6])
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    fleet = SimFleet(work, n, n, scheduler_url=url, host_token=host_token.read_text().strip(),
                     admin_token=admin_token.read_text().strip(), certs=certs, heartbeat_s=2.0,
                     days_s=15.0)  # the demo ends with `hybctl fleet`: days sent while it runs
    try:
        fleet.start(timeout_s=120)
        bad = fleet.hosts[-1].name
        (work / "ready").write_text(" ".join(h.name for h in fleet.hosts) + "\n")
        while not done.wait(0.2):
            if fleet.carved(bad):
                fleet.degrade(bad)  # a scrubber lands on the IO CPU right after the conversion
                print(f"simhosts: {bad} carved; its IO signal now degrades", flush=True)
                break
        done.wait()
    finally:
        fleet.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
