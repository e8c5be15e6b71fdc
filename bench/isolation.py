#!/usr/bin/env python3
"""The IO service next to a CPU-hungry neighbour, four ways, in one run (root):

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

    python3 bench/isolation.py                  # 10 s per case, 2 repeats
    python3 bench/isolation.py --seconds 30 --repeats 3 --threads 16
    python3 bench/isolation.py --short --json   # the mechanism only (make test runs it)

Ratios are against (a) measured in the same run; the machine's steal time is printed
(noise: a hypervisor's steal moves latencies more than anything here).
"""

from __future__ import annotations

import argparse
import json
import os
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
    sampled every 10 ms on a thread."""

    def __init__(self, usage: "Callable[[], int]", period_s: float = 0.01):
        self.read = usage
        self.period = period_s
        self.samples: list[tuple[float, int]] = []
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
            try:
                self.samples.append((time.monotonic(), self.read()))
            except (OSError, ValueError):
                pass
            time.sleep(self.period)

    def stats(self) -> dict[str, float]:
        """Max and p99 of the use over 10 ms and over 1 s windows, % of one CPU."""
        s = self.samples
        fine = [100 * (b[1] - a[1]) / ((b[0] - a[0]) * 1e9) for a, b in zip(s, s[1:]) if b[0] > a[0]]
        coarse, start = [], 0
        for i in range(1, len(s)):
            if s[i][0] - s[start][0] >= 1.0:
                coarse.append(100 * (s[i][1] - s[start][1]) / ((s[i][0] - s[start][0]) * 1e9))
                start = i
        return {"max_10ms": max(fine, default=0.0), "p99_10ms": _pct(fine, 99),
                "max_1s": max(coarse, default=0.0), "p99_1s": _pct(coarse, 99), "samples": len(fine)}


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
    return {"wake_p50_us": q(0.5), "wake_p99_us": q(0.99), "wake_max_us": hist[-1][0], "wakeups": total}


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
            "io_p999_us": pct["99.900000"] / 1000, "io_requests": job["total_ios"]}


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


@contextmanager
def cgroup_neighbour(mode: str, threads: int, quota_cpus: int, vm_cpu: int, seconds: float):
    """stress-ng --cpu N in cpu (quota) + cpuacct groups, and a cpuset for "b2"; yields
    (CpuMeter's usage file, the cpu group for its throttling counters)."""
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
        p = subprocess.Popen(["sh", "-c", f"{join}; exec stress-ng --cpu {threads} --timeout {int(seconds) + 30}s "
                              "--quiet"], start_new_session=True, preexec_fn=lambda: os.sched_setaffinity(0, every))
        try:
            time.sleep(0.5)  # its workers are forked and burning
            yield cgroup_usage(acct), cpu
        finally:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            time.sleep(0.2)


@contextmanager
def vm_neighbour(threads: int, seconds: float, work: Path):
    """A VM created through a real hostd (libvirtd + QEMU), its one vCPU pinned to the VM
    CPU, 256 MiB of 2 MiB pages, burning ``threads`` busy loops in the guest."""
    procs = _test_helpers("procs")  # the test suite's daemon helpers: one way to run hostd
    Hostd, grpc_stub, hostd_workdir, write_hostd_config = (procs.Hostd, procs.grpc_stub, procs.hostd_workdir,
                                                            procs.write_hostd_config)

    from api import hostd_pb2 as pb
    from hostd.apply.images import ImageStore

    pool = Path("/sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages")
    pages_before = pool.read_text().strip()
    state = work / "libvirtd"
    ctl = str(REPO / "tools/libvirtd-ctl.sh")
    with ExitStack() as st:
        _hugetlbfs(st)
        pool.write_text(str(int(pages_before) + 256))
        st.callback(pool.write_text, pages_before)
        subprocess.run(["bash", ctl, "start", str(state)], check=True)
        st.callback(subprocess.run, ["bash", ctl, "stop", str(state)], check=False)
        smoke = Path("/var/cache/hybrid-kvm/smoke")
        subprocess.run(["bash", str(REPO / "guestimages/smoke/build.sh"), str(smoke)], check=True,
                       capture_output=True)
        loop = _loop(st, work / "vm-disk.img")
        certs = hostd_workdir(work, {"kernel": smoke / "vmlinuz", "initrd": smoke / "initrd.img"}, pages=256,
                              disk=Path(loop).name)
        ImageStore(work / "images").add("smoke-burn", "1", "kernel",
                                        {"kernel": smoke / "vmlinuz", "initrd": smoke / "initrd.img"},
                                        cmdline=f"console=ttyS0 panic=-1 hyb.burn={threads}")
        cfg = write_hostd_config(work / "hostd.toml", policy=work / "policy.toml", state=work / "state",
                                 images=work / "images", certs=certs, libvirt_uri="qemu:///system",
                                 io_health_interval_s=0)
        hostd = Hostd(cfg, dict(os.environ), work / "hostd.log").start()
        st.callback(hostd.stop)
        stub, ch = grpc_stub(hostd.port, certs)
        st.callback(ch.close)
        vm = stub.CreateVM(pb.CreateVMRequest(request_id="bench-iso", name="hyb-bench-iso", vcpus=1, memory_mib=256,
                                              image="smoke-burn"), timeout=120)
        st.callback(lambda: stub.DeleteVM(pb.DeleteVMRequest(vm_id=vm.vm_id), timeout=60))
        console = work / "state/vms/hyb-bench-iso/console.log"
        deadline = time.monotonic() + 180
        while "HYB-BURN-STARTED" not in (console.read_text(errors="replace") if console.exists() else ""):
            if time.monotonic() > deadline:
                raise RuntimeError("the guest's burner did not start:\n" + console.read_text(errors="replace")[-2000:])
            time.sleep(0.5)
        pid = int(Path("/run/libvirt/qemu/hyb-bench-iso.pid").read_text())
        time.sleep(1.0)
        yield process_usage(pid), None, list(vm.vcpu_pins)


def _test_helpers(name: str):  # type: ignore[no-untyped-def]
    """A module of tests/ by file (not by sys.path: tests/hostd would shadow hostd)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"hyb_tests_{name}", REPO / "tests" / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _hugetlbfs(st: ExitStack) -> Path:
    """A 2 MiB hugetlbfs mount, made (and unmounted at the end) if the host has none."""
    for line in Path("/proc/mounts").read_text().splitlines():
        dev, mnt, fstype = line.split()[:3]
        if fstype == "hugetlbfs":
            return Path(mnt)
    mnt = Path("/dev/hugepages")
    mnt.mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "hugetlbfs", "-o", "pagesize=2M", "hugetlbfs", str(mnt)], check=True)
    st.callback(subprocess.run, ["umount", str(mnt)], check=False)
    return mnt


def _loop(st: ExitStack, img: Path) -> str:
    with open(img, "wb") as f:
        f.truncate(256 << 20)
    dev = subprocess.run(["losetup", "--find", "--show", str(img)], check=True, capture_output=True,
                         text=True).stdout.strip()
    st.callback(subprocess.run, ["losetup", "-d", dev], check=False)
    return dev


# ---------------------------------------------------------------- one case

def throttle(cpu_group: Path | None) -> tuple[int, int]:
    if cpu_group is None:
        return 0, 0
    kv = dict(line.split() for line in (cpu_group / "cpu.stat").read_text().splitlines())
    return int(kv["nr_throttled"]), int(kv["throttled_time"])


def measure(io_cpu: int, io_dev: str, seconds: float, iops: int, usage: Callable[[], int] | None,
            cpu_group: Path | None) -> dict[str, float]:
    steal0, thr0 = steal_ticks(), throttle(cpu_group)
    ct, fi = cyclictest(io_cpu, seconds), fio(io_cpu, io_dev, seconds, iops)
    meter = CpuMeter(usage) if usage else None
    if meter:
        with meter:
            time.sleep(seconds)
    out = cyclictest_result(ct) | fio_result(fi)
    thr1 = throttle(cpu_group)
    out |= {"steal_cpus": (steal_ticks() - steal0) / os.sysconf("SC_CLK_TCK") / seconds,
            "nr_throttled": thr1[0] - thr0[0], "throttled_ms": (thr1[1] - thr0[1]) / 1e6}
    if meter:
        out |= {f"cpu_{k}": v for k, v in meter.stats().items()}
    return out


def run(args: argparse.Namespace) -> dict[str, list[dict[str, float]]]:
    io_cpu, vm_cpu = args.io_cpu, args.vm_cpu
    # The bench itself (its meter thread, and the hostd/libvirtd it starts) stays off the
    # IO CPU, as the carve keeps host daemons off it; cyclictest and fio pin themselves there.
    os.sched_setaffinity(0, set(os.sched_getaffinity(0)) - {io_cpu} or {vm_cpu})
    results: dict[str, list[dict[str, float]]] = {c: [] for c in args.cases}
    with tempfile.TemporaryDirectory(prefix="hyb-iso-") as tmp, ExitStack() as st:
        work = Path(tmp)
        io_dev = _loop(st, work / "io-disk.img")
        with open(io_dev, "rb") as f:  # sparse reads: the request path, not the medium
            f.read(1 << 20)
        for rep in range(args.repeats):
            for case in args.cases:
                print(f"[{rep + 1}/{args.repeats}] {case} ...", file=sys.stderr, flush=True)
                if case == "a":
                    results[case].append(measure(io_cpu, io_dev, args.seconds, args.iops, None, None))
                elif case in ("b1", "b2"):
                    with cgroup_neighbour(case, args.threads, args.vcpus, vm_cpu, args.seconds) as (usage, grp):
                        results[case].append(measure(io_cpu, io_dev, args.seconds, args.iops, usage, grp))
                else:
                    (work / "vm").mkdir(exist_ok=True)
                    with vm_neighbour(args.threads, args.seconds, work / "vm") as (usage, grp, pins):
                        r = measure(io_cpu, io_dev, args.seconds, args.iops, usage, grp)
                        results[case].append(r | {"vcpu_pins": pins})
    return results


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
        return f"{m:.0f}" if len(vals) == 1 else f"{m:.0f} [{min(vals):.0f}-{max(vals):.0f}]"
    t = Table(title=f"isolation: io_cpu {args.io_cpu}, neighbour {args.threads} threads, quota/vCPUs "
                    f"{args.vcpus}, {args.seconds:.0f} s x {args.repeats}")
    cols = [("neighbour CPU % max 10ms", "cpu_max_10ms"), ("p99 10ms", "cpu_p99_10ms"),
            ("max 1s", "cpu_max_1s"), ("wake p99 us", "wake_p99_us"), ("wake max us", "wake_max_us"),
            ("io p50 us", "io_p50_us"), ("io p99 us", "io_p99_us"), ("io p99.9 us", "io_p999_us"),
            ("throttled", "nr_throttled"), ("steal CPUs", "steal_cpus")]
    t.add_column("case")
    for name, _ in cols:
        t.add_column(name, justify="right")
    names = {"a": "(a) baseline", "b1": "(b1) cgroup quota", "b2": "(b2) quota + cpuset", "c": "(c) carved VM"}
    for case in args.cases:
        t.add_row(names[case], *[spread(case, k) if k != "steal_cpus" else f"{med(case, k) or 0:.3f}"
                                 for _, k in cols])
    Console().print(t)
    for key in ("wake_p99_us", "io_p99_us"):
        base = med("a", key)
        if base:
            ratios = ", ".join(f"{c}/a = {med(c, key) / base:.2f}" for c in args.cases
                               if c != "a" and med(c, key))
            print(f"{key}: {ratios}")


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
    p.add_argument("--cases", default="a,b1,b2,c")
    p.add_argument("--short", action="store_true", help="3 s, 1 repeat: the mechanism, not the latencies")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    args.cases = [c for c in args.cases.split(",") if c]
    if args.short:
        args.seconds, args.repeats = 3.0, 1
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
