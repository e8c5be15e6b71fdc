"""Kernel symbols the kprobe engine (sources/kprobe.py) attaches to: kallsyms, ftrace's filter list, BTF.

Every reader takes its root so tests can point it at a tree or a generated file. The BTF
parser is ours (no bpftool dependency): header, then the type section walked by kind and
vlen, collecting BTF_KIND_FUNC names. Module BTF is split BTF: its type ids and string
offsets continue from vmlinux's, so a module is parsed with vmlinux's string table as base.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

BTF_MAGIC = 0xEB9F
BTF_KIND_FUNC = 12
# Bytes that follow the 12-byte btf_type for each kind: (fixed, per vlen item).
_KIND_EXTRA: dict[int, tuple[int, int]] = {
    1: (4, 0), 2: (0, 0), 3: (12, 0), 4: (0, 12), 5: (0, 12), 6: (0, 8), 7: (0, 0), 8: (0, 0),
    9: (0, 0), 10: (0, 0), 11: (0, 0), 12: (0, 0), 13: (0, 8), 14: (4, 0), 15: (0, 12), 16: (0, 0),
    17: (4, 0), 18: (0, 0), 19: (0, 12),
}
MODULE_BTF = ("kvm", "kvm_pvm", "kvm_intel", "kvm_amd")


class BtfError(ValueError):
    """A BTF blob that cannot be parsed; the message says where and why."""


@dataclass(frozen=True)
class Btf:
    """Function names (BTF_KIND_FUNC) of one BTF blob, by name -> type id."""
    funcs: dict[str, int]
    strings: bytes           # the whole string table a split BTF on top of this one continues
    type_count: int          # number of types, for split BTF's id numbering


@dataclass(frozen=True)
class SymbolReport:
    """What one source says; `names` is None when the source could not be read (`why` says why)."""
    source: str
    names: frozenset[str] | None
    why: str = ""


def _header(blob: bytes, what: str) -> tuple[str, int, int, int, int, int]:
    if len(blob) < 24:
        raise BtfError(f"{what}: {len(blob)} bytes, shorter than the 24-byte BTF header")
    for order in ("<", ">"):
        magic, _ver, _flags, hdr_len = struct.unpack_from(order + "HBBI", blob, 0)
        if magic == BTF_MAGIC:
            type_off, type_len, str_off, str_len = struct.unpack_from(order + "IIII", blob, 8)
            return order, hdr_len, type_off, type_len, str_off, str_len
    raise BtfError(f"{what}: magic {blob[:2].hex()} is not 0xEB9F: not a BTF blob")


def parse_btf(blob: bytes, what: str = "BTF", base: Btf | None = None) -> Btf:
    """Function names of a BTF blob; `base` is vmlinux's BTF for a module's split BTF."""
    order, hdr_len, type_off, type_len, str_off, str_len = _header(blob, what)
    t0, s0 = hdr_len + type_off, hdr_len + str_off
    if t0 + type_len > len(blob) or s0 + str_len > len(blob):
        raise BtfError(f"{what}: type or string section runs past the blob's {len(blob)} bytes")
    own = blob[s0:s0 + str_len]
    base_strings = base.strings if base else b""
    first_id = (base.type_count if base else 0) + 1
    funcs: dict[str, int] = {}
    pos, end, tid = t0, t0 + type_len, first_id
    while pos < end:
        name_off, info, _size = struct.unpack_from(order + "III", blob, pos)
        kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
        if kind not in _KIND_EXTRA:
            raise BtfError(f"{what}: unknown BTF kind {kind} at type id {tid} (offset {pos - t0}): "
                           "newer than this parser")
        fixed, per = _KIND_EXTRA[kind]
        if kind == BTF_KIND_FUNC:
            funcs[_string(base_strings, own, name_off, what)] = tid
        pos += 12 + fixed + per * vlen
        tid += 1
    if pos != end:
        raise BtfError(f"{what}: last type ends at {pos - t0}, not at the type section's end {type_len}")
    return Btf(funcs=funcs, strings=base_strings + own, type_count=tid - 1)


def _string(base: bytes, own: bytes, off: int, what: str) -> str:
    table, rel = (base, off) if off < len(base) else (own, off - len(base))
    if rel >= len(table):
        raise BtfError(f"{what}: name offset {off} is past the string tables ({len(base)}+{len(own)} bytes)")
    end = table.find(b"\0", rel)
    if end < 0:
        raise BtfError(f"{what}: name at offset {off} has no NUL before the string table ends")
    return table[rel:end].decode("utf-8", "replace")


def read_btf(sys_root: Path = Path("/sys")) -> tuple[Btf | None, dict[str, Btf], str]:
    """vmlinux's BTF and the KVM modules' split BTF under sys_root/kernel/btf; the third value says
    what was missing (empty when vmlinux BTF was read)."""
    d = sys_root / "kernel/btf"
    try:
        vmlinux = parse_btf((d / "vmlinux").read_bytes(), str(d / "vmlinux"))
    except OSError as e:
        return None, {}, f"{d / 'vmlinux'}: {e.strerror or e} (kernel without CONFIG_DEBUG_INFO_BTF?)"
    modules: dict[str, Btf] = {}
    for m in MODULE_BTF:
        p = d / m
        if p.exists():
            modules[m] = parse_btf(p.read_bytes(), str(p), base=vmlinux)
    return vmlinux, modules, ""


def btf_report(sys_root: Path = Path("/sys")) -> SymbolReport:
    """Function names in vmlinux BTF plus the KVM modules' BTF."""
    try:
        vmlinux, modules, why = read_btf(sys_root)
    except (OSError, BtfError) as e:
        return SymbolReport("btf", None, str(e))
    if vmlinux is None:
        return SymbolReport("btf", None, why)
    names = set(vmlinux.funcs)
    for m in modules.values():
        names |= set(m.funcs)
    where = "vmlinux" + "".join(f" + {m}" for m in modules)
    return SymbolReport(f"btf ({where})", frozenset(names))


def read_kallsyms(proc: Path = Path("/proc")) -> dict[str, str]:
    """Text (function) symbols of /proc/kallsyms -> their module ('' for vmlinux)."""
    out: dict[str, str] = {}
    with open(proc / "kallsyms", encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and parts[1] in ("t", "T"):
                out.setdefault(parts[2], parts[3].strip("[]") if len(parts) > 3 else "")
    return out


def kallsyms_report(proc: Path = Path("/proc")) -> SymbolReport:
    try:
        return SymbolReport("kallsyms", frozenset(read_kallsyms(proc)))
    except OSError as e:
        return SymbolReport("kallsyms", None, f"{proc / 'kallsyms'}: {e.strerror or e}")


def filter_functions_report(tracefs: Path | None) -> SymbolReport:
    """Functions ftrace can hook (available_filter_functions: 'name' or 'name [module]')."""
    if tracefs is None:
        return SymbolReport("available_filter_functions", None, "tracefs not mounted")
    p = tracefs / "available_filter_functions"
    try:
        text = p.read_text(errors="replace")
    except FileNotFoundError:
        return SymbolReport("available_filter_functions", None,
                            f"{p}: missing (kernel without CONFIG_DYNAMIC_FTRACE?)")
    except OSError as e:
        return SymbolReport("available_filter_functions", None, f"{p}: refused: {e.strerror or e}")
    return SymbolReport("available_filter_functions",
                        frozenset(ln.split()[0] for ln in text.splitlines() if ln.strip()))
