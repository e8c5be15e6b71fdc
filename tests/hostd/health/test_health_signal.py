"""The IO-health readers and the signal on generated /proc and cgroup trees, cgroup v1
and v2 layouts, in the kernel's exact file formats: two samples give exact numbers."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hostd.discover.fs import HostFs
from hostd.health import readers
from hostd.health.sampler import Sampler, Where
from hostd.health.signal import clock_ticks

HZ = clock_ticks()


def stat_line(tid: int, comm: str, cpu: int, utime: int, stime: int, kthread: bool = False) -> str:
    """/proc/<pid>/task/<tid>/stat: 52 fields; comm in parentheses, may hold spaces."""
    f = ["S", "1", str(tid), str(tid), "0", "-1", str(0x00200040 if kthread else 0x400040)] + ["0"] * 4 + \
        [str(utime), str(stime)] + ["0"] * 23 + [str(cpu)] + ["0"] * 13
    assert len(f) == 50 and f[36] == str(cpu)
    return f"{tid} ({comm}) " + " ".join(f) + "\n"


class Tree:
    """A host tree the test rewrites between two samples."""

    def __init__(self, root: Path, version: int):
        self.root, self.version = root, version
        cg = "sys/fs/cgroup/cpuset" if version == 1 else "sys/fs/cgroup"
        self.io = f"{cg}/hyb-io"
        self.vm = f"{cg}/machine"
        self.cpu_cg = "sys/fs/cgroup/cpu/hyb-io" if version == 1 else self.io

    def write(self, rel: str, text: str) -> None:
        p = self.root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)

    def state(self, *, ticks: dict[int, tuple[int, int]], irq_cpu0: int, psi_total: int, throttled: tuple[int, int],
              busy0: int, idle0: int) -> None:
        # cpu0 is the IO service's; cpu1 the VMs'
        self.write("proc/stat", f"cpu  1 2 3 4 5 6 7 8 0 0\ncpu0 {busy0} 0 0 {idle0} 0 0 0 0 0 0\n"
                                f"cpu1 500 0 0 500 0 0 0 0 0 0\nintr 1\n")
        self.write("proc/interrupts", "           CPU0       CPU1       \n"
                                      f" 30: {irq_cpu0:10d} {7:10d}  PCI-MSIX-0000:3b:00.0  0-edge  nvme0q0\n"
                                      "LOC:      100      200   Local timer interrupts\n")
        names = {10: ("ossd", 0, False), 11: ("ossd worker", 0, False), 20: ("qemu-kvm", 1, False),
                 21: ("CPU 0/KVM", 1, False), 30: ("backup (nice)", 0, False), 40: ("kworker/0:1", 0, True)}
        for tid, (comm, cpu, kt) in names.items():
            u, s = ticks[tid]
            self.write(f"proc/{tid}/task/{tid}/stat", stat_line(tid, comm, cpu, u, s, kt))
        if self.version == 2:
            self.write(f"{self.io}/cgroup.threads", "10\n11\n")
            self.write(f"{self.vm}/qemu-1/cgroup.threads", "20\n21\n")
            self.write(f"{self.io}/cpu.pressure", f"some avg10=1.50 avg60=0.40 avg300=0.10 total={psi_total}\n"
                                                  "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
            self.write(f"{self.io}/cpu.stat", f"usage_usec 5000\nuser_usec 4000\nsystem_usec 1000\n"
                                              f"nr_periods 100\nnr_throttled {throttled[0]}\n"
                                              f"throttled_usec {throttled[1]}\n")
        else:
            self.write(f"{self.io}/tasks", "10\n11\n")
            self.write(f"{self.vm}/qemu-1/tasks", "20\n21\n")
            self.write("proc/pressure/cpu", f"some avg10=1.50 avg60=0.40 avg300=0.10 total={psi_total}\n"
                                            "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
            self.write(f"{self.cpu_cg}/cpu.stat", f"nr_periods 100\nnr_throttled {throttled[0]}\n"
                                                  f"throttled_time {throttled[1] * 1000}\n")

    def where(self) -> Where:
        return Where(self.io, self.vm, psi=f"{self.io}/cpu.pressure" if self.version == 2 else "proc/pressure/cpu",
                     throttle_cgroup=self.cpu_cg)


@pytest.mark.parametrize("version", [1, 2])
def test_two_samples_give_exact_rates(tmp_path: Path, version: int) -> None:
    t = Tree(tmp_path, version)
    base = {10: (100, 10), 11: (50, 0), 20: (900, 90), 21: (400, 0), 30: (5, 5), 40: (3, 0)}
    t.state(ticks=base, irq_cpu0=1000, psi_total=10_000_000, throttled=(4, 20_000), busy0=100, idle0=900)
    s = Sampler(tmp_path, (0,), t.where())
    assert s.step() is None  # the first sample has nothing to compare with
    later = {10: (100 + HZ // 2, 10), 11: (50 + HZ // 4, 0), 20: (900 + HZ, 90), 21: (400, 0),
             30: (5 + HZ // 10, 5), 40: (3 + 1, 0)}
    t.state(ticks=later, irq_cpu0=1500, psi_total=10_250_000, throttled=(7, 50_000), busy0=400, idle0=1600)
    s._last = dataclasses.replace(s._last, mono=s._last.mono - 1.0)  # as if taken 1 s earlier
    st = s.step()
    assert st is not None
    dt = st.interval_s
    assert dt == pytest.approx(1.0, abs=0.05)
    assert st.cpu_io_service == pytest.approx((HZ // 2 + HZ // 4) / HZ / dt)
    assert st.cpu_vms == pytest.approx(1.0 / dt)
    assert st.cpu_other == pytest.approx((HZ // 10 + 1) / HZ / dt)
    # the backup job and the kworker ran on CPU 0; nothing of the VMs did
    assert [(f.tid, f.comm, f.kthread) for f in st.top_foreign] == [(30, "backup (nice)", False),
                                                                    (40, "kworker/0:1", True)]
    assert (st.foreign_threads, st.foreign_kernel_threads) == (2, 1)
    assert st.foreign_cpu_s == pytest.approx((HZ // 10 + 1) / HZ)
    assert st.foreign_kernel_cpu_s == pytest.approx(1 / HZ)  # the kworker's part
    assert st.irqs_on_io_cpus_per_s == pytest.approx(500 / dt)  # CPU 1's 7 and the timer's are not counted
    assert st.top_irqs[0].irq == "30" and "nvme0q0" in st.top_irqs[0].name
    assert st.io_cpu_busy == pytest.approx(0.3)  # 300 of cpu0's 1000 ticks busy
    assert st.psi_some_avg10 == 1.5 and st.psi_some_stall == pytest.approx(0.25 / dt)
    assert (st.throttled_periods, st.throttled_ms) == (3, 30.0)


def test_readers_survive_odd_files(tmp_path: Path) -> None:
    """Missing files read as nothing; a thread whose comm holds ') (' parses right."""
    fs = HostFs(tmp_path)
    assert readers.read_cpu_times(fs) == {} and readers.read_interrupts(fs) == {}
    assert readers.read_psi(fs, "proc/pressure/cpu") is None and readers.read_throttle(fs, "x") is None
    p = tmp_path / "proc/7/task/7/stat"
    p.parent.mkdir(parents=True)
    p.write_text(stat_line(7, "a) (b", 1, 3, 4))
    assert readers.read_threads(fs)[7].comm == "a) (b" and readers.read_threads(fs)[7].ticks == 7


def _thread(tid: int, pid: int, comm: str, cpu: int, ticks: int, kthread: bool = False) -> readers.Thread:
    return readers.Thread(tid, pid, comm, cpu, ticks, kthread)


def test_a_live_migrations_threads_on_the_source_count_as_the_vms_and_reach_the_gate() -> None:
    """A VM moving away, as hostd's signal sees the source host (io_cpus = CPU 0): the
    threads a live migration adds to the VM's QEMU (the migration thread, and an NBD
    connection thread born between the samples) and the IO thread running the disk mirror
    are the VM's CPU, as any QEMU thread in the VMs' cgroup; pinned off io_cpus they are
    not foreign. Were one on an io_cpu (a wrong pin), it would be foreign user CPU, which
    the rollout gate's ceiling judges (its Sample, through GetHostStats' answer); the loop
    device's kworker copying the disk is foreign kernel CPU, which the ceiling leaves out
    (the exclusive carve takes io_cpus from the unbound workqueues instead)."""
    from hostd.health.signal import Sample, diff
    from hostd.rpc.servicer import stats_to_proto
    from tools.fleet_rollout.clients import sample_of
    from tools.fleet_rollout.gates import judge
    from tools.fleet_rollout.spec import Gate

    qemu = 20
    cpu = {0: readers.CpuTime(0, 0), 1: readers.CpuTime(0, 0)}

    def sample(mono: float, threads: list[readers.Thread]) -> Sample:
        ts = {t.tid: t for t in threads}
        return Sample(mono=mono, wall=1000 + mono, cpu=cpu, irqs={}, threads=ts, io_tids=frozenset({10}),
                      vm_tids=frozenset(t.tid for t in threads if t.pid == qemu))

    before = [_thread(10, 10, "ossd", 0, 100), _thread(20, qemu, "qemu-system-x86", 1, 50),
              _thread(21, qemu, "CPU 0/KVM", 1, 900), _thread(22, qemu, "IO iothread1", 1, 10),
              _thread(30, 30, "hostd", 1, 40), _thread(40, 2, "kworker/u8:4+loop1", 0, 7, kthread=True)]
    during = [_thread(10, 10, "ossd", 0, 100 + HZ // 2), _thread(20, qemu, "qemu-system-x86", 1, 50 + HZ // 10),
              _thread(21, qemu, "CPU 0/KVM", 1, 900 + HZ // 2), _thread(22, qemu, "IO iothread1", 1, 10 + HZ // 5),
              _thread(23, qemu, "live_migration", 1, HZ // 4), _thread(24, qemu, "nbd-connect", 1, 3),
              _thread(30, 30, "hostd", 1, 40 + 2), _thread(40, 2, "kworker/u8:4+loop1", 0, 7 + HZ // 20, kthread=True)]
    st = diff(sample(0.0, before), sample(1.0, during), (0,))
    assert st.cpu_vms == pytest.approx((HZ // 10 + HZ // 2 + HZ // 5 + HZ // 4 + 3) / HZ)  # born threads whole
    assert st.cpu_io_service == pytest.approx((HZ // 2) / HZ) and st.cpu_other == pytest.approx((2 + HZ // 20) / HZ)
    assert [(f.comm, f.kthread) for f in st.top_foreign] == [("kworker/u8:4+loop1", True)]
    assert st.foreign_cpu_s == st.foreign_kernel_cpu_s == pytest.approx((HZ // 20) / HZ)
    gate = Gate(min_samples=3)
    assert sample_of(stats_to_proto(st)).foreign_cpu == 0.0
    assert judge([sample_of(stats_to_proto(st))] * 3, None, [], gate).decision == "pass"

    # the migration thread on the IO CPU (as it would run without hostd's emulator pinning)
    wrong = [dataclasses.replace(t, cpu=0) if t.comm == "live_migration" else t for t in during]
    st = diff(sample(0.0, before), sample(1.0, wrong), (0,))
    assert st.cpu_vms == pytest.approx((HZ // 10 + HZ // 2 + HZ // 5 + HZ // 4 + 3) / HZ)  # still the VM's CPU
    assert [(f.comm, f.kthread) for f in st.top_foreign] == [("live_migration", False), ("kworker/u8:4+loop1", True)]
    s = sample_of(stats_to_proto(st))
    assert s.foreign_cpu == pytest.approx((HZ // 4) / HZ)
    v = judge([s] * 3, None, [], gate)
    assert v.decision == "fail" and any("foreign CPU on io_cpus" in r for r in v.reasons), v
