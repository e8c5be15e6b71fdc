"""Live: `doctor`'s kprobe-engine facts against what this test reads from the system itself.

Independent sources: platform.release(), the kernel config file (gzip here), bpftrace --info
(its feature probes load a tracepoint and an fentry/kfunc program), /sys/kernel/btf/vmlinux's
presence, /proc/kallsyms and tracefs' available_filter_functions read directly.
"""

from __future__ import annotations

import gzip
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvmu_helpers import REPO

pytestmark = [pytest.mark.root, pytest.mark.integration]


def _lines() -> tuple[dict[str, tuple[bool, str]], list[str]]:
    """doctor's checks by name (ok?, detail), and the details of its "kprobe symbol" (missing) lines."""
    out = subprocess.run([sys.executable, "-m", "tools.kvm_utils", "doctor"], capture_output=True, text=True,
                         timeout=120, cwd=REPO)
    rows: dict[str, tuple[bool, str]] = {}
    missing: list[str] = []
    for ln in out.stdout.splitlines():
        m = re.match(r"(ok|FAIL|warn)\s+(.+?)\s{2,}(.*)", ln)
        if m and m.group(2) == "kprobe symbol":
            missing.append(m.group(3))
        elif m:
            rows[m.group(2)] = (m.group(1) == "ok", m.group(3))
    assert "kernel" in rows, out.stdout + out.stderr
    return rows, missing


def _config_kprobes() -> str | None:
    for p in (Path("/proc/config.gz"), Path(f"/boot/config-{platform.release()}")):
        if p.exists():
            text = gzip.decompress(p.read_bytes()).decode() if p.suffix == ".gz" else p.read_text()
            return "y" if "\nCONFIG_KPROBES=y\n" in text else "n"
    return None


def _bpftrace_info() -> dict[str, str]:
    r = subprocess.run(["bpftrace", "--info"], capture_output=True, text=True, timeout=60)
    return dict(m.groups() for m in re.finditer(r"^\s+([\w ]+): (\S+)", r.stdout + r.stderr, re.M))


def test_doctor_kprobe_engine_facts_match_the_system(tracefs_root: Path) -> None:
    rows, missing = _lines()
    assert rows["kernel"][1] == platform.release()
    cfg = _config_kprobes()
    if cfg is not None:
        assert rows["CONFIG_KPROBES"][0] == (cfg == "y") and rows["CONFIG_KPROBES"][1].startswith(cfg + " (from ")
    btf = Path("/sys/kernel/btf/vmlinux").exists()
    assert rows["BTF"][0] == btf
    if shutil.which("bpftrace"):
        info = _bpftrace_info()
        assert rows["BPF tracepoint program"][0] == (info["tracepoint"] == "yes")
        if btf:
            assert rows["BPF fentry program"][0] == (info["kfunc"] == "yes")
            if not rows["BPF fentry program"][0]:
                assert re.match(r"E[A-Z]+: ", rows["BPF fentry program"][1])   # the kernel's errno, named
    kall = {ln.split()[2] for ln in Path("/proc/kallsyms").read_text().splitlines() if ln.split()[1] in "tT"}
    assert rows["kallsyms"][1] == f"{len(kall)} functions"
    try:
        aff = len((tracefs_root / "available_filter_functions").read_text().splitlines())
        assert rows["available_filter_functions"] == (True, f"{aff} functions")
    except OSError as e:
        assert not rows["available_filter_functions"][0] and (e.strerror or "") in rows["available_filter_functions"][1]
    found = re.findall(r"[\w-]+:(\w+)", rows["kprobe symbols"][1].split("found ", 1)[1])
    assert found and all(s in kall for s in found)
    assert rows["kprobe symbols"][0] == (not missing)
    for line in missing:
        sym = re.match(r"missing (\w+)", line).group(1)   # type: ignore[union-attr]
        assert sym not in kall and "without it, no " in line
    # the verdict: the kprobe engine's attach mechanism, or each reason it has none, from the
    # facts above (config file, bpftrace --info's kfunc probe = the raw fentry load)
    ok, verdict = rows["kprobe engine"]
    fentry_ok = btf and rows["BPF fentry program"][0]
    assert ok == (fentry_ok or cfg == "y")
    if not ok:
        assert verdict.startswith("unavailable: ")
        if cfg == "n":
            assert "CONFIG_KPROBES is not set" in verdict and "no kprobe/kretprobe can attach" in verdict
        assert rows["BPF fentry program"][1] in verdict and "no fentry/fexit either" in verdict
    else:
        assert verdict.startswith("uses fentry: " if fentry_ok else "uses kprobe: ")
