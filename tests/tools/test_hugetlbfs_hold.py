"""tools/dev/hugetlbfs.py: the 2 MiB hugetlbfs mount shared by test runs and benches on
one machine. Live (root, the machine's real mount table), with a registry of its own so
the suite's holders are not counted: the mount is made by the first holder, stays while
a second holds it although the first let go, goes with the last, and a holder SIGKILLed
before it let go does not keep it forever. Skipped where the machine already has a 2 MiB
hugetlbfs that no holder made (nothing to take down then)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tools.dev import hugetlbfs
from tools.dev.procs import REPO

pytestmark = [pytest.mark.root, pytest.mark.integration]

HOLDER = """
import sys, time
from pathlib import Path
from tools.dev.hugetlbfs import held_2m
with held_2m(Path(sys.argv[1])) as mnt:
    print(mnt, flush=True)
    time.sleep(600)
"""


def test_the_last_holder_unmounts_and_a_killed_one_does_not_keep_it(tmp_path: Path) -> None:
    # The machine's registry locked throughout: no real holder comes or goes meanwhile
    # (it would find this test's mount, and lose it when the test's last holder lets go).
    with hugetlbfs._locked(hugetlbfs.REGISTRY):
        if hugetlbfs.mount_2m() is not None:
            pytest.skip("this machine has a 2 MiB hugetlbfs already (the suite's own, or the system's)")
        _scenario(tmp_path / "reg")


def _scenario(reg: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(reg)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == str(hugetlbfs.MOUNT)
        with hugetlbfs.held_2m(reg) as mnt:
            assert mnt == hugetlbfs.MOUNT and hugetlbfs.mount_2m() == mnt
            os.kill(child.pid, signal.SIGKILL)  # the first holder dies without letting go
            child.wait(10)
            assert hugetlbfs.mount_2m() == mnt  # this one holds it still
        assert hugetlbfs.mount_2m() is None  # the last holder gone: the mount too
        assert not (reg / ".made").exists() and [p.name for p in reg.iterdir()] == [".lock"]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
        if (reg / ".made").exists():
            subprocess.run(["umount", str(hugetlbfs.MOUNT)], check=False)
