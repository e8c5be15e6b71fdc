"""The operator's command hooks of the rollout tests, played on a simulated host:

- ``release ID``: the `steps.upgrade_command`: "installs" release ID (writes the host's
  release file, which hostd reads at start) and asks for a hostd restart, as systemd
  would restart the unit after a package upgrade (VMs keep running);
- ``boot [PARAM=VALUE...]``: the `steps.reboot_command`: the host boots with these kernel
  parameters (written to its tree's /proc/cmdline; none given: the bootloader change did
  not take) and hostd starts again, its VMs gone with the reboot.

The restart itself is the test's (a request file its watcher acts on with
SimFleet.restart); the hook exits once the request is taken.

Usage: python tests/fleet/host_hook.py WORKDIR HOST release ID | boot [PARAM=VALUE...]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    w, host, action, args = Path(argv[0]), argv[1], argv[2], argv[3:]
    if action == "release":
        (w / "hosts" / host / "state" / "release-id").write_text(args[0] + "\n")
        keep = "keep"
    elif action == "boot":
        (w / "trees" / host / "proc/cmdline").write_text(" ".join(["BOOT_IMAGE=/vmlinuz", "ro", *args]) + "\n")
        keep = "reboot"
    else:
        print(f"unknown action {action!r}", file=sys.stderr)
        return 2
    req = w / "restart" / host
    req.parent.mkdir(exist_ok=True)
    req.write_text(keep)
    deadline = time.monotonic() + 60
    while req.exists():
        if time.monotonic() > deadline:
            print(f"{host}: nobody restarted hostd", file=sys.stderr)
            return 1
        time.sleep(0.1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
