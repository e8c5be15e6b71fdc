"""The CPU-pick rule (api/cpus.py) and the two callers that must agree on it: the
scheduler's fit picks CPUs to place a VM, hostd's claim check picks them again when the
scheduler's choice is absent. On random SMT layouts and random used CPUs, both give
the same CPUs, and the rule's own promises hold."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from api.cpus import cores_of, pick_cpus
from api.layout import HugepageTarget, IoServiceTarget, Layout, NodeLayout
from hostd.carve.vmclaim import Claim, Usage, VmRequest, claim
from scheduler import fit
from scheduler.resources import host_from_layout


@st.composite
def node_state(draw):
    threads = draw(st.sampled_from([1, 2, 4]))
    cores = draw(st.integers(1, 8))
    siblings = {c * threads + t: tuple(c * threads + s for s in range(threads))
                for c in range(cores) for t in range(threads)}
    all_cpus = sorted(siblings)
    vm_cpus = sorted(draw(st.sets(st.sampled_from(all_cpus), min_size=1)))
    used = frozenset(draw(st.sets(st.sampled_from(vm_cpus))))
    count = draw(st.integers(0, len(vm_cpus) - len(used)))
    return siblings, vm_cpus, used, count


@settings(max_examples=300, deadline=None)
@given(node_state())
def test_scheduler_fit_and_hostd_claim_pick_the_same_cpus(state) -> None:
    siblings, vm_cpus, used, count = state
    layout = Layout(nodes=(NodeLayout(0, (), (), tuple(vm_cpus), (HugepageTarget(2048, 4),)),), pfs=(),
                    disks=(), io_service=IoServiceTarget("none", ""), vm_cgroup="m", reboot_required=())
    theirs = fit.pick_cpus(host_from_layout("h", layout, siblings=siblings).nodes[0], used, count)
    if count == 0:
        assert theirs == []
        return
    ours = claim(layout, siblings, Usage(cpus=used),
                 VmRequest("r", "vm", count, 2, emulator_policy="share", node=0))
    assert isinstance(ours, Claim), ours
    assert list(ours.vcpu_pins) == theirs


@settings(max_examples=300, deadline=None)
@given(node_state())
def test_the_rule_takes_free_cpus_and_keeps_whole_cores_whole(state) -> None:
    siblings, vm_cpus, used, count = state
    cores = cores_of(vm_cpus, siblings)
    got = pick_cpus(cores, used, count)
    assert len(got) == len(set(got)) == count and not set(got) & used and set(got) <= set(vm_cpus)
    # a core left whole and free was not needed: whatever split instead could not be avoided
    whole_free = [c for c in cores if not set(c) & used]
    split_by_us = [c for c in whole_free if 0 < len(set(c) & set(got)) < len(c)]
    assert len(split_by_us) <= 1  # at most one whole core is broken, for the odd remainder
