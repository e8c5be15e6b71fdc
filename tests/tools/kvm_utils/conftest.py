"""Fixtures for kvm-utils live tests: tracefs, the bench helper's tiny KVM guest, cleanup.

Live tests drive `tools/kvm_utils/helper/kvm_exit_bench.c` (a real VM through /dev/kvm
with a known number of exits) and assert on what this kernel's tracepoints report.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def tracefs_root() -> Iterator[Path]:
    """The tracefs mount; mounted here if absent, and then unmounted at the end."""
    from tools.kvm_utils.sources.tracefs import find_tracefs
    found = find_tracefs()
    if found is not None:
        yield found
        return
    mnt = Path("/sys/kernel/tracing")
    r = subprocess.run(["mount", "-t", "tracefs", "nodev", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"tracefs not mounted and cannot be mounted: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


@pytest.fixture(scope="session")
def kvm_events(tracefs_root: Path) -> set[str]:
    from tools.kvm_utils.sources.tracefs import available_kvm_events
    events = set(available_kvm_events(tracefs_root))
    if not events:
        pytest.skip(f"no kvm tracepoints under {tracefs_root}/events/kvm (kvm module not loaded)")
    return events


@pytest.fixture(scope="session")
def helper() -> Path:
    """The compiled bench helper (built with cc on first use)."""
    if not Path("/dev/kvm").exists():
        pytest.skip("/dev/kvm missing: no KVM on this host")
    from tools.kvm_utils.bench import helper_path
    return helper_path()


@pytest.fixture
def no_leftover_instances(tracefs_root: Path) -> Iterator[None]:
    """Fails the test if it leaves a kvm-utils ftrace instance behind (and removes it)."""
    inst = tracefs_root / "instances"
    before = {p.name for p in inst.iterdir()}
    yield
    left = [p for p in inst.iterdir() if p.name.startswith("kvm-utils-") and p.name not in before]
    for p in left:
        from tools.kvm_utils.sources.tracefs import remove_instance
        remove_instance(p)
    assert not left, f"ftrace instances left behind: {left}"


@pytest.fixture(scope="session")
def nested_svm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """The nested-SVM guest (tools/dev/nested_svm.py), booted once for the session's nested
    tests, with kvm_amd loaded: a real KVM with kprobes, fentry and SVM exits. Needs root
    (the online image's build and cache), QEMU and this host's bpftrace/Python 3.11, which
    it carries in. Stopped by PID at the end, also when a test failed."""
    import os
    import shutil

    from tools.dev import caches, nested_svm
    if os.geteuid() != 0:
        pytest.skip("the nested-SVM guest needs root (the online image is built and cached as root)")
    for exe in ("qemu-system-x86_64", "qemu-img", "mke2fs", "cc"):
        if shutil.which(exe) is None:
            pytest.skip(f"{exe} not installed (tools/dev/install-deps.sh)")
    caches.online_image()          # waits for a build already running (the warmer's), never a second one
    guest = nested_svm.NestedGuest(tmp_path_factory.mktemp("nested-svm"))
    try:
        guest.boot()
        r = guest.run("modprobe kvm_amd && test -c /dev/kvm && grep -qw svm /proc/cpuinfo", timeout=60)
        if r.rc != 0:
            raise nested_svm.NestedError(f"kvm_amd did not load (rc {r.rc}): {r.err}\n{guest.console_tail()}")
        yield guest
    finally:
        guest.stop()
