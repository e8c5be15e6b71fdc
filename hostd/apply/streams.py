"""A cancelled migration whose link is dead: closing QEMU's connections to the target.

A migration cancelled while the link to the target drops every packet (a failed switch,
a target that lost power) does not end: the NBD mirror's cancel waits for the requests
in flight on a socket that TCP keeps retrying. Measured on the libvirt pair: cancelled
at 20 s, the job ended 5 min 20 s later, and only because the link came back. The kernel
closes a TCP socket from outside (SOCK_DESTROY, what ``ss -K`` sends; kernels with
``CONFIG_INET_DIAG_DESTROY``): the blocked send fails at once, QEMU's mirror and
migration fail, libvirt ends the job and the VM runs on here.

Only this VM's QEMU's own connections to the target's addresses are closed, each by its
four-tuple, inside the QEMU's network namespace (``nsenter --net``): the processes are
found by the domain's UUID on their command lines, their sockets by the inodes of their
descriptors. More than one QEMU can carry the UUID on one machine (two libvirtd "hosts"
side by side, the target's incoming copy beside the source): the target's address is
what tells them apart, so without one nothing is closed.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

PROC = Path("/proc")
# `ss -tnHe state connected`: [state] recv-q send-q local:port peer:port ... ino:N ...
_SS_LINE = re.compile(r"^\s*(?:[A-Z][A-Z0-9-]*\s+)?\d+\s+\d+\s+(\S+):(\d+)\s+(\S+):(\d+)\s.*?\bino:(\d+)")


@dataclass(frozen=True)
class Conn:
    src: str
    sport: int
    dst: str
    dport: int
    inode: int

    def __str__(self) -> str:
        return f"{self.src}:{self.sport}->{self.dst}:{self.dport}"


def qemu_processes(proc: Path = PROC) -> dict[int, list[bytes]]:
    """PID -> command line of every QEMU system emulator on this machine."""
    out = {}
    for p in proc.iterdir():
        if not p.name.isdigit():
            continue
        try:
            argv = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and b"qemu-system" in argv[0]:
            out[int(p.name)] = argv
    return out


def qemu_pids(vm_uuid: str, proc: Path = PROC) -> list[int]:
    """The QEMUs running the domain ``vm_uuid`` (libvirt passes ``-uuid <uuid>``), in PID
    order: one on a host, two where a migration's source and target share a machine."""
    want = vm_uuid.lower().encode()
    return sorted(pid for pid, argv in qemu_processes(proc).items()
                  if any(a == b"-uuid" and i + 1 < len(argv) and argv[i + 1].lower() == want
                         for i, a in enumerate(argv)))


def socket_inodes(pid: int, proc: Path = PROC) -> set[int]:
    out = set()
    for fd in (proc / str(pid) / "fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(int(target[8:-1]))
    return out


def parse_ss(text: str) -> list[Conn]:
    conns = []
    for line in text.splitlines():
        m = _SS_LINE.match(line)
        if m:
            conns.append(Conn(m[1].strip("[]"), int(m[2]), m[3].strip("[]"), int(m[4]), int(m[5])))
    return conns


def close_streams(pid: int, dsts: set[str]) -> list[Conn]:
    """Closes process ``pid``'s TCP connections, established or connecting, to the
    addresses ``dsts``; returns those it asked the kernel to close."""
    if not dsts:
        raise ValueError("no target address: which connections to close is unknown")
    ns = ["nsenter", f"--net=/proc/{pid}/ns/net"]
    inodes = socket_inodes(pid)
    # connected: established, and those still connecting (a link dead before the stream
    # began leaves QEMU's connect retrying its SYN)
    r = subprocess.run([*ns, "ss", "-tnHe", "state", "connected"], capture_output=True, text=True, timeout=30,
                       check=False)
    if r.returncode != 0:
        log.warning("cannot list the connections of pid %d: %s", pid, r.stderr.strip())
        return []
    conns = [c for c in parse_ss(r.stdout) if c.inode in inodes and c.dst in dsts]
    for c in conns:
        k = subprocess.run([*ns, "ss", "-K", "src", c.src, "sport", "=", f":{c.sport}", "dst", c.dst, "dport", "=",
                            f":{c.dport}"], capture_output=True, text=True, timeout=30, check=False)
        if k.returncode != 0:
            log.warning("could not close %s of pid %d: %s", c, pid, k.stderr.strip())
    return conns


def uri_host(uri: str) -> str | None:
    """``tcp://10.0.0.2:49152`` -> ``10.0.0.2`` (None when the URI names no host)."""
    m = re.match(r"^[a-z+]+://(\[[^\]]+\]|[^:/]+)", uri or "")
    return m[1].strip("[]") if m else None


def target_addresses(migrate_uri: str, target_uri: str) -> set[str]:
    """The addresses the migration's streams go to: the migrate URI's host when the
    target named one (its ``migration_address``), else the target libvirt URI's host,
    where libvirt sends them then; a name is resolved. Empty when neither names a host."""
    host = uri_host(migrate_uri) or uri_host(target_uri)
    if not host:
        return set()
    try:
        return {ai[4][0] for ai in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except OSError:
        return set()
