"""`bench --guest`: the in-guest benchmark builds as a static binary and, as a smoke check on
this machine (itself a VM), runs its side-effect-free tests (rdtsc, cpuid, clock_gettime)."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from kvmu_helpers import REPO

PT_INTERP, PT_DYNAMIC = 3, 2


def program_header_types(path: Path) -> set[int]:
    data = path.read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2          # ELF64
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    return {struct.unpack_from("<I", data, phoff + i * phentsize)[0] for i in range(phnum)}


@pytest.fixture(scope="module")
def guest_bench(tmp_path_factory) -> Path:
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler")
    out = tmp_path_factory.mktemp("kgb") / "kgb"
    r = subprocess.run([sys.executable, "-m", "tools.kvm_utils", "bench", "--guest", "-o", str(out)],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(out) and "scp" in r.stderr
    return out


def test_guest_bench_is_static(guest_bench: Path) -> None:
    types = program_header_types(guest_bench)
    assert PT_INTERP not in types and PT_DYNAMIC not in types    # no loader, no shared libs


def test_guest_bench_smoke_runs_here(guest_bench: Path) -> None:
    r = subprocess.run([str(guest_bench), "--tests", "rdtsc,cpuid,clock_gettime", "--target-cycles", str(1 << 22),
                        "--repeat", "1"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert {"in_vm", "hypervisor", "clocksource", "tsc_khz", "results"} <= set(d)
    rows = {x["name"]: x for x in d["results"]}
    assert set(rows) == {"rdtsc", "cpuid", "clock_gettime"}
    for row in rows.values():
        assert row["iterations"] >= 64 and row["cycles_per_iter"] > 0
    if d["in_vm"]:    # CPUID always exits under a hypervisor: far dearer than RDTSC
        assert rows["cpuid"]["cycles_per_iter"] > 5 * rows["rdtsc"]["cycles_per_iter"]


def test_guest_bench_device_tests_report_errors_not_crash(guest_bench: Path) -> None:
    r = subprocess.run([str(guest_bench), "--tests", "pio_in", "--port", "0x80", "--target-cycles", "4096",
                        "--repeat", "1"], capture_output=True, text=True, timeout=120)
    d = json.loads(r.stdout)
    row = d["results"][0]
    assert row["name"] == "pio_in" and ("error" in row or row["iterations"] >= 64)
    if not d["in_vm"]:
        assert "not in a VM" in row["error"]
    r = subprocess.run([str(guest_bench), "--bogus"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "usage" in r.stderr
