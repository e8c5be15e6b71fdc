"""tools/dev/hugetlbfs.py: the 2 MiB hugetlbfs mount shared by test runs and benches on
one machine. Live (root, real mount(2)), on a mount point and registry of the test's own
so the machine's holders (this suite's among them) are neither counted nor disturbed:
the mount is made by the first holder, stays while a second holds it although the first
died (SIGKILL) without letting go, and goes with the last."""

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
reg, mnt = Path(sys.argv[1]), Path(sys.argv[2])
find = lambda: mnt if f" {mnt} hugetlbfs " in Path("/proc/mounts").read_text() else None
with held_2m(reg, mnt, find) as got:
    print(got, flush=True)
    time.sleep(600)
"""


def test_the_last_holder_unmounts_and_a_killed_one_does_not_keep_it(tmp_path: Path) -> None:
    reg, mnt = tmp_path / "reg", tmp_path / "hugepages"

    def mounted() -> bool:
        return f" {mnt} hugetlbfs " in Path("/proc/mounts").read_text()

    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(reg), str(mnt)], cwd=REPO, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == str(mnt) and mounted()
        with hugetlbfs.held_2m(reg, mnt, lambda: mnt if mounted() else None) as got:
            assert got == mnt
            os.kill(child.pid, signal.SIGKILL)  # the first holder dies without letting go
            child.wait(10)
            assert mounted()  # this one holds it still
        assert not mounted()  # the last holder gone: the mount too
        assert not (reg / ".made").exists() and [p.name for p in reg.iterdir()] == [".lock"]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
        if mounted():
            subprocess.run(["umount", str(mnt)], check=False)
