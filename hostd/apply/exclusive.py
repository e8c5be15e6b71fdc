"""Keep ``io_cpus`` the IO service's, live, without a reboot (``isolcpus`` and
``irqaffinity`` only take effect at the next boot).

At carve, in the same journal as the rest:
- **tasks**: on cgroup v1 every process in the root cpuset moves to a ``hyb-host`` cpuset
  that has every CPU but ``io_cpus`` (its children are born there, so new tasks stay off);
  each of its threads' CPU affinity is recorded first, and ``uncarve`` moves it back and
  restores those affinities exactly. On cgroup v2 the IO service's cgroup becomes a
  cpuset partition root (``cpuset.cpus.partition = root``): its CPUs leave every other
  cgroup's effective set. Kernel threads that may move (unbound ones) get an affinity
  without ``io_cpus``;
- **IRQs**: every ``/proc/irq/N/smp_affinity_list`` that includes an ``io_cpu`` is set to
  the same CPUs without it;
- **unbound workqueues**: ``/sys/devices/virtual/workqueue/cpumask`` without ``io_cpus``;
- **new tasks, on systemd hosts** (``<root>/run/systemd/system`` is a directory: what
  ``sd_booted()`` tests) **with cgroup v2**: a drop-in
  ``/etc/systemd/system/<slice>.d/50-hyb-exclusive.conf`` (``[Slice]`` /
  ``AllowedCPUs=`` every online CPU but ``io_cpus``) for ``system.slice`` and
  ``user.slice``, so what systemd starts later (services, timers, logins) starts off
  ``io_cpus``. Unlike the rest of this carve, files in /etc outlive a reboot: only
  uncarve takes them back. Each file's earlier content is recorded and put back byte
  for byte (or the file removed, with the directories the carve made). On a live host (root
  ``/``) the step then runs ``systemctl daemon-reload``: drop-ins in /etc are read only
  at a reload, and a reload re-applies the cgroup settings of running units, so the
  running slices change at once. Not ``systemctl set-property``: it writes its own file
  under ``/etc/systemd/system.control`` (or ``/run`` with ``--runtime``) that outranks
  /etc and has no "put back what was there" of its own. After the reload the step makes
  sure each slice's ``cpuset.cpus`` holds the value (at uncarve: the old one), since
  systemd versions differ on whether a reload rewrites the cpuset of a running unit
  (systemd#43846). On a tree root nothing is run: the files are written, that is all.

  Not restricted: ``machine.slice`` (VMs have their cpuset, ``vm_cpus``, already off
  ``io_cpus``); ``init.scope`` (PID 1 alone: what it starts goes straight into a unit
  under a slice); slices an admin made at the top level. A slice that holds the IO
  service itself (``io_service.unit``, which systemd runs in ``system.slice/<unit>``, or
  an ``io_service.cgroup`` under a slice) is skipped and reported: on cgroup v2 a
  child's CPUs are cut to its parent's, so ``AllowedCPUs=`` on ``system.slice`` would
  take ``io_cpus`` from the IO service too. The only way around is a restart of the IO
  service in a slice of its own (``Slice=``), which a live carve does not do. Instead
  the unit gets a drop-in of its own, ``[Service]`` ``AllowedCPUs=<io_cpus>`` and
  ``AllowedMemoryNodes=`` (their nodes): systemd owns a unit's cgroup attributes and
  rewrites them at every reload (systemd#40438), so without it our own reload, or
  anyone's, would undo the carve's ``cpuset.cpus``/``cpuset.mems`` of the unit. A drop-in of someone else's that sets ``AllowedCPUs=`` after ours (drop-ins
  apply in file-name order across the unit directories) wins: it is reported. cgroup v1
  hosts get no drop-ins (systemd's ``AllowedCPUs=`` needs the unified hierarchy); there
  the ``hyb-host`` cpuset does it, since every task PID 1 starts is born in it.

What the kernel does not let move (per-CPU kernel threads, managed IRQs, a write it
refuses) is never silently skipped: the step records why, ``hostd carve`` prints it,
and the IO-health signal shows what still runs there.
"""

from __future__ import annotations

import errno
import logging
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from api.layout import Layout
from hostd.apply.cgroups import CpusetFs, pid_cpuset_cgroup
from hostd.apply.steps import Context, MakeDir, Step, WriteAttr
from hostd.apply.sysfs import write_attr
from hostd.cpulist import format_cpu_list, parse_cpu_list
from hostd.errors import ApplyFailed
from hostd.health.readers import PF_KTHREAD, split_stat

log = logging.getLogger(__name__)

HOST_CGROUP = "hyb-host"
PF_NO_SETAFFINITY = 0x04000000
DROPIN_NAME = "50-hyb-exclusive.conf"
SLICES = ("system.slice", "user.slice")
# systemd's unit directories, highest priority first (systemd.unit(5)); a drop-in name
# in one of them hides the same name further down.
UNIT_DIRS = ("etc/systemd/system.control", "run/systemd/system.control", "run/systemd/transient",
             "run/systemd/generator.early", "etc/systemd/system", "etc/systemd/system.attached",
             "run/systemd/system", "run/systemd/system.attached", "run/systemd/generator",
             "usr/local/lib/systemd/system", "usr/lib/systemd/system", "lib/systemd/system",
             "run/systemd/generator.late")
UNIT_SECTIONS = {"service": "Service", "scope": "Scope", "slice": "Slice", "socket": "Socket",
                 "mount": "Mount", "swap": "Swap"}


@dataclass
class BestEffortAttr(Step):
    """Write an attribute the kernel may refuse (a managed IRQ, the workqueue mask): a
    refusal is recorded (``skipped``) and reported, not a failed carve. Undo writes the
    old value back where the write was taken."""

    kind: ClassVar[str] = "attr_best_effort"
    path: str
    before: str
    after: str
    what: str
    skipped: str = ""

    def apply(self, ctx: Context) -> None:
        try:
            write_attr(Path(self.path), self.after)
        except OSError as e:
            self.skipped = f"{self.what}: the kernel refused ({e.strerror or e})"
            log.warning("carve could not move %s", self.skipped)

    def undo(self, ctx: Context) -> None:
        if self.skipped:
            return
        write_attr(Path(self.path), self.before)

    def describe(self) -> str:
        tail = f" [cannot move: {self.skipped}]" if self.skipped else ""
        return f"set {self.what}: {self.before} -> {self.after}{tail}"


@dataclass
class MoveOff(Step):
    """Move a process to the host cpuset (off ``io_cpus``); undo moves it back and puts
    every thread's CPU affinity back as it was. A process that exits meanwhile is fine."""

    kind: ClassVar[str] = "move_off"
    pid: int
    comm: str
    before: str  # cgroup directory
    after: str
    affinity: dict[str, str] = field(default_factory=dict)  # tid -> CPU list before
    procs_file: str = "cgroup.procs"
    skipped: str = ""

    def apply(self, ctx: Context) -> None:
        try:
            write_attr(Path(self.after) / self.procs_file, self.pid)
        except OSError as e:
            if e.errno not in (errno.ESRCH, errno.EINVAL):
                raise
            self.skipped = f"pid {self.pid} ({self.comm}): {'exited' if e.errno == errno.ESRCH else 'refused'}"

    def undo(self, ctx: Context) -> None:
        if self.skipped:
            return
        try:
            write_attr(Path(self.before) / self.procs_file, self.pid)
        except OSError as e:
            if e.errno == errno.ESRCH:
                return  # gone
            raise
        for tid, cpus in self.affinity.items():
            try:
                os.sched_setaffinity(int(tid), parse_cpu_list(cpus))
            except (ProcessLookupError, OSError):
                pass  # the thread ended; the others still get theirs

    def describe(self) -> str:
        tail = f" [not moved: {self.skipped}]" if self.skipped else ""
        return f"move pid {self.pid} ({self.comm}) off io_cpus: {self.before} -> {self.after}{tail}"


@dataclass
class KthreadAffinity(Step):
    """An unbound kernel thread's CPU affinity without ``io_cpus``; undo restores it."""

    kind: ClassVar[str] = "kthread_affinity"
    pid: int
    comm: str
    before: str
    after: str
    skipped: str = ""

    def apply(self, ctx: Context) -> None:
        try:
            os.sched_setaffinity(self.pid, parse_cpu_list(self.after))
        except (ProcessLookupError, OSError) as e:
            self.skipped = f"kernel thread {self.pid} ({self.comm}): {getattr(e, 'strerror', None) or e}"

    def undo(self, ctx: Context) -> None:
        if self.skipped:
            return
        try:
            os.sched_setaffinity(self.pid, parse_cpu_list(self.before))
        except (ProcessLookupError, OSError):
            pass

    def describe(self) -> str:
        tail = f" [cannot move: {self.skipped}]" if self.skipped else ""
        return f"kernel thread {self.pid} ({self.comm}) affinity {self.before} -> {self.after}{tail}"


@dataclass
class DropIn:
    """One systemd drop-in file: what it holds after the carve, what it held before
    (``None``: there was no file; text decoded with ``surrogateescape``, so any bytes
    survive the JSON journal), and the directories the carve makes for it, outermost first."""

    path: str
    before: str | None
    after: str
    made_dirs: list[str] = field(default_factory=list)

    def write(self) -> None:
        p = Path(self.path)
        for d in self.made_dirs:
            os.makedirs(d, exist_ok=True)
        _replace(p, self.after)

    def restore(self) -> None:
        p = Path(self.path)
        if self.before is None:
            p.unlink(missing_ok=True)
        else:
            _replace(p, self.before)
        for d in reversed(self.made_dirs):
            try:
                os.rmdir(d)
            except OSError as e:
                # ENOTEMPTY: another drop-in is still there; the step that wrote it (or
                # the admin) owns it, and that step's undo removes the directory.
                if e.errno not in (errno.ENOENT, errno.ENOTEMPTY, errno.EEXIST):
                    raise


@dataclass
class SystemdDropIns(Step):
    """The drop-ins that keep tasks systemd starts later off ``io_cpus`` (the module
    docstring says which and why), then ``reload`` (``systemctl daemon-reload`` on a live
    host, nothing on a tree). Undo puts every file back and reloads again. One step for
    all files, so systemd reloads once and never sees half of them. ``slice_cpus``: each
    slice's ``cpuset.cpus`` -> [before, after], checked after a live reload."""

    kind: ClassVar[str] = "systemd_dropins"
    files: list[DropIn]
    reload: list[str] = field(default_factory=list)
    slice_cpus: dict[str, list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.files = [f if isinstance(f, DropIn) else DropIn(**f) for f in self.files]  # from the journal

    def apply(self, ctx: Context) -> None:
        for f in self.files:
            f.write()
        if self.reload:
            _run(self.reload)
            self._settle(1)

    def undo(self, ctx: Context) -> None:
        for f in reversed(self.files):
            f.restore()
        if self.reload:
            _run(self.reload)
            self._settle(0)

    def _settle(self, which: int) -> None:
        for path, values in self.slice_cpus.items():
            p = Path(path)
            if p.exists() and p.read_text().strip() != values[which]:
                log.info("systemd left %s at %s: writing %r", path, p.read_text().strip(), values[which])
                write_attr(p, values[which] or "\n")  # an empty write never reaches the kernel

    def describe(self) -> str:
        parts = []
        for f in self.files:
            setting = " ".join(line for line in f.after.splitlines()[2:])
            was = "new file" if f.before is None else "replaces the file there; uncarve puts it back"
            parts.append(f"write {f.path}: {setting} ({was})")
        if self.reload:
            parts.append(f"then {' '.join(self.reload)}")
        return "; ".join(parts)


@dataclass(frozen=True)
class Unmovable:
    what: str
    why: str

    def __str__(self) -> str:
        return f"{self.what}: {self.why}"


EXCLUSIVE_STEPS: tuple[type[Step], ...] = (BestEffortAttr, MoveOff, KthreadAffinity, SystemdDropIns)  # journal kinds


def plan_exclusive(layout: Layout, root: Path, fs: CpusetFs, *, exclude_pids: frozenset[int],
                   io_cgroup: str) -> tuple[list[Step], list[Unmovable]]:
    """The steps that take ``io_cpus`` from everything but the IO service, and what
    cannot be taken (with the reason), from the host under ``root``."""
    io = set(layout.io_cpus)
    if not io:
        return [], []
    online = _online(root)
    rest = sorted(online - io)
    if not rest:
        return [], [Unmovable("host", "io_cpus are every online CPU: nowhere to move the rest to")]
    steps: list[Step] = []
    unmovable: list[Unmovable] = []
    procs = _processes(root)  # one scan of /proc for the tasks and the kernel threads
    if fs.version == 1:
        s, u = _v1_tasks(root, fs, rest, exclude_pids, procs)
    else:
        s, u = _v2_partition(fs, io_cgroup)
    steps += s
    unmovable += u
    s, u = _kthreads(root, io, rest, procs)
    steps += s
    unmovable += u
    steps += _irqs(root, io, rest)
    steps += _workqueue(root, io, online)
    s, u = _systemd_dropins(layout, root, fs, rest, io_cgroup)
    steps += s
    unmovable += u
    return steps, unmovable


def _online(root: Path) -> set[int]:
    try:
        return set(parse_cpu_list((root / "sys/devices/system/cpu/online").read_text().strip()))
    except (OSError, ValueError):
        return set(os.sched_getaffinity(0))


def _v1_tasks(root: Path, fs: CpusetFs, rest: list[int], exclude: frozenset[int],
              procs: list[tuple[int, str, int]]) -> tuple[list[Step], list[Unmovable]]:
    host = fs.path(HOST_CGROUP)
    steps: list[Step] = []
    if not host.is_dir():
        steps.append(MakeDir(str(host)))
        cur_cpus = cur_mems = ""
    else:
        cur_cpus = (host / fs.cpus_file).read_text().strip()
        cur_mems = (host / fs.mems_file).read_text().strip()
    mems = (fs.mount / fs.mems_file).read_text().strip()
    if cur_mems != mems:
        steps.append(WriteAttr(str(host / fs.mems_file), cur_mems, mems))
    want = format_cpu_list(rest)
    if cur_cpus != want:
        steps.append(WriteAttr(str(host / fs.cpus_file), cur_cpus, want))
    for pid, comm, flags in procs:
        if pid in exclude or flags & PF_KTHREAD:
            continue
        try:
            where = pid_cpuset_cgroup(root, pid, 1)
        except (LookupError, OSError):
            continue
        if where != "/":  # the IO service (hyb-io), VMs (machine), or a cpuset someone chose
            continue
        steps.append(MoveOff(pid=pid, comm=comm, before=str(fs.mount), after=str(host),
                             affinity=_affinities(root, pid), procs_file=fs.procs_file))
    return steps, []


def _v2_partition(fs: CpusetFs, io_cgroup: str) -> tuple[list[Step], list[Unmovable]]:
    attr = fs.path(io_cgroup) / "cpuset.cpus.partition"
    if not attr.exists():
        return [], [Unmovable("cgroup v2", f"{attr} is missing: this kernel has no cpuset partitions")]
    cur = (attr.read_text().split() or ["member"])[0]
    if cur == "root":
        return [], []
    return [BestEffortAttr(str(attr), cur, "root", f"cpuset partition of {io_cgroup}")], []


def _kthreads(root: Path, io: set[int], rest: list[int],
              procs: list[tuple[int, str, int]]) -> tuple[list[Step], list[Unmovable]]:
    steps: list[Step] = []
    unmovable: list[Unmovable] = []
    per_cpu = 0
    for pid, comm, flags in procs:
        if not flags & PF_KTHREAD:
            continue
        cpus = _cpus_allowed(root / f"proc/{pid}/status")
        if cpus is None or not (set(cpus) & io):
            continue
        if flags & PF_NO_SETAFFINITY:
            per_cpu += 1
            continue
        keep = sorted(set(cpus) - io) or rest
        steps.append(KthreadAffinity(pid, comm, format_cpu_list(cpus), format_cpu_list(keep)))
    if per_cpu:
        unmovable.append(Unmovable(f"{per_cpu} per-CPU kernel threads", "bound to their CPU by the kernel "
                                   "(ksoftirqd, kworker/N, migration, ...); isolcpus at boot quiets them"))
    return steps, unmovable


def _irqs(root: Path, io: set[int], rest: list[int]) -> list[Step]:
    steps: list[Step] = []
    base = root / "proc/irq"
    try:
        irqs = sorted((d for d in os.listdir(base) if d.isdigit()), key=int)
    except OSError:
        return steps
    for irq in irqs:
        attr = base / irq / "smp_affinity_list"
        try:
            cur = parse_cpu_list(attr.read_text().strip())
        except (OSError, ValueError):
            continue
        if not set(cur) & io:
            continue
        keep = sorted(set(cur) - io) or rest
        steps.append(BestEffortAttr(str(attr), format_cpu_list(cur), format_cpu_list(keep), f"IRQ {irq}"))
    return steps


def _workqueue(root: Path, io: set[int], online: set[int]) -> list[Step]:
    attr = root / "sys/devices/virtual/workqueue/cpumask"
    try:
        cur = attr.read_text().strip()
        mask = int(cur.replace(",", ""), 16)
    except (OSError, ValueError):
        return []
    want = mask & ~sum(1 << c for c in io)
    if want == mask:
        return []
    if want == 0:
        want = sum(1 << c for c in online - io)
    return [BestEffortAttr(str(attr), cur, f"{want:x}", "unbound workqueue cpumask")]


def systemd_booted(root: Path) -> bool:
    """``sd_booted()``'s own test: systemd runs as PID 1 on the host under ``root``."""
    return (root / "run/systemd/system").is_dir()


def _systemd_dropins(layout: Layout, root: Path, fs: CpusetFs, rest: list[int],
                     io_cgroup: str) -> tuple[list[Step], list[Unmovable]]:
    if fs.version != 2 or not systemd_booted(root):
        return [], []
    io_cpus = format_cpu_list(layout.io_cpus)
    want: list[tuple[str, str, str]] = []  # unit, section, settings
    unmovable: list[Unmovable] = []
    if layout.io_service.kind == "unit":
        # A reload writes both cpuset.cpus and cpuset.mems of the unit: both as the carve set them.
        io = set(layout.io_cpus)
        nodes = [n.node for n in layout.nodes if io & set(n.io_cpus + n.host_cpus + n.vm_cpus)]
        unit = _unit_name(layout.io_service.name)
        want.append((unit, UNIT_SECTIONS[unit.rsplit(".", 1)[1]],
                     f"AllowedCPUs={io_cpus}\nAllowedMemoryNodes={format_cpu_list(nodes)}\n"))
    slices = []
    for sl in SLICES:
        if io_cgroup.strip("/").startswith(sl + "/"):
            unmovable.append(Unmovable(sl, f"holds the IO service ({io_cgroup.strip('/')}), so AllowedCPUs= there "
                                       "would take io_cpus from it too: what systemd starts there later may run on "
                                       "io_cpus (a Slice= of its own for the IO service closes this)"))
            continue
        slices.append(sl)
        want.append((sl, "Slice", f"AllowedCPUs={format_cpu_list(rest)}\n"))
    files: list[DropIn] = []
    for unit, section, settings in want:
        path = root / "etc/systemd/system" / f"{unit}.d" / DROPIN_NAME
        after = f"# hostd exclusive carve (io_cpus {io_cpus}); `hostd uncarve` takes it back\n[{section}]\n{settings}"
        before = _read_text(path)
        if before != after:
            files.append(DropIn(str(path), before, after, _missing_dirs(path.parent)))
        later = _later_allowed_cpus(root, unit)
        if later is not None:
            unmovable.append(Unmovable(unit, f"{later} sets AllowedCPUs= after {DROPIN_NAME}, so it decides"))
    if not files:
        return [], unmovable
    live = root.resolve() == Path("/")
    slice_cpus = {str(fs.path(sl) / "cpuset.cpus"): [_read_text(fs.path(sl) / "cpuset.cpus", "").strip(),
                                                    format_cpu_list(rest)] for sl in slices} if live else {}
    return [SystemdDropIns(files, ["systemctl", "daemon-reload"] if live else [], slice_cpus)], unmovable


def _unit_name(name: str) -> str:
    """A unit's full name: systemctl takes ``osd`` for ``osd.service``."""
    return name if name.rsplit(".", 1)[-1] in UNIT_SECTIONS else f"{name}.service"


def _later_allowed_cpus(root: Path, unit: str) -> Path | None:
    """The last drop-in of ``unit`` that sets AllowedCPUs= after ours, if any: systemd
    reads a unit's drop-ins in file-name order, whichever directory each is in."""
    found: dict[str, Path] = {}
    for d in UNIT_DIRS:
        try:
            names = os.listdir(root / d / f"{unit}.d")
        except OSError:
            continue
        for n in names:
            if n.endswith(".conf"):
                found.setdefault(n, root / d / f"{unit}.d" / n)
    last = None
    for n in sorted(found):
        text = _read_text(found[n], "") if n > DROPIN_NAME else ""
        if any(line.strip().startswith("AllowedCPUs=") for line in text.splitlines()):
            last = found[n]
    return last


def _read_text(path: Path, missing: str | None = None) -> str | None:
    try:
        return path.read_bytes().decode("utf-8", "surrogateescape")
    except FileNotFoundError:
        return missing


def _missing_dirs(d: Path) -> list[str]:
    out: list[str] = []
    while not d.exists() and d != d.parent:
        out.append(str(d))
        d = d.parent
    return out[::-1]


def _replace(path: Path, text: str) -> None:
    """Write a config file whole (a reader never sees half of it), keeping its mode."""
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o644
    tmp = path.with_name(f".{path.name}.hyb-tmp")
    with open(tmp, "wb") as f:
        f.write(text.encode("utf-8", "surrogateescape"))
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _run(cmd: list[str]) -> None:
    r = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if r.returncode != 0:
        raise ApplyFailed(f"{' '.join(cmd)} failed: {r.stderr.strip()}", field=cmd[0])


def _processes(root: Path) -> list[tuple[int, str, int]]:
    """(pid, comm, flags) of every process, from /proc/<pid>/stat."""
    out = []
    for d in os.listdir(root / "proc"):
        if not d.isdigit():
            continue
        try:
            parts = split_stat((root / f"proc/{d}/stat").read_text())
            if parts is not None:
                out.append((int(d), parts[1], int(parts[2][6])))
        except (OSError, ValueError, IndexError):
            continue
    return sorted(out)


def _cpus_allowed(status: Path) -> list[int] | None:
    """Cpus_allowed_list of a /proc status file (what sched_getaffinity says, for any root)."""
    try:
        for line in status.read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                return sorted(parse_cpu_list(line.split(":", 1)[1].strip()))
    except (OSError, ValueError):
        return None
    return None


def _affinities(root: Path, pid: int) -> dict[str, str]:
    """Each thread's CPU affinity, to put back at uncarve."""
    out: dict[str, str] = {}
    try:
        tids = os.listdir(root / f"proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        cpus = _cpus_allowed(root / f"proc/{pid}/task/{tid}/status")
        if cpus is not None:
            out[tid] = format_cpu_list(cpus)
    return out
