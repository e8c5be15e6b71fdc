"""Boot the patched guest kernel under QEMU (TCG here, 2 vCPUs) and look inside.

Opt-in: kernel-patches/build compiles a whole kernel (see kernel-patches/README.md
for the measured time), so this runs only with HYB_KERNEL_BUILD=1. The initramfs
is busybox taken from the smoke guest's initrd (guestimages/smoke/build.sh, via
the smoke_guest fixture) plus kernel-patches/guest-init, which reports the sysfs
mask and, from the power:cpu_idle trace events, which idle path each CPU took.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "kernel-patches" / "build"
GUEST_INIT = REPO / "kernel-patches" / "guest-init"
APPLETS = ("sh", "mount", "cat", "echo", "sleep", "seq", "grep", "awk", "taskset", "poweroff")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.integration,
    pytest.mark.timeout(7200),
    pytest.mark.skipif(
        os.environ.get("HYB_KERNEL_BUILD") != "1",
        reason="builds a whole guest kernel (tens of minutes on 2 CPUs); set HYB_KERNEL_BUILD=1",
    ),
]


@pytest.fixture(scope="module")
def bzimage() -> Path:
    res = subprocess.run([str(BUILD)], capture_output=True, text=True, timeout=7200)
    assert res.returncode == 0, res.stdout + res.stderr
    m = re.search(r"^build: OK: (\S+)$", res.stdout, re.M)
    assert m, res.stdout
    return Path(m.group(1))


@pytest.fixture(scope="module")
def initrd(smoke_guest: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("nohlt-initrd")
    smoke = work / "smoke"
    smoke.mkdir()
    subprocess.run(["cpio", "-id", "--quiet", "bin/busybox"], cwd=smoke, check=True,
                   input=gzip.decompress(smoke_guest["initrd"].read_bytes()))
    root = work / "root"
    for d in ("bin", "proc", "sys", "dev", "sys/kernel/tracing"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "bin/busybox").write_bytes((smoke / "bin/busybox").read_bytes())
    (root / "bin/busybox").chmod(0o755)
    for app in APPLETS:
        (root / "bin" / app).symlink_to("busybox")
    (root / "init").write_bytes(GUEST_INIT.read_bytes())
    (root / "init").chmod(0o755)
    names = subprocess.run("find . -print0", shell=True, cwd=root, check=True,
                           capture_output=True).stdout
    archive = subprocess.run(["cpio", "--null", "-o", "-H", "newc", "--quiet"], cwd=root,
                             input=names, check=True, capture_output=True).stdout
    out = work / "initrd.img"
    out.write_bytes(gzip.compress(archive))
    return out


def boot(bzimage: Path, initrd: Path, extra: str) -> tuple[dict, str]:
    cmd = [
        "qemu-system-x86_64", "-accel", "tcg", "-smp", "2", "-m", "256",
        "-kernel", str(bzimage), "-initrd", str(initrd),
        "-append", f"console=ttyS0 panic=-1 {extra}".strip(),
        "-display", "none", "-serial", "stdio", "-monitor", "none", "-no-reboot",
    ]
    res = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    console = res.stdout + res.stderr
    m = re.search(r"^HYB-NOHLT (\{.*\})\s*$", console, re.M)
    assert m, f"no HYB-NOHLT line (qemu rc {res.returncode}):\n{console[-4000:]}"
    return json.loads(m.group(1)), console


def test_nohlt_list_0_polls_on_cpu0_only(bzimage: Path, initrd: Path) -> None:
    report, console = boot(bzimage, initrd, "nohlt_list=0")
    assert report["cpus"] == 2, report
    assert "nohlt_list=0" in report["cmdline"], report
    assert report["nohlt_list"] == "0", report
    assert "nohlt_list: CPUs 0 poll in idle" in console
    # vCPU 0 entered idle many times, always through the polling loop ...
    assert report["cpu0"]["poll"] > 0 and report["cpu0"]["other"] == 0, report
    # ... while vCPU 1 kept its normal idle path (HLT here: no cpuidle driver under TCG).
    assert report["cpu1"]["other"] > 0, report


def test_without_parameter_every_cpu_halts(bzimage: Path, initrd: Path) -> None:
    report, _ = boot(bzimage, initrd, "")
    assert report["nohlt_list"] == "", report
    assert report["cpu0"]["other"] > 0 and report["cpu1"]["other"] > 0, report


@pytest.mark.parametrize("bad", ["0-1,x", "0,5"], ids=["garbage", "cpu-beyond-guest"])
def test_invalid_list_is_ignored_as_a_whole(bzimage: Path, initrd: Path, bad: str) -> None:
    # Like nohz_full=: a list that does not parse or names a vCPU the guest
    # does not have is rejected with a warning, and every CPU keeps halting.
    report, console = boot(bzimage, initrd, f"nohlt_list={bad}")
    assert report["nohlt_list"] == "", report
    assert f"nohlt_list: invalid CPU list '{bad}', ignored" in console
    assert report["cpu0"]["other"] > 0 and report["cpu0"]["poll"] == 0, report
