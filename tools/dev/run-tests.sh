#!/usr/bin/env bash
# Runs the whole suite. pytest exit 5 (no tests collected) is a failure here.
set -uo pipefail
cd "$(dirname "$0")/../.."
.venv/bin/python -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "run-tests: pytest collected no tests; treating as failure" >&2
  exit 1
fi
exit "$rc"
