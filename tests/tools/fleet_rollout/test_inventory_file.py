"""Ansible inventory files read by Ansible's own ``ansible-inventory`` (INI and YAML)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.fleet_rollout.inventory import from_ansible_inventory
from tools.fleet_rollout.spec import SpecError

INI = """
[rack_r1]
s1 ansible_host=10.0.0.1 disk=nvme
s2 ansible_host=10.0.0.2

[rack_r2]
s3 ansible_host=10.0.0.3 hostd_port=7444

[storage:children]
rack_r1
rack_r2
"""

YAML = """
all:
  children:
    storage:
      hosts:
        s1: {ansible_host: 10.0.0.1, rack: r1, disk: nvme}
        s2: {ansible_host: 10.0.0.2, rack: r1}
"""


@pytest.mark.parametrize("name, text", [("hosts.ini", INI), ("hosts.yml", YAML)])
def test_ini_and_yaml(tmp_path: Path, name: str, text: str) -> None:
    (tmp_path / name).write_text(text)
    hosts = {h.name: h for h in from_ansible_inventory(tmp_path / name)}
    assert hosts["s1"].address == "10.0.0.1:7443"
    assert hosts["s1"].rack == "r1" and hosts["s1"].labels == {"disk": "nvme"}
    if name.endswith("ini"):
        assert hosts["s3"].address == "10.0.0.3:7444" and hosts["s3"].rack == "r2"


def test_a_host_in_two_racks_is_named(tmp_path: Path) -> None:
    (tmp_path / "h.ini").write_text(INI + "\n[rack_r3]\ns2\n")
    with pytest.raises(SpecError) as e:
        from_ansible_inventory(tmp_path / "h.ini")
    assert "s2 is in two racks: r1, r3" in e.value.reason
