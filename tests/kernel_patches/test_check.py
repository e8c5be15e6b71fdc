"""kernel-patches/check against Debian's linux-source-6.1 (needs the package installed).

The first run extracts the source, configures a KVM guest kernel and runs
"make prepare" (minutes, cached under /var/cache/hybrid-kvm/kernel/); later runs
re-apply the series and recompile the touched objects. The negative cases use
broken copies of the real series written to tmp_path.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHECK = REPO / "kernel-patches" / "check"
SERIES = REPO / "kernel-patches" / "nohlt_list"

# xdist: one cached kernel tree, locked: one worker
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600), pytest.mark.xdist_group("kernel-check")]


def run_check(series: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CHECK), str(series)], capture_output=True, text=True, timeout=3600
    )


def series_patches(series: Path) -> list[str]:
    names = []
    for line in (series / "series").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(line)
    return names


def touched_c_files(series: Path) -> set[str]:
    files: set[str] = set()
    for name in series_patches(series):
        files |= set(re.findall(r"^diff --git a/(\S+\.c) ", (series / name).read_text(), re.M))
    return files


def broken_copy(tmp_path: Path, patch_prefix: str, old: str, new: str) -> Path:
    """The real series with one exact line of one patch replaced (must exist once)."""
    dst = tmp_path / "series"
    shutil.copytree(SERIES, dst)
    (patch,) = [p for p in dst.iterdir() if p.name.startswith(patch_prefix)]
    text = patch.read_text()
    assert text.count(old) == 1, f"{old!r} not found once in {patch.name}; update the test"
    patch.write_text(text.replace(old, new))
    return dst


def test_series_applies_passes_checkpatch_and_compiles() -> None:
    res = run_check(SERIES)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    for name in series_patches(SERIES):
        assert re.search(
            rf"^check: checkpatch --strict {re.escape(name)}: 0 errors, 0 warnings, \d+ checks$",
            res.stdout, re.M), out
        assert f"check: applied {name}" in res.stdout, out
    assert re.search(r"^check: checkpatch total: 0 errors, 0 warnings", res.stdout, re.M), out
    compiled = re.findall(r"^check: compiled (\S+\.o) \(from ([^)]*)\)$", res.stdout, re.M)
    sources = {src for _, srcs in compiled for src in srcs.split()}
    assert touched_c_files(SERIES) <= sources, out
    assert {"kernel/sched/build_policy.o", "drivers/base/cpu.o"} <= {o for o, _ in compiled}, out
    assert re.search(r"^check: OK: ", res.stdout, re.M), out


def test_checkpatch_error_fails(tmp_path: Path) -> None:
    # "space required after that ','" is an ERROR; the code still compiles.
    broken = broken_copy(
        tmp_path, "0002-",
        '+\treturn sysfs_emit(buf, "%*pbl\\n", cpumask_pr_args(cpu_nohlt_mask));',
        '+\treturn sysfs_emit(buf,"%*pbl\\n", cpumask_pr_args(cpu_nohlt_mask));',
    )
    res = run_check(broken)
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert re.search(r"^check: checkpatch --strict 0002-\S+: [1-9]\d* errors", res.stdout, re.M), out
    assert "check: compiled drivers/base/cpu.o" in res.stdout, out
    assert re.search(r"^check: FAILED: checkpatch 0002-", res.stdout, re.M), out


def test_compile_error_fails(tmp_path: Path) -> None:
    # checkpatch cannot see an undeclared identifier; the compiler must.
    broken = broken_copy(
        tmp_path, "0001-",
        "+\treturn cpumask_test_cpu(cpu, cpu_nohlt_mask);",
        "+\treturn cpumask_test_cpu(cpu, cpu_nohlt_maks);",
    )
    res = run_check(broken)
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert re.search(r"^check: checkpatch total: 0 errors, 0 warnings", res.stdout, re.M), out
    assert "cpu_nohlt_maks" in res.stderr, out
    assert re.search(r"^check: FAILED: .*compile", res.stdout, re.M), out


def test_patch_that_does_not_apply_fails(tmp_path: Path) -> None:
    broken = broken_copy(
        tmp_path, "0002-",
        " \t&dev_attr_isolated.attr,\n",
        " \t&dev_attr_isolated_cpus.attr,\n",
    )
    res = run_check(broken)
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert re.search(r"FAILED: patch 0002-\S+ does not apply", res.stderr), out


def test_series_naming_a_missing_patch_fails(tmp_path: Path) -> None:
    dst = tmp_path / "series"
    shutil.copytree(SERIES, dst)
    with (dst / "series").open("a") as f:
        f.write("0003-not-there.patch\n")
    res = run_check(dst)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "lists 0003-not-there.patch, which does not exist" in res.stderr
    assert "check: applied" not in res.stdout
