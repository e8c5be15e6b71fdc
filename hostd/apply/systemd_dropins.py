"""New tasks systemd starts later (services, timers, logins) start off ``io_cpus``: the
exclusive carve's systemd drop-ins, on systemd hosts (``/run/systemd/system`` is a
directory: what ``sd_booted()`` tests) with cgroup v2.

A drop-in ``/etc/systemd/system/<slice>.d/50-hyb-exclusive.conf`` (``[Slice]`` /
``AllowedCPUs=`` every online CPU but ``io_cpus``) for ``system.slice`` and
``user.slice``. Unlike the rest of the carve, files in /etc outlive a reboot: only
uncarve takes them back. Each file's earlier content is recorded and put back byte for
byte (or the file removed, with the directories the carve made). On a live host (root
``/``) the step then runs ``systemctl daemon-reload``: drop-ins in /etc are read only at
a reload, and a reload re-applies the cgroup settings of running units, so the running
slices change at once. Not ``systemctl set-property``: it writes its own file under
``/etc/systemd/system.control`` (or ``/run`` with ``--runtime``) that outranks /etc and
has no "put back what was there" of its own. After the reload the step makes sure each
slice's ``cpuset.cpus`` holds the value (at uncarve: the old one), since systemd
versions differ on whether a reload rewrites the cpuset of a running unit
(systemd#43846). On a tree root nothing is run: the files are written, that is all.

Not restricted: ``machine.slice`` (VMs have their cpuset, ``vm_cpus``, already off
``io_cpus``); ``init.scope`` (PID 1 alone: what it starts goes straight into a unit
under a slice); slices an admin made at the top level. A slice that holds the IO service
itself (``io_service.unit``, which systemd runs in ``system.slice/<unit>``, or an
``io_service.cgroup`` under a slice) is skipped and reported: on cgroup v2 a child's CPUs
are cut to its parent's, so ``AllowedCPUs=`` on ``system.slice`` would take ``io_cpus``
from the IO service too. The only way around is a restart of the IO service in a slice
of its own (``Slice=``), which a live carve does not do. Instead the unit gets a drop-in
of its own, ``[Service]`` ``AllowedCPUs=<io_cpus>`` and ``AllowedMemoryNodes=`` (their
nodes): systemd owns a unit's cgroup attributes and rewrites them at every reload
(systemd#40438), so without it our own reload, or anyone's, would undo the carve's
``cpuset.cpus``/``cpuset.mems`` of the unit. A drop-in of someone else's that sets
``AllowedCPUs=`` after ours (drop-ins apply in file-name order across the unit
directories) wins: it is reported. cgroup v1 hosts get no drop-ins (systemd's
``AllowedCPUs=`` needs the unified hierarchy); there the ``hyb-host`` cpuset of
``exclusive.py`` does it, since every task PID 1 starts is born in it.
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
from hostd.apply.cgroups import CpusetFs
from hostd.apply.steps import Context, Step
from hostd.apply.sysfs import write_attr
from hostd.apply.unmovable import Unmovable
from hostd.cpulist import format_cpu_list
from hostd.discover.fs import HostFs
from hostd.discover.systemd import UNIT_SECTIONS, read_unit_file, systemd_booted, unit_dropins, unit_name
from hostd.errors import ApplyFailed

log = logging.getLogger(__name__)

DROPIN_NAME = "50-hyb-exclusive.conf"
SLICES = ("system.slice", "user.slice")


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


def plan_systemd_dropins(layout: Layout, host: HostFs, cpuset: CpusetFs, rest: list[int],
                         io_cgroup: str) -> tuple[list[Step], list[Unmovable]]:
    """The drop-ins step (none on cgroup v1 or without systemd), and what it cannot
    restrict. ``rest``: every online CPU but ``io_cpus``."""
    if cpuset.version != 2 or not systemd_booted(host):
        return [], []
    io_cpus = format_cpu_list(layout.io_cpus)
    want, unmovable = _wanted(layout, rest, io_cgroup)
    files: list[DropIn] = []
    for unit, section, settings in want:
        path = host.path("etc/systemd/system") / f"{unit}.d" / DROPIN_NAME
        after = f"# hostd exclusive carve (io_cpus {io_cpus}); `hostd uncarve` takes it back\n[{section}]\n{settings}"
        before = read_unit_file(host, path)
        if before != after:
            files.append(DropIn(str(path), before, after, _missing_dirs(host, path.parent)))
        later = [d for d in unit_dropins(host, unit) if d.name > DROPIN_NAME and "AllowedCPUs" in d.keys]
        if later:
            unmovable.append(Unmovable(unit, f"{later[-1].path} sets AllowedCPUs= after {DROPIN_NAME}, so it decides"))
    if not files:
        return [], unmovable
    slice_cpus = {}
    if host.live:
        slices = [unit for unit, _, _ in want if unit in SLICES]
        slice_cpus = {str(cpuset.path(sl) / "cpuset.cpus"): [host.text(cpuset.path(sl) / "cpuset.cpus",
                                                                       optional=True) or "", format_cpu_list(rest)]
                      for sl in slices}
    return [SystemdDropIns(files, ["systemctl", "daemon-reload"] if host.live else [], slice_cpus)], unmovable


def _wanted(layout: Layout, rest: list[int], io_cgroup: str) -> tuple[list[tuple[str, str, str]], list[Unmovable]]:
    """(unit, section, settings) of each drop-in, and the slices left alone (they hold
    the IO service)."""
    want: list[tuple[str, str, str]] = []
    unmovable: list[Unmovable] = []
    if layout.io_service.kind == "unit":
        # A reload writes both cpuset.cpus and cpuset.mems of the unit: both as the carve set them.
        io = set(layout.io_cpus)
        nodes = [n.node for n in layout.nodes if io & set(n.io_cpus + n.host_cpus + n.vm_cpus)]
        unit = unit_name(layout.io_service.name)
        want.append((unit, UNIT_SECTIONS[unit.rsplit(".", 1)[1]],
                     f"AllowedCPUs={format_cpu_list(layout.io_cpus)}\nAllowedMemoryNodes={format_cpu_list(nodes)}\n"))
    for sl in SLICES:
        if io_cgroup.strip("/").startswith(sl + "/"):
            unmovable.append(Unmovable(sl, f"holds the IO service ({io_cgroup.strip('/')}), so AllowedCPUs= there "
                                       "would take io_cpus from it too: what systemd starts there later may run on "
                                       "io_cpus (a Slice= of its own for the IO service closes this)"))
            continue
        want.append((sl, "Slice", f"AllowedCPUs={format_cpu_list(rest)}\n"))
    return want, unmovable


def _missing_dirs(host: HostFs, d: Path) -> list[str]:
    """The directories above a file that are not there yet, outermost first."""
    out: list[str] = []
    while not host.exists(d) and d != d.parent:
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
