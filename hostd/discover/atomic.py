"""What a disk writes whole, even across a power failure: its atomic-write unit.

Three sources, the first that answers wins:

1. **sysfs** (Linux 6.11+): ``/sys/block/NAME/queue/atomic_write_unit_min_bytes``,
   ``atomic_write_unit_max_bytes``, ``atomic_write_boundary_bytes``,
   ``atomic_write_max_bytes``. The kernel derived them from the device (NVMe identify
   data, SCSI block limits VPD) and enforces them: a ``pwritev2(RWF_ATOMIC)`` outside
   them is refused, never split. ``unit_max 0`` = no atomic writes.
   On this host (root "/") ``statx(STATX_WRITE_ATOMIC)`` on ``/dev/NAME`` is asked too
   (the interface an application uses); a recorded tree stands in for it with
   ``.hostd-probe.json``'s ``"statx": {"NAME": {"atomic_write_unit_min": ..,
   "atomic_write_unit_max": .., "atomic_write_segments_max": ..}}``. When the two
   disagree the smaller unit is kept, with a warning.
2. **NVMe identify data** (kernels without those files): ``nvme id-ns -o json`` of the
   namespace and ``nvme id-ctrl -o json`` of its controller, read with the rules Linux
   6.11+ applies (``drivers/nvme/host/core.c``), so a host reports the same unit before
   and after a kernel upgrade. A recorded tree keeps that output as
   ``.hostd-probe/nvme/<namespace>.id-ns.json`` and ``.hostd-probe/nvme/<ctrl>.id-ctrl.json``.
   The rules (NVMe Base Specification 2.0, Identify Controller / Identify Namespace):
   - the logical block size ``bs`` is ``2^lbafs[i].ds`` of the format in use
     (``flbas`` bits 3:0, with bits 6:5 above them when there are more than 16 formats);
   - ``NABO`` (namespace atomic boundary offset) other than 0: no atomic writes
     (Linux does not support an offset);
   - ``NSFEAT`` bit 1 set and ``NAWUPF`` non-zero: the namespace's own power-fail unit,
     ``(NAWUPF + 1) * bs`` (0's based, in logical blocks), and its boundary
     ``(NABSPF + 1) * bs`` when ``NABSPF`` is non-zero (0 = no boundary);
   - otherwise the controller's ``(AWUPF + 1) * bs`` (0's based: AWUPF 0 = one block);
   - unit_min = ``bs``, unit_max = the largest power of two within the unit (and
     within a boundary), max = the unit. A boundary that is not a power of two: none.
   Only power-fail units (AWUPF/NAWUPF) count: "normal" units (AWUN/NAWUN) promise
   nothing when power goes.
3. Nothing: ``None`` (unknown), which placement treats as "no atomic writes".
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from hostd.discover.fs import HostFs
from hostd.discover.model import AtomicWrite

log = logging.getLogger(__name__)

SYSFS_KEYS = ("atomic_write_unit_min_bytes", "atomic_write_unit_max_bytes",
              "atomic_write_boundary_bytes", "atomic_write_max_bytes")
NVME_DIR = ".hostd-probe/nvme"
NVME_TIMEOUT_S = 5.0
NSFEAT_NSABP = 1 << 1  # NSFEAT bit 1: NAWUN/NAWUPF/NACWU (and the boundaries) are valid

# statx(2): the mask bit and the struct statx offsets of the atomic-write fields
# (include/uapi/linux/stat.h, Linux 6.11+; the struct is 256 bytes and stable).
STATX_WRITE_ATOMIC = 0x00010000
AT_FDCWD = -100
_STATX_SIZE = 256
_OFF_MASK = 0
_OFF_UNIT_MIN = 168
_OFF_UNIT_MAX = 172
_OFF_SEGMENTS_MAX = 176
_SYS_STATX = {"x86_64": 332, "aarch64": 291, "riscv64": 291, "ppc64le": 383, "s390x": 379}
_NS_RE = re.compile(r"(nvme\d+)n\d+")


@dataclass(frozen=True)
class StatxAtomic:
    unit_min: int
    unit_max: int
    segments_max: int


def pow2_floor(n: int) -> int:
    return 1 << (n.bit_length() - 1) if n > 0 else 0


def is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


# ---------------------------------------------------------------- statx


def statx_atomic(path: str) -> StatxAtomic | None:
    """``statx(path, STATX_WRITE_ATOMIC)``: the unit an application is told, or None when
    the kernel does not report one (older than 6.11, no support, or statx missing)."""
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(_STATX_SIZE)
    args = (ctypes.c_int(AT_FDCWD), ctypes.c_char_p(os.fsencode(path)), ctypes.c_int(0),
            ctypes.c_uint(STATX_WRITE_ATOMIC), buf)
    if hasattr(libc, "statx"):  # glibc 2.28+
        libc.statx.restype = ctypes.c_int
        rc = libc.statx(*args)
    else:
        nr = _SYS_STATX.get(os.uname().machine)
        if nr is None:
            return None
        libc.syscall.restype = ctypes.c_long
        rc = libc.syscall(ctypes.c_long(nr), *args)
    if rc != 0:
        err = ctypes.get_errno()
        log.debug("statx path=%s errno=%s", path, os.strerror(err) if err else "?")
        return None
    raw = buf.raw
    mask = int.from_bytes(raw[_OFF_MASK:_OFF_MASK + 4], "little")
    if not mask & STATX_WRITE_ATOMIC:
        return None

    def u32(off: int) -> int:
        return int.from_bytes(raw[off:off + 4], "little")
    return StatxAtomic(u32(_OFF_UNIT_MIN), u32(_OFF_UNIT_MAX), u32(_OFF_SEGMENTS_MAX))


def _recorded_statx(fs: HostFs, probe: dict, name: str) -> StatxAtomic | None:
    rec = (probe.get("statx") or {}).get(name)
    if not isinstance(rec, dict):
        return None
    vals = [rec.get(k) for k in ("atomic_write_unit_min", "atomic_write_unit_max", "atomic_write_segments_max")]
    if not all(isinstance(v, int) and v >= 0 for v in vals):
        fs.warn(f".hostd-probe.json: statx of {name} is not three counts")
        return None
    return StatxAtomic(*vals)


# ---------------------------------------------------------------- the three sources


def read_atomic(fs: HostFs, name: str, probe: dict) -> AtomicWrite | None:
    """The atomic-write limits of disk ``name`` (see the module docstring)."""
    q = f"sys/block/{name}/queue"
    if fs.exists(f"{q}/atomic_write_unit_max_bytes"):
        return _from_sysfs(fs, name, q, probe)
    if _NS_RE.fullmatch(name):
        return _from_nvme_id(fs, name)
    return None


def _from_sysfs(fs: HostFs, name: str, q: str, probe: dict) -> AtomicWrite:
    v = {k: fs.int(f"{q}/{k}", optional=k != "atomic_write_unit_max_bytes") or 0 for k in SYSFS_KEYS}
    unit_min, unit_max = v["atomic_write_unit_min_bytes"], v["atomic_write_unit_max_bytes"]
    boundary, most = v["atomic_write_boundary_bytes"], v["atomic_write_max_bytes"]
    sx = statx_atomic(f"/dev/{name}") if fs.live else _recorded_statx(fs, probe, name)
    detail = "kernel queue limits" if unit_max else "the kernel reports no atomic writes"
    if sx is not None and sx.unit_max != unit_max:
        fs.warn(f"/dev/{name}: statx atomic_write_unit_max {sx.unit_max} differs from "
                f"/sys/block/{name}/queue/atomic_write_unit_max_bytes {unit_max}: the smaller is used")
        unit_max = min(unit_max, sx.unit_max)
        unit_min = min(unit_min, unit_max) if unit_max else 0
    return AtomicWrite(source="sysfs", unit_min_bytes=unit_min, unit_max_bytes=unit_max, max_bytes=most,
                       boundary_bytes=boundary, statx_unit_max_bytes=sx.unit_max if sx else None, detail=detail)


def _controller(fs: HostFs, name: str) -> str:
    dev = fs.real(f"sys/block/{name}/device")
    if dev is not None and re.fullmatch(r"nvme\d+", dev.name):
        return dev.name
    m = _NS_RE.fullmatch(name)
    return m.group(1) if m else name


def _identify(fs: HostFs, kind: str, dev: str) -> dict | None:
    """``nvme <kind> -o json /dev/<dev>``: run here, or the recording under a tree."""
    if fs.live:
        if shutil.which("nvme") is None:
            return None
        try:
            r = subprocess.run(["nvme", kind, "-o", "json", f"/dev/{dev}"], capture_output=True,
                               text=True, timeout=NVME_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            fs.warn(f"nvme {kind} /dev/{dev}: {e}")
            return None
        if r.returncode != 0:
            fs.warn(f"nvme {kind} /dev/{dev}: exit {r.returncode}: {r.stderr.strip()[:120]}")
            return None
        text: str | None = r.stdout
        where = f"nvme {kind} /dev/{dev}"
    else:
        text = fs.text(f"{NVME_DIR}/{dev}.{kind}.json", optional=True)
        where = f"{NVME_DIR}/{dev}.{kind}.json"
    if text is None:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        fs.warn(f"{where}: not JSON ({e})")
        return None
    if not isinstance(data, dict):
        fs.warn(f"{where}: not a JSON object")
        return None
    return data


def _field(fs: HostFs, data: dict, key: str, where: str) -> int | None:
    v = data.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        fs.warn(f"{where}: {key} missing or not a count ({v!r})")
        return None
    return v


def lba_bytes(ns: dict) -> int | None:
    """The namespace's logical block size: 2^ds of the LBA format ``flbas`` selects."""
    flbas, lbafs = ns.get("flbas"), ns.get("lbafs")
    if not isinstance(flbas, int) or not isinstance(lbafs, list):
        return None
    index = (flbas & 0xF) | (((flbas >> 5) & 0x3) << 4)
    if index >= len(lbafs) or not isinstance(lbafs[index], dict):
        return None
    ds = lbafs[index].get("ds")
    return 1 << ds if isinstance(ds, int) and 9 <= ds <= 16 else None


def _from_nvme_id(fs: HostFs, name: str) -> AtomicWrite | None:
    ctrl = _controller(fs, name)
    ns = _identify(fs, "id-ns", name)
    if ns is None:
        return None
    where = f"{name} identify namespace"
    bs = lba_bytes(ns)
    if bs is None:
        fs.warn(f"{where}: no usable flbas/lbafs: logical block size unknown")
        return None
    vals = {k: _field(fs, ns, k, where) for k in ("nsfeat", "nawupf", "nabspf", "nabo")}
    if any(v is None for v in vals.values()):
        return None
    nsfeat, nawupf, nabspf, nabo = (int(vals[k] or 0) for k in ("nsfeat", "nawupf", "nabspf", "nabo"))

    def none(why: str) -> AtomicWrite:
        return AtomicWrite(source="nvme-id", unit_min_bytes=0, unit_max_bytes=0, max_bytes=0,
                           boundary_bytes=0, detail=why)
    if nabo:
        return none(f"NABO {nabo}: an atomic boundary offset, which Linux does not support")
    boundary = 0
    if nsfeat & NSFEAT_NSABP and nawupf:
        unit = (nawupf + 1) * bs
        boundary = (nabspf + 1) * bs if nabspf else 0
        detail = f"namespace NAWUPF {nawupf} x {bs} B blocks (NSFEAT bit 1)"
    else:
        c = _identify(fs, "id-ctrl", ctrl)
        awupf = _field(fs, c, "awupf", f"{ctrl} identify controller") if c is not None else None
        if awupf is None:
            return None
        unit = (awupf + 1) * bs
        detail = f"controller {ctrl} AWUPF {awupf} x {bs} B blocks"
    if boundary and not is_pow2(boundary):
        return none(f"atomic boundary {boundary} B (NABSPF {nabspf}) is not a power of two")
    unit_max = pow2_floor(min(unit, boundary) if boundary else unit)
    return AtomicWrite(source="nvme-id", unit_min_bytes=bs, unit_max_bytes=unit_max,
                       max_bytes=min(unit, boundary) if boundary else unit,
                       boundary_bytes=boundary, detail=detail)
