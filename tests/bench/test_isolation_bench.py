"""bench/isolation.py's short run (3 s a case) asserts the mechanism the source write-up
shows, not the latencies (those are the bench's to report): a neighbour under a CFS quota
of one CPU, allowed on every CPU, bursts far above its quota at 10 ms granularity while
looking obedient at 1 s; the same neighbour inside a 1-vCPU VM created through hostd never
uses more than its vCPU. The memory/IO neighbour's VM case (the only one --short runs)
really runs in the guest: its dd writers reach the VM's raw disk. Real cgroups,
stress-ng, cyclictest, fio, libvirtd + QEMU."""

from __future__ import annotations

import pytest
from benchrun import bench_json

pytestmark = [pytest.mark.integration, pytest.mark.root, pytest.mark.slow, pytest.mark.quiet]
# cpuacct.usage and sum_exec_runtime advance at scheduler ticks, so a single 10 ms window
# can read up to ~1.35x what ran in it (the max); the p99 of the windows does not move.


def test_quota_bursts_at_10ms_and_a_vm_never_exceeds_its_vcpus(libvirtd) -> None:
    out = bench_json("isolation.py", "--short", "--json", "--cases", "a,b1,c", "--io-cases", "c", timeout=900)
    b1, vm = out["b1"][0], out["c"][0]
    # quota 1 CPU: bursts over it within a 10 ms period (on both CPUs: 190+ % on a quiet
    # machine; 146 % beside `stress-ng --cpu 1`, which takes a CPU's share from the burst)
    assert b1["cpu_p99_10ms"] > 120, b1
    # ...averaging to the quota at 1 s, never over it; the lower bound only shows the load
    # reached the quota (70.7 % beside `stress-ng --cpu 1` and the suite on 2 CPUs)
    assert 50 < b1["cpu_max_1s"] <= 100 * 1.05, b1
    assert b1["nr_throttled"] > 0
    assert vm["cpu_p99_10ms"] <= 100 * 1.05 and vm["cpu_max_1s"] <= 100 * 1.05, vm
    assert vm["vcpu_pins"] == [max(__import__("os").sched_getaffinity(0))]
    mem = out["mem-c"][0]
    assert mem["vm_disk_write_mbs"] > 1, mem  # the guest's writers, through QEMU, on its raw disk
    assert mem["vcpu_pins"] == vm["vcpu_pins"]
    for case in ("a", "b1", "c", "mem-c"):
        assert out[case][0]["wakeups"] > 2000 and out[case][0]["io_requests"] > 1000  # the IO side ran
