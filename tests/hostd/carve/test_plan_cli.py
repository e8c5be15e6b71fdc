"""`hostd plan` as a user runs it: a topology JSON file and a policy TOML in, a layout
(exit 0), a NoFit (exit 3) or an error naming the field (exit 1) out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from synth import nic, topology

REPO = Path(__file__).resolve().parents[3]


def hostd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hostd.cli", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=60)


@pytest.fixture
def files(tmp_path: Path):
    topo = tmp_path / "host.json"
    topo.write_text(topology(sockets=2, cores=12, threads=2, nics=(nic("ens1f0"),)).to_json())

    def policy(text: str) -> Path:
        p = tmp_path / "policy.toml"
        p.write_text(text)
        return p
    return topo, policy


def test_plan_json_layout(files):
    topo, policy = files
    r = hostd("plan", "--topology", str(topo), "--json", "--policy", str(policy(
        '[io_service]\ncpus_per_node = 2\nunit = "io.service"\n'
        '[[sriov.pfs]]\nname = "ens1f0"\nvfs = 8\nmax_tx_rate_mbps = 1000\n')))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["io_cpus"] == [0, 12, 24, 36]
    assert out["vm_cpus"]["0"] == list(range(1, 12)) + list(range(25, 36))
    assert out["pfs"][0]["numvfs"] == 8 and out["pfs"][0]["slots"][7]["max_tx_rate_mbps"] == 1000


def test_plan_table_output(files):
    topo, policy = files
    r = hostd("plan", "--topology", str(topo), "--policy", str(policy("[io_service]\ncpus = \"0\"\n")))
    assert r.returncode == 0, r.stderr
    assert "host layout per NUMA node" in r.stdout and "needs a reboot" in r.stdout
    assert "added SMT siblings 24" in r.stdout


def test_plan_nofit_exit_3(files):
    topo, policy = files
    r = hostd("plan", "--topology", str(topo), "--json", "--policy",
              str(policy("[io_service]\ncpus_per_node = 40\n")))
    assert r.returncode == 3, r
    assert json.loads(r.stdout) == {"nofit": {"field": "io_service.cpus_per_node",
                                              "reason": "node 0 has 24 free online CPUs; asked for 40"}}
    r = hostd("plan", "--topology", str(topo), "--policy", str(policy("[io_service]\ncpus_per_node = 40\n")))
    assert r.returncode == 3 and "does not fit: io_service.cpus_per_node" in r.stdout


def test_plan_bad_policy_exit_1_names_field(files):
    topo, policy = files
    r = hostd("plan", "--topology", str(topo), "--policy", str(policy("[hugepages]\nio_floor_percent = 120\n")))
    assert r.returncode == 1
    assert "hyb.host.bad_policy [hugepages.io_floor_percent]" in r.stderr


def test_plan_bad_topology_exit_1(files, tmp_path):
    _topo, policy = files
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"host": {}, "cpus": [], "nodes": [], "nics": [], "disks": []}))
    r = hostd("plan", "--topology", str(bad), "--policy", str(policy("")))
    assert r.returncode == 1 and "hyb.host.bad_topology" in r.stderr, r
    r = hostd("plan", "--topology", str(tmp_path / "missing.json"), "--policy", str(policy("")))
    assert r.returncode == 1 and "missing.json" in r.stderr
