"""A stand-in for the resident storage IO service, for hosts without one (the demo
and the carve integration tests). It does small synchronous writes and reads in a
loop so it has real CPU and IO activity, and exits cleanly on SIGTERM.

Usage: python -m tools.dev.io_service_standin [--dir DIR] [--tag TAG]
The process is found by its command line: give `--tag NAME` and match it with
`io_service.process = "NAME"` (pgrep -f style; the default tag is not on the command line).
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import time


def main() -> int:
    p = argparse.ArgumentParser(prog="hyb-io-standin")
    p.add_argument("--dir", default=None, help="where to write its scratch file")
    p.add_argument("--tag", default="hyb-io-standin", help="marker for process matching")
    p.add_argument("--interval", type=float, default=0.05, help="seconds between IOs")
    args = p.parse_args()
    stop = False

    def _term(_sig, _frm):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    fd, path = tempfile.mkstemp(prefix="hyb-io-standin-", dir=args.dir)
    try:
        block = os.urandom(64 * 1024)
        while not stop:
            os.pwrite(fd, block, 0)
            os.fsync(fd)
            os.pread(fd, len(block), 0)
            time.sleep(args.interval)
    finally:
        os.close(fd)
        os.unlink(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
