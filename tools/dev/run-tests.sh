#!/usr/bin/env bash
# Runs the whole suite (make test, .ci/run). pytest exit 5 (no tests collected) is a
# failure here.
#
# Tests run on HYB_TEST_WORKERS pytest-xdist workers (default 3, on the 2-CPU machines
# CI runs on too: a third of the suite's time is spent waiting on processes it started,
# guests under TCG, simulated fleets, soak windows; 3 workers took 7 min 13 s where 2
# took 9 min 00 s, same tests, same machine). tests/conftest.py puts every test that
# touches the machine as a whole (libvirtd, hugepages, cgroups, the real carve) in one
# group, which one worker runs in order (kvm-utils' live tests, which share nothing with
# it, in another); the rest spread over the others; a test
# marked quiet (it measures the machine) runs alone. HYB_TEST_WORKERS=0 runs everything
# in this process, in the same order.
set -uo pipefail
cd "$(dirname "$0")/../.."
workers=${HYB_TEST_WORKERS:-3}
# The caches a fresh machine lacks are built beside the tests (tools/dev/caches.py,
# started by tests/conftest.py): HYB_WARM_CACHES=0 leaves each to the test that needs it.
export HYB_WARM_CACHES=${HYB_WARM_CACHES:-1}
# The suite starts hundreds of Python processes from this tree (fleets of hostds, the
# scheduler, the CLIs) and each of its three workers collects every test module: with
# PYTHONDONTWRITEBYTECODE set (some CI images and sandboxes set it), each of them compiles
# the tree's source again. Measured: collection 15.0 -> 4.6 CPU-s a worker, a hostd start
# 1.04 -> 0.52 CPU-s, tests/fleet/test_rollout_owners.py 66 -> 44 CPU-s. The bytecode
# goes to __pycache__/, which git ignores.
unset PYTHONDONTWRITEBYTECODE
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
