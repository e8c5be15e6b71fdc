"""Can this kernel load a BPF program of a given type? Asked with the raw bpf() syscall.

A two-instruction program (r0 = 0; exit) is loaded as a tracepoint program, and as an
fentry (BPF_PROG_TYPE_TRACING, BPF_TRACE_FENTRY) program on a BTF function id; the fd is
closed at once, nothing is attached. The answer is the kernel's: ok, or its errno.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from dataclasses import dataclass

SYS_BPF = {"x86_64": 321, "aarch64": 280}
BPF_PROG_LOAD = 5
BPF_PROG_TYPE_TRACEPOINT = 5
BPF_PROG_TYPE_TRACING = 26
BPF_TRACE_FENTRY = 24
_PROG = struct.pack("<BBhi", 0xB7, 0, 0, 0) + struct.pack("<BBhi", 0x95, 0, 0, 0)   # mov r0,0; exit


@dataclass(frozen=True)
class LoadResult:
    ok: bool
    detail: str     # "loaded" or the errno's name and text


def _load(prog_type: int, attach_type: int = 0, btf_id: int = 0) -> LoadResult:
    nr = SYS_BPF.get(platform.machine())
    if nr is None:
        return LoadResult(False, f"bpf() syscall number unknown for {platform.machine()}")
    insns = ctypes.create_string_buffer(_PROG, len(_PROG))
    lic = ctypes.create_string_buffer(b"GPL")
    attr = bytearray(120)
    struct.pack_into("<IIQQ", attr, 0, prog_type, 2, ctypes.addressof(insns), ctypes.addressof(lic))
    struct.pack_into("<I", attr, 68, attach_type)
    struct.pack_into("<I", attr, 108, btf_id)
    buf = (ctypes.c_char * len(attr)).from_buffer(attr)
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.syscall(ctypes.c_long(nr), ctypes.c_long(BPF_PROG_LOAD), buf, ctypes.c_uint(len(attr)))
    if fd < 0:
        e = ctypes.get_errno()
        return LoadResult(False, f"{errno.errorcode.get(e, str(e))}: {os.strerror(e)}")
    os.close(fd)
    return LoadResult(True, "loaded")


def tracepoint_program_loads() -> LoadResult:
    return _load(BPF_PROG_TYPE_TRACEPOINT)


def fentry_program_loads(btf_func_id: int) -> LoadResult:
    """Load an fentry program for the vmlinux BTF function with this type id."""
    return _load(BPF_PROG_TYPE_TRACING, BPF_TRACE_FENTRY, btf_func_id)
