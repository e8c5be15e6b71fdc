"""Which VM and vCPU a thread belongs to, from /proc (QEMU's `-name guest=NAME`, `CPU N/KVM`).

Every reader takes the proc root so tests can hand it a recorded tree.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from tools.kvm_utils.aggregate import ThreadInfo
from tools.kvm_utils.sources.tracetext import vcpu_of_task

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VmProcess:
    pid: int
    name: str
    vcpu_tids: dict[int, int]   # tid -> vcpu index


def guest_name(argv: list[str]) -> str | None:
    """The VM name from a QEMU argv: `-name guest=NAME,debug-threads=on` (libvirt) or `-name NAME`.

    QEMU escapes a literal comma in an option value as `,,`.
    """
    for i, arg in enumerate(argv[:-1]):
        if arg in ("-name", "--name"):
            value = argv[i + 1].replace(",,", "\0")
            parts = value.split(",")
            for part in parts:
                if part.startswith("guest="):
                    return part[len("guest="):].replace("\0", ",")
            if "=" not in parts[0]:
                return parts[0].replace("\0", ",")
    return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:        # the process or thread went away: not an error
        return None


def vm_processes(proc: Path = Path("/proc")) -> list[VmProcess]:
    """Processes that run vCPU threads (QEMU or any KVM API user), with their vCPU threads."""
    found = []
    for pdir in proc.iterdir():
        if not pdir.name.isdigit():
            continue
        tids: dict[int, int] = {}
        try:
            tasks = list((pdir / "task").iterdir())
        except OSError:
            continue
        for tdir in tasks:
            comm = _read(tdir / "comm")
            vcpu = vcpu_of_task(comm.strip()) if comm else None
            if vcpu is not None:
                tids[int(tdir.name)] = vcpu
        if not tids:
            continue
        raw = _read(pdir / "cmdline") or ""
        argv = [a for a in raw.split("\0") if a]
        name = guest_name(argv) or f"pid{pdir.name}"
        found.append(VmProcess(int(pdir.name), name, tids))
    return found


def thread_map(procs: list[VmProcess]) -> dict[int, ThreadInfo]:
    return {tid: ThreadInfo(vcpu, p.name) for p in procs for tid, vcpu in p.vcpu_tids.items()}


def vm_of_pid(proc: Path, pid: int) -> str | None:
    raw = _read(proc / str(pid) / "cmdline")
    return guest_name([a for a in raw.split("\0") if a]) if raw else None


def tgid_of(proc: Path, tid: int) -> int | None:
    """The process a live thread belongs to, None if the thread is gone."""
    status = _read(proc / str(tid) / "status")
    if status is None:
        return None
    return next((int(ln.split()[1]) for ln in status.splitlines() if ln.startswith("Tgid:")), tid)


def thread_info(proc: Path, tid: int) -> ThreadInfo | None:
    """(vCPU, VM) of one live thread, None if it is gone or is not a vCPU thread."""
    comm = _read(proc / str(tid) / "comm")
    tgid = tgid_of(proc, tid)
    if comm is None or tgid is None:
        return None
    vcpu = vcpu_of_task(comm.strip())
    if vcpu is None:
        return None
    return ThreadInfo(vcpu, vm_of_pid(proc, tgid) or f"pid{tgid}")
