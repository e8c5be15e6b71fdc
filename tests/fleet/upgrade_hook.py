"""The `steps.upgrade_command` of the hostd-upgrade rollout test: "installs" release
ID on HOST (writes the host's release file, which hostd reads at start) and asks the
test to restart that hostd (a request file the test's watcher acts on, as systemd would
restart the unit after a package upgrade). Exits once the request is taken.

Usage: python tests/fleet/upgrade_hook.py WORKDIR HOST RELEASE_ID
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


def main(work: str, host: str, release: str) -> int:
    w = Path(work)
    (w / "hosts" / host / "state" / "release-id").write_text(release + "\n")
    req = w / "restart" / host
    req.parent.mkdir(exist_ok=True)
    req.write_text(release)
    deadline = time.monotonic() + 60
    while req.exists():
        if time.monotonic() > deadline:
            print(f"{host}: nobody restarted hostd", file=sys.stderr)
            return 1
        time.sleep(0.1)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
