"""The atomic-write unit a VM is guaranteed on a disk (hostd/carve/atomic.py), through
the planner on the recorded 6.12 and 6.1 trees."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from api.layout import Layout, layout_problems
from hostd.carve.atomic import CARRIES, offer
from hostd.carve.plan import plan_host
from hostd.carve.policy import PolicyError, loads_policy
from hostd.discover import discover_host
from hostd.discover.model import Disk

HOSTS = Path(__file__).resolve().parents[2] / "data" / "hosts"
ALLOW = '[disks]\nallow = ["nvme*"]\n'


def _disks(tree: str, policy: str = ALLOW) -> dict:
    lay = plan_host(discover_host(HOSTS / tree, allow=("nvme*",)), loads_policy(policy))
    assert isinstance(lay, Layout), lay
    assert layout_problems(lay) == []
    return {d.name: d for d in lay.disks}


def test_virtio_blk_never_offers_the_unit() -> None:
    d = _disks("1s-4c-nvme-atomic-6.12")
    assert (d["nvme0n1"].atomic_unit_bytes, d["nvme0n1"].atomic_write_bytes) == (16384, 0)
    assert "virtio-blk does not tell the guest" in d["nvme0n1"].atomic_note
    assert (d["nvme1n1"].atomic_unit_bytes, d["nvme1n1"].atomic_write_bytes) == (0, 0)
    assert d["nvme1n1"].atomic_note == "the kernel reports no atomic writes"


def test_an_emulator_is_listed_but_refused_because_qemu_can_split() -> None:
    pol = ALLOW + '[disks.atomic]\nnvme_emulator = "/opt/qemu-10.0/bin/qemu-system-x86_64"\n'
    d = _disks("1s-4c-nvme-atomic-6.12", pol)
    assert d["nvme0n1"].atomic_write_bytes == 0
    assert "emulated NVMe can split" in d["nvme0n1"].atomic_note


def test_identify_units_reach_the_layout() -> None:
    d = _disks("1s-4c-nvme-identify-6.1")
    assert {n: b.atomic_unit_bytes for n, b in d.items()} == \
        {"nvme0n1": 16384, "nvme1n1": 4096, "nvme2n1": 4096, "nvme3n1": 0, "nvme4n1": 0}
    assert "NABO 8" in d["nvme3n1"].atomic_note
    assert "unknown" in d["nvme4n1"].atomic_note


def test_a_carrying_path_offers_the_device_unit() -> None:
    """The rule itself: through VFIO (not built yet, so only here) the unit is offered."""
    disk = next(x for x in discover_host(HOSTS / "1s-4c-nvme-atomic-6.12").disks if x.name == "nvme0n1")
    assert CARRIES["vfio-nvme"] and not CARRIES["virtio-blk"] and not CARRIES["emulated-nvme"]
    assert offer(disk, frozenset({"virtio-blk", "vfio-nvme"})) == (16384, 16384, "16384 B through vfio-nvme")
    unknown: Disk = dataclasses.replace(disk, atomic=None)
    assert offer(unknown, frozenset({"vfio-nvme"}))[1] == 0


@pytest.mark.parametrize("text, field", [
    ('[disks.atomic]\nvfio_nvme = true\n', "disks.atomic.vfio_nvme"),
    ('[disks.atomic]\nnvme_emulator = "qemu-system-x86_64"\n', "disks.atomic.nvme_emulator"),
    ('[disks.atomic]\nemulator = "/x"\n', "disks.atomic.emulator"),
])
def test_bad_atomic_policy_names_the_field(text: str, field: str) -> None:
    with pytest.raises(PolicyError) as e:
        loads_policy(text)
    assert e.value.field == field


@pytest.mark.parametrize("offered, unit, ok", [(0, 0, True), (16384, 16384, True), (16384, 4096, False),
                                               (12288, 16384, False), (1 << 21, 1 << 21, False)])
def test_layout_problems_check_the_offered_unit(offered: int, unit: int, ok: bool) -> None:
    d = _disks("1s-4c-nvme-atomic-6.12")["nvme0n1"]
    lay = Layout((), (), (dataclasses.replace(d, atomic_unit_bytes=unit, atomic_write_bytes=offered),),
                 plan_host(discover_host(HOSTS / "1s-4c-nvme-atomic-6.12"), loads_policy("")).io_service,
                 "machine.slice", ())
    probs = layout_problems(lay)
    assert (probs == []) == ok, probs
    if not ok:
        assert probs[0][0] == "layout.disks[0].atomic_write_bytes"


# ---------------------------------------------------------------- the claim re-checks it

def _claim_layout() -> tuple[Layout, dict]:
    from tests.hostd.carve.test_vmclaim import LAYOUT, SIBLINGS
    atomic = dataclasses.replace(LAYOUT.disks[0], atomic_unit_bytes=16384, atomic_write_bytes=16384,
                                 atomic_note="16384 B through vfio-nvme")
    plain = dataclasses.replace(LAYOUT.disks[1], atomic_note="virtio-blk does not tell the guest an atomic unit")
    return dataclasses.replace(LAYOUT, disks=(atomic, plain)), SIBLINGS


@pytest.mark.parametrize("disk, want, why", [
    ("nvme0n1", 16384, None), ("nvme0n1", 0, None),
    ("nvme0n1", 32768, "nvme0n1 guarantees 16384 B, 32768 B wanted"),
    ("sdf", 4096, "sdf is not offered as atomic (virtio-blk does not tell the guest an atomic unit), 4096 B wanted"),
])
def test_hostd_claim_refuses_a_disk_without_the_unit(disk: str, want: int, why: str | None) -> None:
    from hostd.carve.vmclaim import Claim, DiskReq, Usage, VmRequest, claim
    from hostd.errors import NoFit
    lay, sib = _claim_layout()
    node = 0 if disk == "nvme0n1" else 1
    got = claim(lay, sib, Usage(), VmRequest("r1", "vm1", 2, 512, node=node,
                                             disks=(DiskReq(disk, 500 * 2**20 if disk == "nvme0n1" else 0, 0, want),)))
    if why is None:
        assert isinstance(got, Claim), got
    else:
        assert isinstance(got, NoFit) and got.field == "disks[0].atomic_write_bytes" and why in str(got), got


def test_hostd_spec_bounds_the_unit() -> None:
    from hostd.carve.vmspec import DiskSpec, VmSpec, spec_problem
    spec = VmSpec(request_id="r1", name="vm1", vcpus=1, memory_mib=512, image="smoke",
                  disks=(DiskSpec("nvme0n1", atomic_write_bytes=12288),))
    bad = spec_problem(spec)
    assert bad is not None and bad.field == "disks[0].atomic_write_bytes" and "power of two" in str(bad)


def test_spec_keeps_the_ask_and_old_specs_read_the_same() -> None:
    from hostd.carve.vmspec import DiskSpec, VmSpec
    spec = VmSpec(request_id="r1", name="vm1", vcpus=1, memory_mib=512, image="smoke",
                  disks=(DiskSpec("nvme0n1", atomic_write_bytes=16384), DiskSpec("sdf")))
    d = spec.to_dict()
    assert d["disks"][0]["atomic_write_bytes"] == 16384 and "atomic_write_bytes" not in d["disks"][1]
    assert VmSpec.from_dict(d) == spec
    assert spec.request().disks[0].atomic_write_bytes == 16384
