"""`fleet-rollout` console script. Wave-by-wave fleet conversion is not built yet:
this entry point says so instead of pretending."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    print("fleet-rollout: not implemented yet (see README, status)", file=sys.stderr)
    return 2
