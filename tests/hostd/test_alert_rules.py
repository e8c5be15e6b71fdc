"""The IO-health alert rules (hostd/alerts/) as operators consume them: `promtool check
rules` accepts them, `promtool test rules` passes their unit tests (io-health.test.yml),
a rule made deaf fails those tests (so they test something), and every metric the rules
name is one hostd exports."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hostd.metrics import Metrics

ALERTS = Path(__file__).resolve().parents[2] / "hostd/alerts"
PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool missing: tools/dev/install-deps.sh installs "
                                                          "Debian's prometheus package")


def promtool(*args: str, cwd: Path = ALERTS) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL or "promtool", *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_rules_are_valid_and_their_unit_tests_pass() -> None:
    r = promtool("check", "rules", "io-health.rules.yml")
    assert r.returncode == 0 and "SUCCESS: 6 rules found" in r.stdout, r.stdout + r.stderr
    r = promtool("test", "rules", "io-health.test.yml")
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_the_unit_tests_catch_a_deaf_rule(tmp_path: Path) -> None:
    rules = (ALERTS / "io-health.rules.yml").read_text().replace("hostd_io_cpu_pressure_some_avg10 > 10",
                                                                "hostd_io_cpu_pressure_some_avg10 > 90")
    (tmp_path / "io-health.rules.yml").write_text(rules)
    shutil.copy(ALERTS / "io-health.test.yml", tmp_path)
    r = promtool("test", "rules", "io-health.test.yml", cwd=tmp_path)
    assert r.returncode != 0 and "IoServiceCpuPressure" in r.stdout + r.stderr


def test_every_metric_the_rules_name_is_exported() -> None:
    exported = set()
    for fam in Metrics().registry.collect():
        exported |= {s.name for s in fam.samples} | {fam.name}
    named = set(re.findall(r"\b(hostd_[a-z0-9_]+)", (ALERTS / "io-health.rules.yml").read_text()))
    assert named and named <= exported, named - exported
