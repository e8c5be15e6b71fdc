"""The rollout spec and the plan: pure, no hosts touched."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.fleet_rollout.inventory import Host, hosts_from_inventory_json, select
from tools.fleet_rollout.plan import make_plan, wave_sizes
from tools.fleet_rollout.spec import SpecError, load_spec, parse_spec

POLICY = '[io_service]\ncpus = "0"\n'


def spec(tmp_path: Path, extra: str = "") -> Path:
    (tmp_path / "policy.toml").write_text(POLICY)
    p = tmp_path / "r.toml"
    p.write_text(f'name = "r1"\npolicy = "policy.toml"\n{extra}')
    return p


def fleet(n: int, racks: int) -> list[Host]:
    return [Host(f"h{i:05d}", f"10.0.{i // 250}.{i % 250}:7443", f"r{i % racks:03d}", {"disk": "nvme"})
            for i in range(n)]


def test_the_spec_reads_its_policy_and_digest(tmp_path: Path) -> None:
    s = load_spec(spec(tmp_path))
    assert s.policy_text == POLICY
    assert len(s.policy_digest) == 64
    assert s.waves.percent == [1.0, 5.0, 25.0, 100.0]


@pytest.mark.parametrize("extra, field", [
    ("colour = 1\n", "colour"),
    ("[waves]\npercent = [5, 150]\n", "waves.percent"),
    ("[waves]\npercent = [5, 50]\n", "waves.percent"),
    ("[waves]\npercent = [50, 20, 100]\n", "waves.percent"),
    ("[limits]\nper_rack = 0\n", "limits.per_rack"),
    ("[gate]\nalpha = 2\n", "gate.alpha"),
    ("[gate]\nthreshold = 3\n", "gate.threshold"),
    ('kind = "hostd"\n', "hostd_version"),
])
def test_bad_specs_name_the_field(tmp_path: Path, extra: str, field: str) -> None:
    with pytest.raises(SpecError) as e:
        load_spec(spec(tmp_path, extra))
    assert e.value.field == field, e.value


def test_a_missing_policy_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as e:
        parse_spec({"name": "x", "policy": "nope.toml"}, tmp_path)
    assert e.value.field == "policy" and "nope.toml" in e.value.reason


@pytest.mark.parametrize("text, why", [
    ("a = 1\n" + "#" * (64 * 1024), "larger than 65536 bytes"),
    ("x = " + "[" * 40 + "]" * 40 + "\n", "nests 40 deep; at most 8"),
    ("a." * 40 + "b = 1\n", "a dotted key nests deeper than"),
    ("[host\n", "not TOML"),
])
def test_a_policy_hostd_would_refuse_is_refused_before_any_host(tmp_path: Path, text: str, why: str) -> None:
    (tmp_path / "big.toml").write_text(text)
    with pytest.raises(SpecError) as e:
        parse_spec({"name": "x", "policy": "big.toml"}, tmp_path)
    assert e.value.field == "policy" and "big.toml" in e.value.reason and why in e.value.reason, e.value.reason


def test_a_policy_that_never_ends_is_read_no_further_than_hostd_takes(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as e:
        parse_spec({"name": "x", "policy": "/dev/zero"}, tmp_path)
    assert e.value.field == "policy" and "larger than" in e.value.reason, e.value.reason


def test_waves_cover_every_host_once_canary_first(tmp_path: Path) -> None:
    s = load_spec(spec(tmp_path))
    hosts = fleet(7000, 140)
    plan = make_plan(hosts, s)
    sizes = [len(w) for w in plan.waves]
    assert sizes == [1, 69, 280, 1400, 5250] == wave_sizes(7000, s)
    names = [h.name for w in plan.waves for h in w]
    assert sorted(names) == sorted(h.name for h in hosts)
    # each wave spreads over the racks: wave 1 (69 hosts) touches 69 racks, not one
    assert len({h.rack for h in plan.waves[1]}) == 69


def test_preflight_refusals_are_skipped_with_the_reason(tmp_path: Path) -> None:
    s = load_spec(spec(tmp_path))
    hosts = fleet(10, 2)
    plan = make_plan(hosts, s, {"h00003": "does not fit [hugepages]: 2 pages short"})
    assert "h00003" not in {h.name for w in plan.waves for h in w}
    assert [(h.name, why) for h, why in plan.skipped] == [("h00003", "does not fit [hugepages]: 2 pages short")]
    with pytest.raises(SpecError) as e:
        make_plan(hosts, s, {h.name: "does not fit [io_service.cpus]: CPU 0 is offline" for h in hosts})
    assert e.value.field == "policy" and "fits none of the 10" in e.value.reason


def test_selectors(tmp_path: Path) -> None:
    hosts = fleet(10, 5)
    assert {h.rack for h in select(hosts, "rack=r002")} == {"r002"}
    assert len(select(hosts, "rack=r002, disk=nvme")) == 2
    with pytest.raises(SpecError) as e:
        select(hosts, "rack=r999")
    assert e.value.field == "inventory.select" and "matches none" in e.value.reason
    with pytest.raises(SpecError):
        select(hosts, "rack")


def test_ansible_inventory_racks_from_groups_and_vars() -> None:
    inv = {"_meta": {"hostvars": {"s1": {"ansible_host": "10.0.0.1", "disk": "nvme"},
                                  "s2": {"rack": "r2", "hostd_port": 7000},
                                  "s3": {"rack": "r9"}}},
           "all": {"children": ["rack_r1", "storage"]},
           "rack_r1": {"hosts": ["s1"]}, "storage": {"hosts": ["s1", "s2", "s3"]}}
    hosts = {h.name: h for h in hosts_from_inventory_json(inv)}
    assert hosts["s1"] == Host("s1", "10.0.0.1:7443", "r1", {"disk": "nvme"})
    assert hosts["s2"].address == "s2:7000" and hosts["s2"].rack == "r2"
    inv["rack_r2"] = {"hosts": ["s3"]}
    with pytest.raises(SpecError) as e:
        hosts_from_inventory_json(inv)
    assert "s3 is in two racks: r2, r9" in e.value.reason


def test_the_example_spec_is_valid_and_shows_the_defaults(tmp_path: Path) -> None:
    from tools.fleet_rollout.spec import RolloutSpec

    example = Path(__file__).resolve().parents[3] / "tools/fleet_rollout/rollout.example.toml"
    (tmp_path / "policy.toml").write_text(POLICY)
    (tmp_path / "r.toml").write_text(example.read_text())
    s = load_spec(tmp_path / "r.toml")
    defaults = RolloutSpec(name="x", policy="p")
    for part in ("waves", "limits", "steps", "gate"):
        assert getattr(s, part) == getattr(defaults, part), part  # the comments say they are defaults
