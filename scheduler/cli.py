"""`scheduler` console script. The placement service is not built yet (issue #4):
this entry point says so instead of pretending."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print("scheduler: the placement service is not implemented yet (see README, status)",
          file=sys.stderr)
    return 2
