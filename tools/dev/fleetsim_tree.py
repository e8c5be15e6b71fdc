"""The simulated storage host of ``fleetsim``: its generated host tree, and the one
animator that plays the kernel for every tree of a fleet.

A tree (``write_tree``) is small and true to a Linux 6.1 kernel where hostd reads it:
1 NUMA node, 8 CPUs without SMT, a SATA boot disk (written by ``tests/data/hosts/treegen.py``, like the
recorded shapes), cgroup v1 with cpuset mounted in ``/proc/mounts``, a 2 MiB hugepage pool
(empty: the carve fills it) and a 2 MiB hugetlbfs already mounted (a carve mounts
nothing), two IRQs with ``smp_affinity_list``, the unbound workqueue mask, and two
processes: the IO service (``ossd ... --tag hyb-sim-ossd``, two threads: the carve policy
names it with ``io_service.process``) and a host agent. Their PIDs are above the kernel's
PID_MAX_LIMIT (4194304), so no real process ever has them: a carve step that calls
``sched_setaffinity`` on one gets ESRCH, never a real task.

``Animator`` (one thread for the whole fleet) plays the kernel for each tree every
``tick_s``: per-CPU time in ``/proc/stat``, IRQ counts in ``/proc/interrupts`` (on the CPUs
each IRQ's ``smp_affinity_list`` allows), each thread's CPU time and last CPU in
``/proc/<pid>/task/<tid>/stat`` (a CPU its cpuset cgroup allows), PSI in
``/proc/pressure/cpu``, and cgroup membership: a PID written to a cpuset's ``cgroup.procs``
(the carve's move) shows in that cgroup's ``tasks`` and the process's ``/proc/<pid>/cgroup``,
and a pool size written to ``nr_hugepages`` is granted (free and global counts follow),
as the kernel would. Healthy hosts get plausible noise; a degraded one CPU pressure
(PSI some avg10 25-45 %), a foreign thread burning 0.9 CPU on an io_cpu, and a failing
probe. The same thread answers the fleet's TCP probes: one listening socket per host
(``io_probe = "tcp:127.0.0.1:PORT"``), closed while the host is degraded (connection
refused: a failed probe). Files hostd samples are replaced atomically (rename), so a
sample never reads half a file.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import random
import selectors
import shutil
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from hostd.cpulist import parse_cpu_list

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
HZ = os.sysconf("SC_CLK_TCK")
NCPU = 8
MEM_KB = 32 * 1024 * 1024
IO_TAG = "hyb-sim-ossd"  # the policy's io_service.process
IO_PID, AGENT_PID, NOISY_PID = 4194401, 4194410, 4194420  # > PID_MAX_LIMIT: never a real task
CPUSET = "sys/fs/cgroup/cpuset"
AHCI = "pci0000:00/0000:00:17.0"
POOL = "sys/devices/system/node/node0/hugepages/hugepages-2048kB"
IRQS = {"30": "IR-PCI-MSIX-0000:5e:00.0    1-edge      nvme0q1", "31": "IR-PCI-MSIX-0000:3b:00.0    0-edge      ens1f0-TxRx-0"}
IRQ_RATE = {"30": 900.0, "31": 300.0}  # per second
LOC_RATE = 250.0  # local timer interrupts per CPU per second
FLAGS = ("fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse "
         "sse2 ss ht syscall nx pdpe1gb rdtscp lm constant_tsc nopl xtopology nonstop_tsc cpuid pni "
         "pclmulqdq vmx ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt aes xsave avx f16c rdrand "
         "hypervisor lahf_lm abm 3dnowprefetch ept vpid fsgsbase bmi1 avx2 smep bmi2 erms invpcid "
         "avx512f avx512dq rdseed adx smap clflushopt clwb avx512cd avx512bw avx512vl xsaveopt")


def _treegen():
    """tests/data/hosts/treegen.py, the writer of the recorded host shapes (no bytecode
    left in the data directory)."""
    if "treegen" in sys.modules:
        return sys.modules["treegen"]
    spec = importlib.util.spec_from_file_location("treegen", REPO / "tests/data/hosts/treegen.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["treegen"] = mod  # dataclasses resolve their module by name
    saved, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.dont_write_bytecode = saved
    return mod


@dataclass(frozen=True)
class SimProc:
    pid: int
    comm: str
    cmdline: str
    tids: tuple[int, ...]
    cores: float  # CPU it uses, in cores (healthy)


PROCS = (SimProc(IO_PID, "ossd", f"/usr/bin/ossd --id 0 --tag {IO_TAG}", (IO_PID, IO_PID + 1), 0.25),
         SimProc(AGENT_PID, "node-agent", "/usr/sbin/node-agent --daemon", (AGENT_PID,), 0.04))
NOISY = SimProc(NOISY_PID, "scrub-backup", "/usr/bin/scrub-backup --all", (NOISY_PID,), 0.9)


def write_tree(root: Path, hostname: str) -> None:
    """A fresh host tree at ``root`` (replaced if it exists)."""
    tg = _treegen()
    desc = tg.HostDesc(
        name=root.name, hostname=hostname, kernel="6.1.0-18-amd64",
        cpu=tg.CpuDesc("GenuineIntel", "Intel(R) Xeon(R) Silver 4208 CPU @ 2.10GHz", 6, 85, FLAGS,
                       sockets=1, cores=tuple(range(NCPU)), threads=1),
        nodes=(tg.NodeDesc(MEM_KB, MEM_KB * 3 // 4, {2048: (0, 0, 0)}, (10,)),),
        sizes=(2048,), resv={}, hugepagesize_kb=2048, cgroup="v1",
        disks=(tg.DiskDesc("sda", "8:0", 937703088, f"{AHCI}/ata1/host0/target0:0:0/0:0:0:0",
                           model="INTEL SSDSC2KB48", wwid="naa.55cd2e414f1a2b3c", numa_node=0, pci=AHCI,
                           parts=(tg.PartDesc("sda1", "8:1", 937701040),)),),
        mounts=(tg.MountDesc("8:1", "/", "ext4", "/dev/sda1", "rw,relatime,errors=remount-ro"),
                tg.MountDesc("0:45", "/dev/hugepages", "hugetlbfs", "hugetlbfs", "rw,relatime,pagesize=2M")),
        probe={"kvm": {"present": True, "api_version": 12}, "libvirt_version": "9.0.0", "qemu_version": "7.2.0"})
    tg.write_host(desc, root.parent)
    t = tg.Tree(root)
    allcpus = f"0-{NCPU - 1}"
    t.write(f"{CPUSET}/cpuset.cpus", allcpus)
    t.write(f"{CPUSET}/cpuset.mems", "0")
    t.write(f"{CPUSET}/cgroup.procs", "\n".join(str(p.pid) for p in PROCS))
    t.write(f"{CPUSET}/tasks", "\n".join(str(tid) for p in PROCS for tid in p.tids))
    (root / "dev/hugepages").mkdir(parents=True, exist_ok=True)
    for irq in IRQS:
        t.write(f"proc/irq/{irq}/smp_affinity_list", allcpus)
    t.write("sys/devices/virtual/workqueue/cpumask", f"{(1 << NCPU) - 1:x}")
    for p in PROCS:
        write_proc(root, p, "/")


def cgroup_files(root: Path) -> None:
    """A cpuset cgroup made with mkdir gets its control files, empty, as the kernel
    gives them (cgroup v1: no CPUs, no memory nodes, no tasks until written); the
    animator does this every tick. A plain directory would lack them, and a carve
    replanned after a hostd killed between its mkdir and its first write would read a
    file no real host is without. Created exclusively: a value hostd wrote first is
    never replaced."""
    base = root / CPUSET
    for e in os.scandir(base):
        if not e.is_dir():
            continue
        for name in ("cpuset.cpus", "cpuset.mems", "cgroup.procs", "tasks"):
            try:
                with open(os.path.join(e.path, name), "x"):
                    pass
            except (FileExistsError, FileNotFoundError):
                pass  # there already, or the cgroup was removed meanwhile


def write_proc(root: Path, p: SimProc, cgroup: str) -> None:
    """A process's static files: cmdline, comm, stat (for its flags), status
    (Cpus_allowed_list, per thread too) and cgroup."""
    d = root / f"proc/{p.pid}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "cmdline").write_bytes(p.cmdline.replace(" ", "\0").encode() + b"\0")
    (d / "comm").write_text(p.comm + "\n")
    (d / "stat").write_text(stat_line(p.pid, p.comm, 0, 0))
    status = f"Name:\t{p.comm}\nTgid:\t{p.pid}\nCpus_allowed_list:\t0-{NCPU - 1}\n"
    (d / "status").write_text(status)
    write_cgroup(root, p.pid, cgroup)
    for tid in p.tids:
        (d / f"task/{tid}").mkdir(parents=True, exist_ok=True)
        (d / f"task/{tid}/stat").write_text(stat_line(tid, p.comm, 0, 0))
        (d / f"task/{tid}/status").write_text(status)


def write_cgroup(root: Path, pid: int, cpuset: str) -> None:
    (root / f"proc/{pid}/cgroup").write_text(f"5:cpuset:{cpuset}\n4:cpu,cpuacct:/\n3:memory:/\n2:hugetlb:/\n"
                                             "1:name=systemd:/\n")


def stat_line(tid: int, comm: str, cpu: int, ticks: int) -> str:
    """``/proc/<pid>/task/<tid>/stat``: 52 fields, utime at 14, the last CPU at 39."""
    f = ["S", "1", str(tid), str(tid), "0", "-1", str(0x400040), "0", "0", "0", "0", str(ticks), "0"] + \
        ["0"] * 23 + [str(cpu)] + ["0"] * 13
    return f"{tid} ({comm}) " + " ".join(f) + "\n"


def _put(path: str, text: str) -> None:
    """Replace a file in one rename: a reader sees the old or the new one, whole."""
    tmp = path + ".sim"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


# ------------------------------------------------------------------ the animator


@dataclass
class TreeState:
    """What the kernel of one simulated host knows between ticks."""

    root: Path
    io_cpus: tuple[int, ...]
    probe_port: int | None = None
    degraded: bool = False
    cpu: list[list[float]] = field(default_factory=lambda: [[0.0] * 3 for _ in range(NCPU)])  # user sys idle
    irqs: dict[str, list[float]] = field(default_factory=dict)
    ticks: dict[int, float] = field(default_factory=dict)  # tid -> CPU ticks
    psi_total_us: float = 0.0
    member: dict[int, str] = field(default_factory=dict)  # pid -> cpuset cgroup ("/", "/hyb-io")
    seen: dict[str, tuple[int, int]] = field(default_factory=dict)  # cgroup.procs -> (mtime, size)
    pool: str = "0"  # the 2 MiB pool's nr_hugepages the kernel last saw
    rng: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        self.irqs = {irq: [0.0] * NCPU for irq in [*IRQS, "LOC"]}
        self.member = {p.pid: "/" for p in PROCS}
        self.rng.seed(str(self.root))


class Animator:
    """One thread that advances every tree's counters every ``tick_s`` and answers the
    fleet's TCP probes. ``add`` and ``degrade`` may be called from any thread; sockets are
    registered and closed by the animator's own thread (a selector is not shared)."""

    def __init__(self, tick_s: float = 0.5):
        self.tick_s = tick_s
        self.trees: dict[str, TreeState] = {}
        self._lock = threading.Lock()
        self._sel = selectors.DefaultSelector()
        self._listeners: dict[str, socket.socket] = {}
        self._todo: list[tuple[str, socket.socket | None]] = []  # (host, socket to serve | None: close)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.busy_s = 0.0  # the thread's own CPU time, for the bench
        self.ticks = 0

    # ---------------------------------------------------------- control

    def add(self, name: str, root: Path, io_cpus: tuple[int, ...], probe: bool) -> TreeState:
        st = TreeState(root, tuple(io_cpus))
        if probe:
            s = _listener(0)
            st.probe_port = s.getsockname()[1]
        with self._lock:
            self.trees[name] = st
            self._advance(st, 0.0)  # hostd's first sample finds every file
            if probe:
                self._todo.append((name, s))
        return st

    def degrade(self, name: str, on: bool = True) -> None:
        """The host's IO signal goes bad (``on``) or healthy again."""
        with self._lock:
            st = self.trees[name]
            if st.degraded == on:
                return
            st.degraded = on
            if on:
                write_proc(st.root, NOISY, "/")
                st.member[NOISY.pid] = "/"
            else:
                st.member.pop(NOISY.pid, None)
                st.ticks.pop(NOISY.pid, None)
                shutil.rmtree(st.root / f"proc/{NOISY.pid}", ignore_errors=True)
            if st.probe_port is not None:
                self._todo.append((name, None if on else _listener(st.probe_port)))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fleetsim-animator", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)
        for s in [*self._listeners.values(), *(s for _, s in self._todo if s)]:
            s.close()
        self._listeners.clear()
        self._sel.close()

    # ---------------------------------------------------------- the probe stand-in

    def _serve_probes(self, timeout: float) -> None:
        with self._lock:
            todo, self._todo = self._todo, []
        for name, s in todo:
            old = self._listeners.pop(name, None)
            if old is not None:
                self._sel.unregister(old)
                old.close()
            if s is not None:
                self._sel.register(s, selectors.EVENT_READ)
                self._listeners[name] = s
        if not self._listeners:
            self._stop.wait(timeout)
            return
        for key, _ in self._sel.select(timeout):
            try:
                conn, _ = key.fileobj.accept()  # type: ignore[union-attr]
                conn.close()
            except OSError:
                pass

    # ---------------------------------------------------------- the kernel's part

    def _run(self) -> None:
        last = time.monotonic()
        next_tick = last + self.tick_s
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_tick:
                c0 = time.thread_time()
                with self._lock:
                    trees = list(self.trees.values())
                for st in trees:
                    try:
                        with self._lock:
                            self._advance(st, now - last)
                    except OSError as e:  # a tree being removed, a cgroup dir mid-rmdir
                        log.debug("animator %s: %s", st.root, e)
                    except Exception:
                        log.exception("animator %s", st.root)
                last, next_tick = now, max(next_tick + self.tick_s, now)
                self.ticks += 1
                self.busy_s += time.thread_time() - c0
            self._serve_probes(max(0.0, next_tick - time.monotonic()))

    def _advance(self, st: TreeState, dt: float) -> None:
        cgroup_files(st.root)
        self._membership(st)
        self._pool(st)
        rng, cpus_of = st.rng, self._cgroup_cpus(st)
        used = [0.0] * NCPU
        lines = {}
        procs = PROCS + ((NOISY,) if st.degraded else ())
        for p in procs:
            for tid in p.tids:
                cores = p.cores / len(p.tids) * rng.uniform(0.6, 1.4)
                if p is NOISY:
                    cpu = st.io_cpus[0]
                else:
                    allowed = cpus_of.get(st.member.get(p.pid, "/")) or list(range(NCPU))
                    cpu = rng.choice(allowed)
                    if p.pid == IO_PID and st.degraded:
                        cores *= 0.5  # starved by the neighbour
                st.ticks[tid] = st.ticks.get(tid, 0.0) + cores * dt * HZ
                used[cpu] += cores * dt * HZ
                lines[(p.pid, tid)] = stat_line(tid, p.comm, cpu, int(st.ticks[tid]))
        for c in range(NCPU):
            busy = min(dt * HZ, used[c] + rng.uniform(0.01, 0.04) * dt * HZ)  # softirq, kworkers
            st.cpu[c][0] += busy * 0.7
            st.cpu[c][1] += busy * 0.3
            st.cpu[c][2] += dt * HZ - busy
        for irq in IRQS:
            try:
                allowed = parse_cpu_list((st.root / f"proc/irq/{irq}/smp_affinity_list").read_text().strip())
            except (OSError, ValueError):
                allowed = frozenset(range(NCPU))
            per = IRQ_RATE[irq] * dt * rng.uniform(0.8, 1.2) / max(1, len(allowed))
            for c in allowed:
                st.irqs[irq][c] += per
        for c in range(NCPU):
            st.irqs["LOC"][c] += LOC_RATE * dt
        avg10 = rng.uniform(25, 45) if st.degraded else rng.uniform(0.0, 0.6)
        st.psi_total_us += avg10 / 100 * dt * 1e6
        self._write(st, lines, avg10)

    def _write(self, st: TreeState, lines: dict[tuple[int, int], str], avg10: float) -> None:
        r = str(st.root)
        total = [sum(int(c[i]) for c in st.cpu) for i in range(3)]
        rows = [f"cpu  {total[0]} 0 {total[1]} {total[2]} 0 0 0 0 0 0"]
        rows += [f"cpu{i} {int(c[0])} 0 {int(c[1])} {int(c[2])} 0 0 0 0 0 0" for i, c in enumerate(st.cpu)]
        _put(f"{r}/proc/stat", "\n".join(rows) + "\nintr 0\nctxt 0\nbtime 1700000000\n")
        hdr = " " * 11 + "".join(f"CPU{i:<8}" for i in range(NCPU))
        irq_rows = [f"{irq:>4}: " + " ".join(f"{int(n):10d}" for n in st.irqs[irq]) + f"  {IRQS[irq]}"
                    for irq in IRQS]
        irq_rows.append(" LOC: " + " ".join(f"{int(n):10d}" for n in st.irqs["LOC"]) + "   Local timer interrupts")
        _put(f"{r}/proc/interrupts", hdr + "\n" + "\n".join(irq_rows) + "\n")
        psi = (f"some avg10={avg10:.2f} avg60={avg10 * 0.8:.2f} avg300={avg10 * 0.5:.2f} "
               f"total={int(st.psi_total_us)}\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
        os.makedirs(f"{r}/proc/pressure", exist_ok=True)
        _put(f"{r}/proc/pressure/cpu", psi)
        for (pid, tid), line in lines.items():
            try:
                _put(f"{r}/proc/{pid}/task/{tid}/stat", line)
            except FileNotFoundError:
                pass  # the process is gone (healed while this tick ran)

    def _pool(self, st: TreeState) -> None:
        """A pool size written to the node's nr_hugepages is granted whole: free pages and
        the global pool follow (the test driver's guests take none)."""
        node = f"{st.root}/{POOL}"
        try:
            with open(f"{node}/nr_hugepages") as f:
                nr = f.read().strip()
        except OSError:
            return
        if nr == st.pool or not nr.isdigit():
            return
        st.pool = nr
        glob = f"{st.root}/sys/kernel/mm/hugepages/hugepages-2048kB"
        for path in (f"{node}/free_hugepages", f"{glob}/nr_hugepages", f"{glob}/free_hugepages"):
            _put(path, nr + "\n")

    def _cgroup_cpus(self, st: TreeState) -> dict[str, list[int]]:
        out = {}
        for cg in set(st.member.values()):
            try:
                out[cg] = sorted(parse_cpu_list((st.root / CPUSET / cg.strip("/") / "cpuset.cpus")
                                                .read_text().strip()))
            except (OSError, ValueError):
                pass
        return out

    def _membership(self, st: TreeState) -> None:
        """A PID written to a cgroup.procs moves there (the newest write wins); a process
        whose cgroup was removed is back in the root. Moves show in ``tasks`` and
        ``/proc/<pid>/cgroup``."""
        base = st.root / CPUSET
        dirs = [base] + [Path(e.path) for e in os.scandir(base) if e.is_dir()]
        changed = []
        for d in dirs:
            try:
                s = os.stat(d / "cgroup.procs")
            except OSError:
                continue
            key = (s.st_mtime_ns, s.st_size)
            if st.seen.get(str(d)) != key:
                st.seen[str(d)] = key
                changed.append((s.st_mtime_ns, d))
        before = dict(st.member)
        for _, d in sorted(changed, key=lambda x: x[0]):
            try:
                pids = [int(x) for x in (d / "cgroup.procs").read_text().split()]
            except (OSError, ValueError):
                continue
            for pid in pids:
                if pid in st.member:
                    st.member[pid] = "/" + str(d.relative_to(base)).strip(".")
        for pid, cg in st.member.items():
            if cg != "/" and not (base / cg.strip("/")).is_dir():
                st.member[pid] = "/"
        if st.member == before:
            return
        tids = {p.pid: p.tids for p in PROCS + (NOISY,)}
        for d in dirs:
            cg = "/" + str(d.relative_to(base)).strip(".")
            if d.is_dir():
                try:
                    (d / "tasks").write_text("".join(f"{t}\n" for pid, c in st.member.items() if c == cg
                                                     for t in tids[pid]))
                except OSError:
                    pass  # removed meanwhile
        for pid, cg in st.member.items():
            if before.get(pid) != cg and (st.root / f"proc/{pid}").is_dir():
                write_cgroup(st.root, pid, cg)


def _listener(port: int) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(128)
    s.setblocking(False)
    return s
