"""Policy parsing: every error names the key; the shipped example is valid and plans."""

from __future__ import annotations

from pathlib import Path

import pytest
from synth import disk, nic, topology

from api.layout import Layout
from hostd.carve.plan import plan_host
from hostd.carve.policy import PolicyError, load_policy, policy_from_dict

REPO = Path(__file__).resolve().parents[3]


def test_example_policy_plans_on_a_48cpu_host():
    pol = load_policy(REPO / "hostd/carve/policy.example.toml")
    topo = topology(sockets=2, cores=12, threads=2, mem_gib_per_node=192,
                    nics=(nic("ens1f0", node=0, total=64, speed=25000),),
                    disks=(disk("nvme0n1", reasons=("not in the allow-list",)),))
    lay = plan_host(topo, pol)
    assert isinstance(lay, Layout), lay
    assert len(lay.io_cpus) == 8 and len(lay.host_cpus) == 4 and len(lay.vm_cpus) == 36
    assert lay.disks[0].bytes_sec == 2_000_000_000
    assert lay.nodes[0].hugepages[1].count == 96  # 50 % of 192 GiB in 1 GiB pages


@pytest.mark.parametrize("data, field, words", [
    ({"io_service": {"cpus_per_node": -1}}, "io_service.cpus_per_node", "greater than or equal to 0"),
    ({"io_service": {"cpus": "3-1"}}, "io_service.cpus", ""),
    ({"io_service": {"cpus": "1", "cpus_per_node": 1}}, "io_service", "not both"),
    ({"io_service": {"unit": "a", "process": "b"}}, "io_service", "name the IO service once"),
    ({"hugepages": {"pools": [{"size": "3X", "count_per_node": 1}]}}, "hugepages.pools.0.size", "page size"),
    ({"hugepages": {"pools": [{"size": "2M"}]}}, "hugepages.pools.0", "exactly one of"),
    ({"sriov": {"pfs": [{"name": "x", "vfs": 1, "bandwith_mbps": 5}]}}, "sriov.pfs.0.bandwith_mbps",
     "Extra inputs"),
    ({"disk": {}}, "disk", "Extra inputs"),
])
def test_policy_errors_name_the_field(data, field, words):
    with pytest.raises(PolicyError) as e:
        policy_from_dict(data)
    assert e.value.field == field and words in e.value.reason, e.value


def test_bad_toml_names_the_file(tmp_path):
    p = tmp_path / "p.toml"
    p.write_text("[io_service\n")
    with pytest.raises(PolicyError) as e:
        load_policy(p)
    assert e.value.field == str(p) and "TOML" in e.value.reason
