"""bench/migration.py --isolation --short: the IO service's side (cyclictest + fio on A's IO
CPU, from a raw loop disk of its own) alone, during a move of a running guest A->B through
hostd uncapped and during one capped. Asserted: the mechanism, not the latencies (the bench
reports those): all three cases measured, each move done with libvirt's figures, the cap
reached libvirt, every QEMU thread of both ends (the migration thread, the IO thread doing
the NBD mirror) pinned off the IO CPU and never run there, hostd's IO-health signal counting
the move as VM CPU, the guest on exactly one host at the end with one QEMU, and nothing the
bench started left: no process or mount under its work dir, no loop device, the 2 MiB pool
as it was. Real libvirtd pair, hostd, QEMU, cyclictest, fio."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from bench.migration import PREALLOC

# Not quiet: what it asserts (pinning, CPU counted as the VMs', one copy, cleanup) holds
# under other load; the latencies it prints are the bench's to judge on a quiet machine.
pytestmark = [pytest.mark.integration, pytest.mark.root, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
POOL = Path("/sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages")


def _loops() -> str:
    return subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=True).stdout


def _cmdlines_under(work: str) -> list[str]:
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if work in argv:
            out.append(f"{pid}: {argv[:200]}")
    return out


@pytest.mark.timeout(1200)
def test_the_io_side_is_measured_alone_and_during_an_uncapped_and_a_capped_move() -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs: one for the IO service, one for the VM")
    pool = POOL.read_text().strip()
    r = subprocess.run([sys.executable, "-m", "bench.migration", "--isolation", "--short", "--json"],
                       capture_output=True, text=True, timeout=1100, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    iso = out["isolation"]
    io_cpu = iso["io_cpu"]
    assert iso["vm_cpus"] and io_cpu not in iso["vm_cpus"]
    cases = iso["cases"]
    assert sorted(cases) == ["alone", "capped", "uncapped"] and all(len(v) == 1 for v in cases.values())
    for name, (c,) in cases.items():
        assert c["wakeups"] > 1000 and c["io_requests"] > 300, (name, c)  # the IO side ran the whole window
        assert 0 < c["wake_p50_us"] <= c["wake_p99_us"] <= c["wake_p999_us"] <= c["wake_max_us"], (name, c)
        assert 0 < c["io_p50_us"] <= c["io_p99_us"] <= c["io_p999_us"], (name, c)
        assert 0 <= c["steal_cpus"] < 2 and 0 <= c["io_cpu_softirq"] <= c["io_cpu_busy"] <= 1, (name, c)
        assert c["gate_samples"] >= 2, (name, c)  # hostd's signal sampled the window
    for name in ("uncapped", "capped"):
        (c,) = cases[name]
        assert 0 < c["downtime_ms"] < c["job_ms"] <= 1000 * c["wall_s"] * 1.05, (name, c)
        assert c["window_s"] >= c["wall_s"], (name, c)  # the IO side spanned the whole move
        assert c["gate_cpu_vms"] > 0, (name, c)  # the move's QEMU work counted as the VMs' CPU
        (threads,) = iso["threads"][name]
        assert threads["source qemu/live_migration"]["cpu_ms"] > 0, threads  # QEMU's migration thread ran
        qemu = {k: v for k, v in threads.items() if "qemu/" in k}
        assert any(k.startswith("target qemu/") for k in qemu), threads
        # Not pinned by hostd: the thread context libvirt gives QEMU for preallocating the
        # hugepages (and the threads it spawns) takes the whole NUMA node's CPUs. The pair's
        # libvirtds run without cgroups; on a host the VM's cpuset cgroup confines it
        # (bench/migration.py: PREALLOC).
        for k, v in qemu.items():  # hostd's emulator/IO thread pinning: never on the IO CPU
            if k.split("/", 1)[1].startswith(PREALLOC):
                continue
            assert v["allowed"] and str(io_cpu) not in v["allowed"].replace("-", ",").split(","), (k, v)
            assert v["on_io_cpu_ms"] == 0, (k, v)
    # the cap reached libvirt: the source domain's migration speed while it moved (`virsh
    # migrate-getspeed`; unlimited, 8 EiB/s in MiB, when uncapped). Not the job times: under
    # the suite's load an uncapped move ran slower than a capped one.
    assert cases["capped"][0]["libvirt_speed_mib_s"] == iso["cap_mib_s"], cases["capped"]
    assert cases["uncapped"][0]["libvirt_speed_mib_s"] > 10**6, cases["uncapped"]
    assert iso["moves"] == 4  # A->B in each move's window, B->A after it
    end = iso["end"]  # before the bench's cleanup: one running copy, back on A
    assert end["a"] == {"domains": ["hyb-mig-bench"], "hostd_vms": ["hyb-mig-bench"], "qemu": 1}, end
    assert end["b"] == {"domains": [], "hostd_vms": [], "qemu": 0}, end
    work = out["work"]
    assert not Path(work).exists()
    assert _cmdlines_under(work) == []  # the pair's libvirtds, the hostds, QEMU: all gone
    assert work not in Path("/proc/mounts").read_text() and work not in _loops()
    assert POOL.read_text().strip() == pool
