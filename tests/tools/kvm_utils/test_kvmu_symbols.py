"""Symbol readers (BTF, kallsyms, available_filter_functions) and the kprobe engine's resolution table.

BTF: a blob built here (every kind whose size differs, so a wrong stride or offset fails),
split BTF on top of it, and this machine's real /sys/kernel/btf/vmlinux. Resolution: every
vendor over the version boundaries of the table, then this machine's kallsyms + BTF.
"""

from __future__ import annotations

import platform
import struct
from pathlib import Path

import pytest

from tools.kvm_utils import kprobe_table as kt
from tools.kvm_utils import symbols
from tools.kvm_utils.record import host_vendor


def _strings(*names: str) -> tuple[bytes, dict[str, int]]:
    table, offs = b"\0", {}
    for n in names:
        offs[n] = len(table)
        table += n.encode() + b"\0"
    return table, offs


def _t(name_off: int, kind: int, vlen: int = 0, size: int = 0, extra: int = 0) -> bytes:
    return struct.pack("<III", name_off, (kind << 24) | vlen, size) + b"\xaa" * extra


def _blob(types: bytes, strings: bytes, hdr_len: int = 24, type_off: int = 0) -> bytes:
    pad = b"\0" * type_off
    hdr = struct.pack("<HBBIIIII", symbols.BTF_MAGIC, 1, 0, hdr_len, type_off, len(types),
                      type_off + len(types), len(strings))
    return hdr + b"\0" * (hdr_len - 24) + pad + types + strings


def _base() -> tuple[bytes, dict[str, int]]:
    strings, o = _strings("int", "s", "f_one", "e", "f_two", "v", "sec", "tag", "f_three")
    types = b"".join([
        _t(o["int"], 1, size=4, extra=4),            # 1 INT
        _t(o["s"], 4, vlen=2, size=8, extra=24),     # 2 STRUCT, 2 members
        _t(0, 13, vlen=1, extra=8),                  # 3 FUNC_PROTO, 1 param
        _t(o["f_one"], 12, size=3),                  # 4 FUNC
        _t(o["e"], 6, vlen=2, size=4, extra=16),     # 5 ENUM, 2 values
        _t(0, 3, extra=12),                          # 6 ARRAY
        _t(o["f_two"], 12, size=3),                  # 7 FUNC
        _t(o["v"], 14, size=1, extra=4),             # 8 VAR
        _t(o["sec"], 15, vlen=1, extra=12),          # 9 DATASEC
        _t(o["tag"], 17, size=4, extra=4),           # 10 DECL_TAG
        _t(o["e"], 19, vlen=1, size=8, extra=12),    # 11 ENUM64
        _t(o["f_three"], 12, size=3),                # 12 FUNC
    ])
    return _blob(types, strings, hdr_len=32, type_off=8), o


def test_tiny_btf_every_stride() -> None:
    blob, _ = _base()
    btf = symbols.parse_btf(blob)
    assert btf.funcs == {"f_one": 4, "f_two": 7, "f_three": 12}
    assert btf.type_count == 12


def test_split_btf_continues_ids_and_strings_from_base() -> None:
    base = symbols.parse_btf(_base()[0])
    own, o = _strings("mod_fn")
    own = own[1:]                                  # a split blob's strings start right after the base's
    mod_off = len(base.strings) + o["mod_fn"] - 1
    types = _t(mod_off, 12, size=3) + _t(base.strings.index(b"f_two\0"), 12, size=3)
    mod = symbols.parse_btf(_blob(types, own), "mod", base=base)
    assert mod.funcs == {"mod_fn": 13, "f_two": 14}


def test_btf_errors_name_the_problem() -> None:
    blob, _ = _base()
    with pytest.raises(symbols.BtfError, match="not 0xEB9F"):
        symbols.parse_btf(b"\x00\x00" + blob[2:], "x")
    strings, o = _strings("a")
    with pytest.raises(symbols.BtfError, match="unknown BTF kind 31 at type id 1"):
        symbols.parse_btf(_blob(_t(o["a"], 31), strings))
    with pytest.raises(symbols.BtfError, match="runs past"):
        symbols.parse_btf(blob[:-3])
    with pytest.raises(symbols.BtfError, match="name offset 99"):
        symbols.parse_btf(_blob(_t(99, 12), strings))
    with pytest.raises(symbols.BtfError, match="no NUL"):
        symbols.parse_btf(_blob(_t(1, 12), b"\0abc"))
    with pytest.raises(symbols.BtfError, match="shorter than"):
        symbols.parse_btf(b"\x9f\xeb")


def test_read_btf_tree_with_module(tmp_path: Path) -> None:
    assert symbols.read_btf(tmp_path)[0] is None and "vmlinux" in symbols.btf_report(tmp_path).why
    d = tmp_path / "kernel/btf"
    d.mkdir(parents=True)
    (d / "vmlinux").write_bytes(_base()[0])
    base = symbols.parse_btf(_base()[0])
    (d / "kvm_pvm").write_bytes(_blob(_t(base.strings.index(b"f_one\0"), 12), b""))
    vm, mods, why = symbols.read_btf(tmp_path)
    assert vm is not None and why == "" and mods["kvm_pvm"].funcs == {"f_one": 13}
    r = symbols.btf_report(tmp_path)
    assert r.source == "btf (vmlinux + kvm_pvm)" and r.names == {"f_one", "f_two", "f_three"}


def test_kallsyms_and_filter_functions_on_trees(tmp_path: Path) -> None:
    (tmp_path / "kallsyms").write_text("ffffffff81000000 T _stext\nffffffff81281c70 T kvm_vcpu_halt\n"
                                       "ffffffff82000000 D some_data\nffffffffc0001000 t vmx_handle_exit\t[kvm_intel]\n")
    assert symbols.read_kallsyms(tmp_path) == {"_stext": "", "kvm_vcpu_halt": "", "vmx_handle_exit": "kvm_intel"}
    assert symbols.kallsyms_report(tmp_path / "nope").names is None
    r = symbols.filter_functions_report(tmp_path)
    assert r.names is None and "available_filter_functions: missing" in r.why
    (tmp_path / "available_filter_functions").write_text("kvm_vcpu_halt\nvmx_handle_exit [kvm_intel]\n")
    assert symbols.filter_functions_report(tmp_path).names == {"kvm_vcpu_halt", "vmx_handle_exit"}
    assert "not mounted" in symbols.filter_functions_report(None).why


@pytest.mark.skipif(not Path("/sys/kernel/btf/vmlinux").exists(), reason="no /sys/kernel/btf/vmlinux here")
def test_real_vmlinux_btf_matches_kallsyms() -> None:
    """This machine: KVM (with PVM) is built in, so every KVM function is in vmlinux BTF; no module BTF."""
    r = symbols.btf_report()
    assert r.names is not None, r.why
    for name in ("kvm_vcpu_halt", "apic_timer_fn", "kvm_vcpu_on_spin", "kvm_vcpu_wake_up", "kvm_apic_send_ipi"):
        assert name in r.names
    kall = symbols.read_kallsyms()
    if "pvm_handle_exit" in kall:
        assert "pvm_handle_exit" in r.names
    # A wrong stride would yield garbage names: nearly all BTF functions must be real kallsyms functions.
    assert len(r.names) > 10000
    assert len(r.names & set(kall)) > 0.9 * len(r.names)


VERSIONS = [(4, 4), (4, 5), (4, 9), (4, 10), (4, 19), (5, 5), (5, 6), (5, 10), (5, 16), (5, 17), (6, 1), (6, 18)]


def _expected(v: tuple[int, int], vendor: str) -> dict[str, str | None]:
    return {
        "exit handler entry to return": {"vmx": "vmx_handle_exit", "svm": "svm_handle_exit",
                                         "pvm": "pvm_handle_exit"}[vendor],
        "vCPU wake-up": "kvm_vcpu_wake_up" if v >= (4, 5) else None,
        "vCPU kick": "kvm_vcpu_kick",
        "posted-interrupt wake-up": (("pi_wakeup_handler" if v >= (5, 6) else "wakeup_handler")
                                     if vendor == "vmx" else None),
        "LAPIC hrtimer expiry": "apic_timer_fn",
        "VMX preemption-timer expiry": "kvm_lapic_expired_hv_timer" if vendor == "vmx" and v >= (4, 10) else None,
        "halt duration": "kvm_vcpu_halt" if v >= (5, 17) else "kvm_vcpu_block",
        "pause-loop exit": "kvm_vcpu_on_spin",
    }


ALL_SYMBOLS = frozenset(c.symbol for p in kt.TABLE for c in p.candidates)


@pytest.mark.parametrize("vendor", kt.VENDORS)
@pytest.mark.parametrize("version", VERSIONS)
def test_resolve_everything_available(version: tuple[int, int], vendor: str) -> None:
    res = kt.resolve(version, vendor, ALL_SYMBOLS)
    assert {p.probe.role: p.symbol for p in res.probes} == _expected(version, vendor)
    assert res.missing() == []
    assert res.servable() == ["exit-handling", "wakeups", "timer", "halt-spin"]
    for p in res.probes:
        assert (p.status == "found") == (p.symbol is not None)
        if p.symbol is None:
            assert p.status == "n/a" and p.message.startswith(f"not applicable to {vendor}")


@pytest.mark.parametrize("vendor", kt.VENDORS)
@pytest.mark.parametrize("version", [(5, 4), (5, 16), (5, 17), (6, 18)])
def test_resolve_each_missing_symbol_is_named_with_what_is_lost(version: tuple[int, int], vendor: str) -> None:
    expected = _expected(version, vendor)
    for role, sym in expected.items():
        if sym is None:
            continue
        res = kt.resolve(version, vendor, ALL_SYMBOLS - {sym})
        [miss] = res.missing()
        assert miss.probe.role == role and miss.symbol is None and miss.status == "missing"
        assert sym in miss.message and miss.probe.lost in miss.message
        assert miss.probe.purpose not in res.servable()


def test_resolve_with_nothing_and_bad_input() -> None:
    res = kt.resolve((6, 1), "svm", frozenset())
    assert res.servable() == [] and len(res.missing()) == 6
    with pytest.raises(ValueError, match="'intel' is not one of vmx, svm, pvm"):
        kt.resolve((6, 1), "intel", ALL_SYMBOLS)
    assert kt.parse_version("6.18.44-fc-v669") == (6, 18) and kt.parse_version("5.4.0-150-generic") == (5, 4)
    with pytest.raises(ValueError, match="MAJOR.MINOR"):
        kt.parse_version("linux")
    assert kt.engine_vendor("intel", frozenset()) == "vmx" and kt.engine_vendor("amd", ALL_SYMBOLS) == "svm"
    assert kt.engine_vendor(None, frozenset({"pvm_handle_exit"})) == "pvm"
    assert kt.engine_vendor(None, frozenset()) is None


def test_resolve_on_this_machine() -> None:
    """This machine's kernel, vendor (host_vendor, else PVM) and real kallsyms + BTF."""
    kall = set(symbols.read_kallsyms())
    btf = symbols.btf_report().names or frozenset()
    available = frozenset(kall | btf)
    vendor = kt.engine_vendor(host_vendor(), available)
    if vendor is None:
        pytest.skip("no vmx/svm flag and no PVM in this kernel: nothing to resolve")
    res = kt.resolve(kt.parse_version(platform.release()), vendor, available)
    expected = _expected(res.kernel, vendor)
    for p in res.probes:
        want = expected[p.probe.role]
        if want is None:
            assert p.symbol is None and "not applicable" in p.message
        elif want in available:
            assert p.symbol == want
        else:
            assert p.symbol is None and p.message.startswith(f"missing {want}")
    assert res.probes[0].symbol is not None   # the exit handler of the vendor we detected is there


def test_kernel_config_sources(tmp_path: Path) -> None:
    import gzip
    from tools.kvm_utils.doctor import kernel_config
    proc, boot = tmp_path / "proc", tmp_path / "boot"
    proc.mkdir()
    boot.mkdir()
    assert kernel_config("CONFIG_KPROBES", "6.1.0", proc, boot) == (
        None, f"neither {proc}/config.gz nor {boot}/config-6.1.0 is readable")
    (boot / "config-6.1.0").write_text("CONFIG_KPROBES=y\nCONFIG_KVM=m\n")
    assert kernel_config("CONFIG_KPROBES", "6.1.0", proc, boot) == ("y", f"{boot}/config-6.1.0")
    assert kernel_config("CONFIG_KVM", "6.1.0", proc, boot)[0] == "m"
    (proc / "config.gz").write_bytes(gzip.compress(b"# CONFIG_KPROBES is not set\n"))
    assert kernel_config("CONFIG_KPROBES", "6.1.0", proc, boot) == ("n", f"{proc}/config.gz")
    assert kernel_config("CONFIG_BPF", "6.1.0", proc, boot) == ("n", f"{proc}/config.gz (not mentioned)")
