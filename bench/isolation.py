#!/usr/bin/env python3
"""The IO service next to a CPU-hungry, then a memory/IO-hungry neighbour, in one run (root):

  (a)  baseline: the IO side alone on io_cpus;
  (b1) cgroup quota: N busy threads (stress-ng) in a cgroup with a CFS quota of the VM's
       vCPU count, allowed on every CPU (how containers usually co-locate);
  (b2) cgroup quota + cpuset: the same, confined to the VM CPUs;
  (c)  carved VM: the same N threads inside a VM created through hostd (vCPU pinned to
       the VM CPU, hugepage RAM), burning in the guest (smoke guest, hyb.burn=N).

The IO side, pinned to io_cpus in every case: wake-up latency (cyclictest, SCHED_OTHER,
1 kHz) and an IO request path (fio: 4 KiB O_DIRECT random reads at a fixed rate from a
raw loop disk; completion latency p50/p99/p99.9). The neighbour's CPU use is sampled
every 10 ms and every 1 s from its cgroup (cpuacct.usage), in % of one CPU: CFS enforces
a quota per period at tick granularity, so a quota'd group bursts above it at 10 ms
while looking obedient at 1 s; a VM cannot use more than its vCPUs at any granularity.

The memory/IO-hungry neighbour, the same ways (second table): stress-ng vm, cache, io
(sync(2) in a loop) and hdd (buffered writes) workers writing to the filesystem the IO
service's data lives on (fio reads a written file there, O_DIRECT), (b1) under the quota,
(b2) quota + cpuset; (c) in the VM: two dd loops through 32 MiB buffers and two buffered
dd writers to the VM's own raw disk (a preallocated loop file opened with direct IO, so no
host page cache). The smoke guest has no stressor for this, so the bench boots it with
rdinit=/bin/sh and a script after "--" that starts the guest's own /init in the
background (the guest image is unchanged). Also printed: what the host's disk wrote
(MB/s) and the host's peak Dirty + Writeback memory.

Deleting a large file (third table): a file written for real (--delete-gib, at most a
quarter of the free space) is unlinked on the shared ext4 (a loop-device ext4 when the
data's filesystem is not ext4) a fifth into the window while the IO side runs. The VM
side of it is not available: the smoke guest has no ext4 driver (a module in Debian's
kernel, not in its initramfs) and no mkfs.

    python3 bench/isolation.py                  # 10 s per case, 2 repeats
    python3 bench/isolation.py --seconds 30 --repeats 3 --threads 16
    python3 bench/isolation.py --short --json   # the mechanism only (make test runs it)
    python3 bench/isolation.py --cases a --io-cases a,b2,c --delete-gib 0

Ratios are against (a) measured in the same run; the machine's steal time is printed
(noise: a hypervisor's steal moves latencies more than anything here).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack, contextmanager
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CG = Path("/sys/fs/cgroup")
PERIOD_US = 100_000


# ---------------------------------------------------------------- measuring

class CpuMeter:
    """CPU use in ns (a cgroup's cpuacct.usage, or a process's threads' schedstat)
    sampled every 10 ms on a thread. Each sample is stamped at the middle of its read
    (a stamp taken before a read the thread was preempted in put the usage of the delay
    into a window that did not last it: 117 % for a 1-vCPU VM on a busy machine), and a
    window whose two reads took over a tenth of it is left out (``dropped``)."""

    def __init__(self, usage: "Callable[[], int]", period_s: float = 0.01):
        self.read = usage
        self.period = period_s
        self.samples: list[tuple[float, float, int]] = []  # (read began, read ended, ns)
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "CpuMeter":
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                v = self.read()
            except (OSError, ValueError):
                pass
            else:
                self.samples.append((t0, time.monotonic(), v))
            time.sleep(self.period)

    def stats(self) -> dict[str, float]:
        """Max and p99 of the use over 10 ms and over 1 s windows, % of one CPU."""
        s = [((t0 + t1) / 2, t1 - t0, v) for t0, t1, v in self.samples]
        fine, dropped = [], 0
        for a, b in zip(s, s[1:]):
            window = b[0] - a[0]
            if window <= 0 or a[1] + b[1] > window / 10:
                dropped += 1
                continue
            fine.append(100 * (b[2] - a[2]) / (window * 1e9))
        coarse, start = [], 0
        for i in range(1, len(s)):
            if s[i][0] - s[start][0] >= 1.0:
                coarse.append(100 * (s[i][2] - s[start][2]) / ((s[i][0] - s[start][0]) * 1e9))
                start = i
        return {"max_10ms": max(fine, default=0.0), "p99_10ms": _pct(fine, 99),
                "max_1s": max(coarse, default=0.0), "p99_1s": _pct(coarse, 99), "samples": len(fine),
                "dropped": dropped}


def cgroup_usage(cpuacct: Path) -> Callable[[], int]:
    return lambda: int((cpuacct / "cpuacct.usage").read_text())


def process_usage(pid: int) -> Callable[[], int]:
    """Every thread's sum_exec_runtime (/proc/<pid>/task/*/schedstat, ns): a VM's QEMU
    where libvirt leaves it in the root cpuacct group (cgroup v1 with cpu and cpuacct
    mounted apart, as here)."""
    def read() -> int:
        total = 0
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                pass
        return total
    return read


def _pct(vals: list[float], p: float) -> float:
    if not vals:
        return 0.0
    v = sorted(vals)
    return v[min(len(v) - 1, int(p / 100 * len(v)))]


def steal_ticks() -> int:
    return int(Path("/proc/stat").read_text().splitlines()[0].split()[8])


def cyclictest(cpu: int, seconds: float) -> subprocess.Popen:
    return subprocess.Popen(["cyclictest", "-q", "-D", f"{int(seconds)}", "-a", str(cpu), "-t", "1", "-i", "1000",
                             "-h", "20000", "-m", "--policy=other"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def cyclictest_result(p: subprocess.Popen) -> dict[str, float]:
    out, err = p.communicate()
    hist: list[tuple[int, int]] = []
    for line in out.splitlines():
        if line and line[0].isdigit():
            us, n = line.split()[:2]
            if int(n):
                hist.append((int(us), int(n)))
    total = sum(n for _, n in hist)
    if not total:
        raise RuntimeError(f"cyclictest gave no histogram: {err.strip()[:300]}")

    def q(p_: float) -> int:
        acc = 0
        for us, n in hist:
            acc += n
            if acc >= p_ * total:
                return us
        return hist[-1][0]
    return {"wake_p50_us": q(0.5), "wake_p99_us": q(0.99), "wake_p999_us": q(0.999), "wake_max_us": hist[-1][0],
            "wakeups": total}


def fio(cpu: int, dev: str, seconds: float, iops: int) -> subprocess.Popen:
    return subprocess.Popen(["fio", "--name=io", f"--filename={dev}", "--direct=1", "--rw=randread", "--bs=4k",
                             "--ioengine=psync", f"--rate_iops={iops}", f"--runtime={int(seconds)}", "--time_based",
                             f"--cpus_allowed={cpu}", "--output-format=json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def fio_result(p: subprocess.Popen) -> dict[str, float]:
    out, err = p.communicate()
    try:
        job = json.loads(out[out.index("{"):])["jobs"][0]["read"]
    except (ValueError, KeyError, IndexError):
        raise RuntimeError(f"fio failed: {err.strip()[:300]}") from None
    pct = job["clat_ns"]["percentile"]
    return {"io_p50_us": pct["50.000000"] / 1000, "io_p99_us": pct["99.000000"] / 1000,
            "io_p999_us": pct["99.900000"] / 1000, "io_max_us": job["clat_ns"]["max"] / 1000,
            "io_requests": job["total_ios"]}


def dirty_kib() -> int:
    """Dirty + Writeback in /proc/meminfo (KiB): the host's page cache still to be written."""
    kv = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    return int(kv["Dirty"].split()[0]) + int(kv["Writeback"].split()[0])


def disk_stat(path: Path) -> Path | None:
    """The block device stat file under ``path``'s filesystem (None on overlay/tmpfs)."""
    dev = os.stat(path).st_dev
    f = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat")
    return f if f.exists() else None


def sectors_written(stat: Path | None, field: int = 6) -> int:
    """Sectors written (field 6) or discarded (13) by a block device since boot."""
    return int(stat.read_text().split()[field]) if stat else 0


# ---------------------------------------------------------------- neighbours

@contextmanager
def v1_group(controller: str, name: str, **attrs: str):
    d = CG / controller / name
    d.mkdir(exist_ok=True)
    try:
        for k, v in attrs.items():
            (d / k).write_text(v)
        yield d
    finally:
        for _ in range(50):
            try:
                d.rmdir()
                break
            except OSError:
                time.sleep(0.1)


# The memory/IO neighbour on the host (stress-ng adds --temp-path, the shared filesystem),
# and its counterpart in the guest, started by the kernel as init's arguments ("--"):
# no double quotes inside (the kernel's quoting), the guest's /init in the background
# (devtmpfs first: a background job's stdin is /dev/null).
MEM_IO_STRESS = "--vm 2 --vm-bytes 1G --cache 2 --io 1 --hdd 2 --hdd-bytes 1G"
_GUEST_MEM_IO = ("mount -t devtmpfs dev /dev; /init & while [ ! -b /dev/vda ]; do sleep 0.1; done; "
                 "echo HYB-MEMIO-STARTED > /dev/console; "
                 + "(while :; do dd if=/dev/zero of=/dev/null bs=32M count=64 2>/dev/null; done) & " * 2
                 + "(while :; do dd if=/dev/zero of=/dev/vda bs=1M count=900 2>/dev/null; done) & "
                 "while :; do dd if=/dev/zero of=/dev/vda bs=1M seek=900 count=100 2>/dev/null; sync; done")
GUEST_MEM_IO_CMDLINE = f'console=ttyS0 panic=-1 rdinit=/bin/sh -- -c "{_GUEST_MEM_IO}"'


@contextmanager
def cgroup_neighbour(mode: str, stress: str, quota_cpus: int, vm_cpu: int, seconds: float):
    """``stress-ng <stress>`` in cpu (quota) + cpuacct groups, and a cpuset for "b2";
    yields (CpuMeter's usage file, the cpu group for its throttling counters)."""
    with ExitStack() as st:
        cpu = st.enter_context(v1_group("cpu", f"hyb-bench-{mode}", **{"cpu.cfs_period_us": str(PERIOD_US),
                                                                      "cpu.cfs_quota_us": str(quota_cpus * PERIOD_US)}))
        acct = st.enter_context(v1_group("cpuacct", f"hyb-bench-{mode}"))
        groups = [cpu, acct]
        if mode == "b2":
            mems = (CG / "cpuset/cpuset.mems").read_text().strip()
            groups.append(st.enter_context(v1_group("cpuset", f"hyb-bench-{mode}", **{"cpuset.mems": mems,
                                                                                      "cpuset.cpus": str(vm_cpu)})))
        join = "; ".join(f"echo $$ > {g}/tasks" for g in groups)
        every = set(range(os.cpu_count() or 1))  # the bench keeps itself off io_cpus; the neighbour may not
        p = subprocess.Popen(["sh", "-c", f"{join}; exec stress-ng {stress} --timeout {int(seconds) + 30}s --quiet"],
                             start_new_session=True, preexec_fn=lambda: os.sched_setaffinity(0, every))
        try:
            time.sleep(0.5)  # its workers are forked and burning
            yield cgroup_usage(acct), cpu
        finally:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            time.sleep(0.2)


@contextmanager
def vm_neighbour(work: Path, cmdline: str, marker: str, disk: bool = False):
    """A VM created through a real hostd (libvirtd + QEMU), its one vCPU pinned to the VM
    CPU, 256 MiB of 2 MiB pages, booting the smoke guest with ``cmdline`` (burning, or the
    memory/IO script), ready once ``marker`` is on its console. With ``disk``, its raw disk
    is a 1 GiB file written beforehand and opened with direct IO by the loop device (no
    host page cache, no block allocation), limited to its budget: 100 MiB/s, 5000 IOPS."""
    from tools.dev import procs  # the test suite's daemon helpers: one way to run hostd
    Hostd, grpc_stub, hostd_workdir, write_hostd_config = (procs.Hostd, procs.grpc_stub, procs.hostd_workdir,
                                                            procs.write_hostd_config)

    from api import hostd_pb2 as pb
    from hostd.apply.images import ImageStore

    pool = Path("/sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages")
    pages_before = pool.read_text().strip()
    state = work / "libvirtd"
    ctl = str(REPO / "tools/dev/libvirtd-ctl.sh")
    with ExitStack() as st:
        _hugetlbfs(st)
        pool.write_text(str(int(pages_before) + 256))
        st.callback(pool.write_text, pages_before)
        subprocess.run(["bash", ctl, "start", str(state)], check=True)
        st.callback(subprocess.run, ["bash", ctl, "stop", str(state)], check=False)
        smoke = Path("/var/cache/hybrid-kvm/smoke")
        subprocess.run(["bash", str(REPO / "guestimages/smoke/build.sh"), str(smoke)], check=True,
                       capture_output=True)
        loop = _loop(st, work / "vm-disk.img", size=1 << 30 if disk else 256 << 20, written=disk)
        certs = hostd_workdir(work, {"kernel": smoke / "vmlinuz", "initrd": smoke / "initrd.img"}, pages=256,
                              disk=Path(loop).name)
        ImageStore(work / "images").add("smoke-bench", "1", "kernel",
                                        {"kernel": smoke / "vmlinuz", "initrd": smoke / "initrd.img"},
                                        cmdline=cmdline)
        cfg = write_hostd_config(work / "hostd.toml", policy=work / "policy.toml", state=work / "state",
                                 images=work / "images", certs=certs, libvirt_uri="qemu:///system",
                                 io_health_interval_s=0)
        hostd = Hostd(cfg, dict(os.environ), work / "hostd.log").start()
        st.callback(hostd.stop)
        stub, ch = grpc_stub(hostd.port, certs)
        st.callback(ch.close)
        tune = pb.IoTune(total_bytes_sec=100 << 20, total_iops_sec=5000)  # the disk's whole budget (policy)
        disks = [pb.DiskRequest(disk=Path(loop).name, iotune=tune)] if disk else []
        vm = stub.CreateVM(pb.CreateVMRequest(request_id="bench-iso", name="hyb-bench-iso", vcpus=1, memory_mib=256,
                                              image="smoke-bench", disks=disks), timeout=120)
        st.callback(lambda: stub.DeleteVM(pb.DeleteVMRequest(vm_id=vm.vm_id), timeout=60))
        console = work / "state/vms/hyb-bench-iso/console.log"
        deadline = time.monotonic() + 180
        while not any(line.startswith(marker) for line in  # not the kernel's echo of its cmdline
                      (console.read_text(errors="replace") if console.exists() else "").splitlines()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {marker} from the guest:\n" + console.read_text(errors="replace")[-2000:])
            time.sleep(0.5)
        pid = int(Path("/run/libvirt/qemu/hyb-bench-iso.pid").read_text())
        time.sleep(1.0)
        yield process_usage(pid), None, list(vm.vcpu_pins), loop


def _hugetlbfs(st: ExitStack) -> Path:
    """A 2 MiB hugetlbfs mount, held until the end (tools/dev/hugetlbfs.py: shared with
    whatever else on this machine holds it)."""
    from tools.dev.hugetlbfs import held_2m
    return st.enter_context(held_2m())


def _loop(st: ExitStack, img: Path, size: int = 256 << 20, written: bool = False) -> str:
    """A loop device on ``img``: sparse, or ``written`` (real blocks) and opened with direct IO."""
    if written:
        _write_file(img, size)
    else:
        with open(img, "wb") as f:
            f.truncate(size)
    dev = subprocess.run(["losetup", "--find", "--show", *(["--direct-io=on"] if written else []), str(img)],
                         check=True, capture_output=True, text=True).stdout.strip()
    st.callback(subprocess.run, ["losetup", "-d", dev], check=False)
    return dev


def _write_file(path: Path, size: int) -> None:
    """``size`` bytes written for real (not sparse, not zeros) and fsynced."""
    block = os.urandom(1 << 20) * 8
    with open(path, "wb") as f:
        f.writelines(block for _ in range(size // len(block)))
        f.write(block[:size % len(block)])
        f.flush()
        os.fsync(f.fileno())


@contextmanager
def shared_ext4(work: Path, need: int):
    """A directory on an ext4 with ``need`` bytes free: ``work``'s own filesystem when it
    is ext4, else a loop-device ext4 made here (unmounted and detached at the end)."""
    fstype = subprocess.run(["findmnt", "-n", "-o", "FSTYPE", "-T", str(work)], check=True,
                            capture_output=True, text=True).stdout.strip()
    if fstype == "ext4":
        yield work
        return
    with ExitStack() as st:
        dev = _loop(st, work / "ext4.img", size=need + (512 << 20))
        subprocess.run(["mkfs.ext4", "-q", "-F", dev], check=True, capture_output=True)
        mnt = work / "ext4"
        mnt.mkdir()
        subprocess.run(["mount", dev, str(mnt)], check=True)
        st.callback(subprocess.run, ["umount", str(mnt)], check=False)
        yield mnt


# ---------------------------------------------------------------- one case

def throttle(cpu_group: Path | None) -> tuple[int, int]:
    if cpu_group is None:
        return 0, 0
    kv = dict(line.split() for line in (cpu_group / "cpu.stat").read_text().splitlines())
    return int(kv["nr_throttled"]), int(kv["throttled_time"])


def measure(io_cpu: int, target: str, seconds: float, iops: int, usage: Callable[[], int] | None = None,
            cpu_group: Path | None = None, disk: Path | None = None,
            during: Callable[[], dict[str, float]] | None = None) -> dict[str, float]:
    """The IO side for ``seconds``; with ``disk`` (a block stat file) also what that disk
    wrote and the host's peak dirty memory; ``during`` runs a fifth into the window."""
    steal0, thr0, w0, d0 = steal_ticks(), throttle(cpu_group), sectors_written(disk), sectors_written(disk, 13)
    end = time.monotonic() + seconds
    ct, fi = cyclictest(io_cpu, seconds), fio(io_cpu, target, seconds, iops)
    extra: dict[str, float] = {}
    with ExitStack() as st:
        meter = st.enter_context(CpuMeter(usage)) if usage else None
        dirty = st.enter_context(CpuMeter(dirty_kib, 0.1)) if disk else None
        if during:
            time.sleep(seconds / 5)
            extra = during()
        time.sleep(max(0.0, end - time.monotonic()))
    out = cyclictest_result(ct) | fio_result(fi) | extra
    thr1 = throttle(cpu_group)
    out |= {"steal_cpus": (steal_ticks() - steal0) / os.sysconf("SC_CLK_TCK") / seconds,
            "nr_throttled": thr1[0] - thr0[0], "throttled_ms": (thr1[1] - thr0[1]) / 1e6}
    if meter:
        out |= {f"cpu_{k}": v for k, v in meter.stats().items()}
    if dirty:
        out |= {"disk_write_mbs": (sectors_written(disk) - w0) * 512 / seconds / 1e6,
                "disk_discard_mib": (sectors_written(disk, 13) - d0) * 512 / 2**20,
                "dirty_max_mib": max((v for _, _, v in dirty.samples), default=0) / 1024}
    return out


def settle() -> None:
    """Between memory/IO cases: the last neighbour's dirty pages written, clean ones
    dropped, so each case starts from the same page cache."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("1")
    time.sleep(1.0)


def unlink_timed(path: Path) -> Callable[[], dict[str, float]]:
    def go() -> dict[str, float]:
        t0 = time.monotonic()
        path.unlink()
        return {"unlink_ms": (time.monotonic() - t0) * 1000}
    return go


VM_DELETE_NA = ("the smoke guest has no ext4 driver (a module in Debian's cloud kernel, not in its "
                "initramfs) and no mkfs, so it cannot hold a file on its raw disk")


def cpu_case(case: str, args: argparse.Namespace, work: Path, io_dev: str) -> dict[str, float]:
    secs, iops = args.seconds, args.iops
    if case == "a":
        return measure(args.io_cpu, io_dev, secs, iops)
    if case in ("b1", "b2"):
        with cgroup_neighbour(case, f"--cpu {args.threads}", args.vcpus, args.vm_cpu, secs) as (usage, grp):
            return measure(args.io_cpu, io_dev, secs, iops, usage, grp)
    (work / "vm").mkdir(exist_ok=True)
    with vm_neighbour(work / "vm", f"console=ttyS0 panic=-1 hyb.burn={args.threads}",
                      "HYB-BURN-STARTED") as (usage, grp, pins, _):
        return measure(args.io_cpu, io_dev, secs, iops, usage, grp) | {"vcpu_pins": pins}


def memio_case(case: str, args: argparse.Namespace, work: Path, data: Path) -> dict[str, float]:
    """The IO side reading ``data`` (on the shared filesystem) next to the memory/IO
    neighbour; (c) also gives what the guest wrote to its raw disk (its loop device)."""
    secs, iops, disk = args.seconds, args.iops, disk_stat(work)
    settle()
    if case == "a":
        return measure(args.io_cpu, str(data), secs, iops, disk=disk)
    if case in ("b1", "b2"):
        with cgroup_neighbour(case, f"{MEM_IO_STRESS} --temp-path {work}", args.vcpus, args.vm_cpu,
                              secs) as (usage, grp):
            return measure(args.io_cpu, str(data), secs, iops, usage, grp, disk)
    (work / "vm-memio").mkdir(exist_ok=True)
    with vm_neighbour(work / "vm-memio", GUEST_MEM_IO_CMDLINE, "HYB-MEMIO-STARTED",
                      disk=True) as (usage, grp, pins, vm_dev):
        vm_disk = Path(f"/sys/block/{Path(vm_dev).name}/stat")
        w0 = sectors_written(vm_disk)
        r = measure(args.io_cpu, str(data), secs, iops, usage, grp, disk)
        return r | {"vcpu_pins": pins, "vm_disk_write_mbs": (sectors_written(vm_disk) - w0) * 512 / secs / 1e6}


def delete_case(args: argparse.Namespace, shared: Path, data: Path, size: int) -> dict[str, float]:
    """A ``size``-byte file written for real on ``shared``, unlinked while the IO side reads ``data``."""
    big = shared / "big.bin"
    try:
        _write_file(big, size)
        settle()
        r = measure(args.io_cpu, str(data), args.seconds, args.iops, disk=disk_stat(shared),
                    during=unlink_timed(big))
        return r | {"file_gib": size / 2**30}
    finally:
        big.unlink(missing_ok=True)


def run(args: argparse.Namespace) -> dict[str, list[dict[str, float]]]:
    # The bench itself (its meter thread, and the hostd/libvirtd it starts) stays off the
    # IO CPU, as the carve keeps host daemons off it; cyclictest and fio pin themselves there.
    os.sched_setaffinity(0, set(os.sched_getaffinity(0)) - {args.io_cpu} or {args.vm_cpu})
    results: dict[str, list[dict[str, float]]] = {c: [] for c in args.cases}
    results |= {f"mem-{c}": [] for c in args.io_cases}
    with tempfile.TemporaryDirectory(prefix="hyb-iso-") as tmp, ExitStack() as st:
        work = Path(tmp)
        io_dev = _loop(st, work / "io-disk.img")
        with open(io_dev, "rb") as f:  # sparse reads: the request path, not the medium
            f.read(1 << 20)
        data = work / "io-data.bin"  # the memory/IO tables: real blocks on the shared filesystem
        if args.io_cases or args.delete_gib:
            _write_file(data, 256 << 20)
        big = int(min(args.delete_gib, shutil.disk_usage(work).free / 4 / 2**30) * 2**30)
        if big:
            shared = st.enter_context(shared_ext4(work, big + (256 << 20)))
            del_data = data if shared == work else shared / "io-data.bin"
            if shared != work:
                _write_file(del_data, 256 << 20)
            del_base = "mem-a" if del_data == data and "a" in args.io_cases else "del-a"
            results |= {del_base: results.get(del_base, []), "del-host": []}
        for rep in range(args.repeats):
            step = f"[{rep + 1}/{args.repeats}]"
            for case in args.cases:
                print(f"{step} {case} ...", file=sys.stderr, flush=True)
                results[case].append(cpu_case(case, args, work, io_dev))
            for case in args.io_cases:
                print(f"{step} memory/IO {case} ...", file=sys.stderr, flush=True)
                results[f"mem-{case}"].append(memio_case(case, args, work, data))
            if big:
                print(f"{step} delete {big / 2**30:.1f} GiB ...", file=sys.stderr, flush=True)
                if del_base == "del-a":
                    settle()
                    results["del-a"].append(measure(args.io_cpu, str(del_data), args.seconds, args.iops,
                                                    disk=disk_stat(shared)))
                results["del-host"].append(delete_case(args, shared, del_data, big))
        if big:
            results["del-vm"] = [{"not_available": VM_DELETE_NA}]  # type: ignore[dict-item]
            results["del-base"] = [{"case": del_base}]  # type: ignore[dict-item]
    return results


NAMES = {"a": "(a) baseline", "b1": "(b1) cgroup quota", "b2": "(b2) quota + cpuset", "c": "(c) carved VM"}


def report(results: dict[str, list[dict[str, float]]], args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    def med(case: str, key: str) -> float | None:
        vals = [r[key] for r in results.get(case, []) if key in r]
        return statistics.median(vals) if vals else None

    def spread(case: str, key: str) -> str:
        vals = [r[key] for r in results.get(case, []) if key in r]
        if not vals:
            return "-"
        m = statistics.median(vals)
        if key in ("steal_cpus", "file_gib"):
            return f"{m:.3f}" if key == "steal_cpus" else f"{m:.1f}"
        return f"{m:.0f}" if len(vals) == 1 else f"{m:.0f} [{min(vals):.0f}-{max(vals):.0f}]"

    def table(title: str, rows: list[tuple[str, str]], cols: list[tuple[str, str]], base: str,
              keys: tuple[str, ...]) -> None:
        t = Table(title=title)
        t.add_column("case")
        for name, _ in cols:
            t.add_column(name, justify="right")
        for key, label in rows:
            na = next((r["not_available"] for r in results.get(key, []) if "not_available" in r), None)
            cells = ["not available"] + ["-"] * (len(cols) - 1) if na else [spread(key, k) for _, k in cols]
            t.add_row(label, *cells)
        Console(width=max(200, shutil.get_terminal_size().columns)).print(t)
        for key, label in rows:
            for r in results.get(key, []):
                if "not_available" in r:
                    print(f"{label}: not available: {r['not_available']}")
        for k in keys:
            b = med(base, k)
            if b and len(rows) > 1:
                ratios = ", ".join(f"{c}/{base} = {med(c, k) / b:.2f}" for c, _ in rows if c != base and med(c, k))
                print(f"{k}: {ratios}")

    io_cols = [("wake p99 us", "wake_p99_us"), ("wake max us", "wake_max_us"), ("io p50 us", "io_p50_us"),
               ("io p99 us", "io_p99_us"), ("io p99.9 us", "io_p999_us")]
    head = f"{args.seconds:.0f} s x {args.repeats}, io_cpu {args.io_cpu}, quota/vCPUs {args.vcpus}"
    if args.cases:
        table(f"isolation, CPU neighbour ({args.threads} threads): {head}", [(c, NAMES[c]) for c in args.cases],
              [("neighbour CPU % max 10ms", "cpu_max_10ms"), ("p99 10ms", "cpu_p99_10ms"), ("max 1s", "cpu_max_1s"),
               *io_cols, ("throttled", "nr_throttled"), ("steal CPUs", "steal_cpus")], "a",
              ("wake_p99_us", "io_p99_us"))
    if args.io_cases:
        table(f"isolation, memory/IO neighbour (stress-ng {MEM_IO_STRESS}; in the VM dd): {head}",
              [(f"mem-{c}", NAMES[c]) for c in args.io_cases],
              [("neighbour CPU % p99 10ms", "cpu_p99_10ms"), ("max 1s", "cpu_max_1s"), *io_cols,
               ("io max us", "io_max_us"), ("disk MB/s written", "disk_write_mbs"),
               ("VM disk MB/s", "vm_disk_write_mbs"), ("dirty max MiB", "dirty_max_mib"),
               ("throttled", "nr_throttled"), ("steal CPUs", "steal_cpus")],
              "mem-a", ("wake_p99_us", "io_p50_us", "io_p99_us", "io_p999_us"))
    if "del-host" in results:
        base = results["del-base"][0]["case"]
        table(f"isolation, deleting a large file on the shared ext4: {head}",
              [(base, "(a) baseline"), ("del-host", "(d1) delete on the shared ext4"),
               ("del-vm", "(d2) delete in the VM, its raw disk")],
              [*io_cols, ("io max us", "io_max_us"), ("unlink ms", "unlink_ms"), ("file GiB", "file_gib"),
               ("disk MB/s written", "disk_write_mbs"), ("disk MiB discarded", "disk_discard_mib"),
               ("steal CPUs", "steal_cpus")], base,
              ("wake_p99_us", "io_p99_us", "io_p999_us", "io_max_us"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--vcpus", type=int, default=1, help="the VM's vCPUs = the cgroup's quota in CPUs")
    p.add_argument("--io-cpu", type=int, default=0)
    p.add_argument("--vm-cpu", type=int, default=max(os.sched_getaffinity(0)))
    p.add_argument("--iops", type=int, default=500, help="fio's request rate")
    p.add_argument("--cases", default="a,b1,b2,c", help="the CPU neighbour's cases")
    p.add_argument("--io-cases", help="the memory/IO neighbour's cases (default a,b1,b2,c; none with --short)")
    p.add_argument("--delete-gib", type=float, help="the file the delete scenario writes and unlinks (default 8, "
                   "at most a quarter of the free space; 0: no delete scenario, as with --short)")
    p.add_argument("--short", action="store_true", help="3 s, 1 repeat: the mechanism, not the latencies")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    args.cases = [c for c in args.cases.split(",") if c]
    io_cases = args.io_cases if args.io_cases is not None else "" if args.short else "a,b1,b2,c"
    args.io_cases = [c for c in io_cases.split(",") if c]
    if args.delete_gib is None:
        args.delete_gib = 0.0 if args.short else 8.0
    if any(c not in NAMES for c in args.cases + args.io_cases):
        p.error(f"cases are {','.join(NAMES)}")
    if args.short:
        args.seconds, args.repeats = 3.0, 1
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the cleanups run on kill <pid> too
    if os.geteuid() != 0:
        print("isolation: needs root (cgroups, loop devices, libvirtd)", file=sys.stderr)
        return 2
    results = run(args)
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        report(results, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
