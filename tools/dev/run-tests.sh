#!/usr/bin/env bash
# Runs the whole suite (make test, .ci/run). pytest exit 5 (no tests collected) is a
# failure here.
#
# Tests run on HYB_TEST_WORKERS pytest-xdist workers (default 2). tests/conftest.py puts
# every test that touches the machine as a whole (libvirtd, hugepages, cgroups, tracing,
# the real carve) in one group, which one worker runs in order; the rest spread over the
# others. HYB_TEST_WORKERS=0 runs everything in this process, in the same order.
set -uo pipefail
cd "$(dirname "$0")/../.."
workers=${HYB_TEST_WORKERS:-2}
xdist=()
if [ "$workers" != 0 ]; then
  xdist=(-n "$workers" --dist loadgroup --no-loadscope-reorder)
fi
.venv/bin/python -m pytest "${xdist[@]}" --durations=30 "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "run-tests: pytest collected no tests; treating as failure" >&2
  exit 1
fi
exit "$rc"
