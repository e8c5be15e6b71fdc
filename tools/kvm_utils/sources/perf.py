"""perf tracepoint counters (counting mode, like kvm_stat): no per-event cost in userspace.

One counter per (thread or CPU, tracepoint, filter). `exit_reason==N` filters split
kvm_exit by reason inside the kernel (PERF_EVENT_IOC_SET_FILTER), exactly as kvm_stat does.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import resource
import struct

from tools.kvm_utils.errors import NotAvailable

PERF_TYPE_TRACEPOINT = 2
PERF_FLAG_FD_CLOEXEC = 1 << 3
PERF_EVENT_IOC_ENABLE = 0x2400
PERF_EVENT_IOC_DISABLE = 0x2401
PERF_EVENT_IOC_SET_FILTER = 0x40082406   # _IOW('$', 6, char *)
ATTR_DISABLED = 1 << 0
_NR_PERF_EVENT_OPEN = 298                # x86_64


class PerfEventAttr(ctypes.Structure):
    """struct perf_event_attr up to PERF_ATTR_SIZE_VER5 (112 bytes); the kernel accepts it."""

    _fields_ = [
        ("type", ctypes.c_uint32), ("size", ctypes.c_uint32), ("config", ctypes.c_uint64),
        ("sample_period", ctypes.c_uint64), ("sample_type", ctypes.c_uint64),
        ("read_format", ctypes.c_uint64), ("flags", ctypes.c_uint64),
        ("wakeup_events", ctypes.c_uint32), ("bp_type", ctypes.c_uint32),
        ("config1", ctypes.c_uint64), ("config2", ctypes.c_uint64),
        ("branch_sample_type", ctypes.c_uint64), ("sample_regs_user", ctypes.c_uint64),
        ("sample_stack_user", ctypes.c_uint32), ("clockid", ctypes.c_int32),
        ("sample_regs_intr", ctypes.c_uint64), ("aux_watermark", ctypes.c_uint32),
        ("sample_max_stack", ctypes.c_uint16), ("reserved_2", ctypes.c_uint16),
    ]


assert ctypes.sizeof(PerfEventAttr) == 112

_libc = None


def _syscall():
    global _libc   # the loaded libc handle only; no state
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
    return _libc.syscall


def open_tracepoint(tp_id: int, pid: int, cpu: int, filter_expr: str | None = None) -> int:
    """An fd counting tracepoint `tp_id` for thread `pid` (cpu -1) or CPU `cpu` (pid -1), enabled."""
    attr = PerfEventAttr(type=PERF_TYPE_TRACEPOINT, size=ctypes.sizeof(PerfEventAttr), config=tp_id,
                         flags=ATTR_DISABLED)
    fd = _syscall()(_NR_PERF_EVENT_OPEN, ctypes.byref(attr), pid, cpu, -1, PERF_FLAG_FD_CLOEXEC)
    if fd < 0:
        e = ctypes.get_errno()
        if e in (errno.EACCES, errno.EPERM):
            raise NotAvailable("perf_event_open refused: run as root or set "
                               "/proc/sys/kernel/perf_event_paranoid to -1")
        if e == errno.ESRCH:
            raise ProcessLookupError(pid)
        if e == errno.EMFILE:
            raise NotAvailable("out of file descriptors for perf counters: raise `ulimit -n`")
        raise OSError(e, f"perf_event_open(tracepoint {tp_id}, pid {pid}, cpu {cpu}): {os.strerror(e)}")
    try:
        if filter_expr:
            fcntl.ioctl(fd, PERF_EVENT_IOC_SET_FILTER, filter_expr.encode() + b"\0")
        fcntl.ioctl(fd, PERF_EVENT_IOC_ENABLE, 0)
    except OSError:
        os.close(fd)
        raise
    return fd


def set_enabled(fd: int, on: bool) -> None:
    """Start or stop counting. A stopped counter leaves the tracepoint's probe registered
    (it returns at once: no counter on the CPU's list); only close() unregisters it, and
    that waits for an RCU grace period per tracepoint."""
    fcntl.ioctl(fd, PERF_EVENT_IOC_ENABLE if on else PERF_EVENT_IOC_DISABLE, 0)


def read_count(fd: int) -> int:
    return struct.unpack("=Q", os.read(fd, 8))[0]


def raise_fd_limit() -> int:
    """Soft RLIMIT_NOFILE up to the hard limit (one fd per counter adds up: reasons x vCPUs)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard
