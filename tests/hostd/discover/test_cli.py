"""`hostd discover` as a user runs it: the CLI in a subprocess, JSON and tables.

The --root runs read recorded trees (tests/data/hosts/), not this machine.
The umockdev test reads a mocked device through pyudev on the live code path.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from hostd.discover import discover_host
from hostd.discover.model import Topology
from hostd.discover.render import render_topology

REPO = Path(__file__).resolve().parents[3]
HOSTS = REPO / "tests" / "data" / "hosts"
TREES = ["2s-48c-smt-2pf-32vf", "amd-epyc-nps4", "1s-8c-nosmt-1pf-8vf"]


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """A hostd config that names no existing policy, so only the flags decide."""
    cfg = tmp_path / "hostd.toml"
    cfg.write_text(f'policy = "{tmp_path / "no-policy.toml"}"\nvirt_type = "kvm"\n')
    return cfg


def hostd(*args: str, config: Path, wrap: list[str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "250"}  # rich wraps table cells to the terminal width
    env.pop("HOSTD_VIRT_TYPE", None)
    return subprocess.run([*(wrap or []), sys.executable, "-m", "hostd.cli", "--config", str(config), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize("tree", TREES)
def test_cli_json_equals_in_process_discover(tree: str, config: Path) -> None:
    r = hostd("discover", "--json", "--root", str(HOSTS / tree), "--allow", "nvme*", "--allow", "sd[e-g]",
              config=config)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert list(data) == ["host", "cpus", "nodes", "nics", "disks"]
    assert data["host"]["schema_version"] == 1
    assert all(isinstance(d["assignable"], bool) and isinstance(d["reasons"], list) for d in data["disks"])
    want = discover_host(HOSTS / tree, allow=("nvme*", "sd[e-g]"), virt_type="kvm", probe_versions=False)
    assert Topology.from_dict(data) == want


@pytest.mark.parametrize("tree", TREES)
def test_json_roundtrip(tree: str) -> None:
    topo = discover_host(HOSTS / tree, allow=("nvme*",), virt_type="qemu", probe_versions=False)
    assert Topology.from_json(topo.to_json()) == topo
    assert Topology.from_json(topo.to_json(indent=None)).to_dict() == topo.to_dict()


def test_cli_tables_read_like_lscpu_and_lsblk(config: Path) -> None:
    r = hostd("discover", "--root", str(HOSTS / "2s-48c-smt-2pf-32vf"), "--allow", "sde",
              "--virt-type", "qemu", config=config)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "host oss-2s48-01" in out
    assert "warning: virt_type=qemu: guests run under TCG (slow)" in out
    assert "CPUs: 48 (48 online), one row per core" in out
    assert "0,24" in out and "23,47" in out  # siblings on one row
    assert "0-11,24-35" in out and "12-23,36-47" in out  # node CPU lists
    assert "2M: 1000/1024 free; 1G: 8/8 free" in out
    assert "VFs of ens1f0 (0000:3b:00.0)" in out and "ens1f0v15" in out
    assert "disks: 12 (1 assignable to VMs)" in out
    assert "holder md0 (md raid1 member)" in out


def test_render_every_tree_mentions_every_disk_and_nic() -> None:
    for tree in TREES:
        topo = discover_host(HOSTS / tree, allow=(), virt_type="kvm", probe_versions=False)
        console = Console(record=True, width=400)
        render_topology(topo, console)
        text = console.export_text()
        for d in topo.disks:
            assert d.name in text and "; ".join(d.reasons) in text
        for n in topo.nics:
            assert n.name in text and n.pci in text


@pytest.mark.skipif(shutil.which("umockdev-run") is None, reason="umockdev not installed (apt install umockdev)")
def test_pyudev_reads_id_serial_and_wwn_of_a_mocked_disk(config: Path) -> None:
    """Recorded device, live code path: under umockdev-run, /sys and the udev
    database are the mocked ones, so `hostd discover` (root "/") asks pyudev.
    The mocked sda has no wwid/serial sysfs attributes and there is no
    /run/udev/data file either: ID_SERIAL_SHORT, ID_WWN and ID_MODEL can only
    have come through pyudev/libudev. /proc stays this machine's, whose root
    disk is not in the mocked /sys: discover must say so and carry on."""
    dev = HOSTS / "umockdev" / "sata-disk-udev.umockdev"
    r = hostd("discover", "--json", "--allow", "sda", "--virt-type", "qemu", config=config,
              wrap=["umockdev-run", "-d", str(dev), "--"])
    assert r.returncode == 0, r.stderr
    topo = Topology.from_json(r.stdout)
    (sda,) = topo.disks
    assert sda.name == "sda"
    assert sda.wwn == "0x5000c500a1b2c3d4"
    assert sda.id == "wwn-0x5000c500a1b2c3d4"
    assert sda.serial == "ZA1ABCDE"
    assert sda.model == "ST8000NM0055-1RM112"
    assert (sda.size_bytes, sda.rotational, sda.readonly) == (15628053168 * 512, True, False)
    assert (sda.assignable, sda.reasons) == (True, ())
    assert any("no disk is marked as backing the root filesystem" in w for w in topo.host.warnings)
    assert topo.cpus == ()  # the mocked /sys has no CPUs: reported empty, with a warning
    assert any("no cpuN directories" in w for w in topo.host.warnings)
