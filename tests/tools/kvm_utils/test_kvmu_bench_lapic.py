"""Unit: how `bench` turns the helper's LAPIC-case results (ipi, ipi_halt, tscdeadline,
tscdeadline_immed) into rows, and names the hypervisor in a case's error. No /dev/kvm: the
helper's JSON lines here are the shape it prints (see helper/kvm_exit_bench.c print_result)."""

from __future__ import annotations

from pathlib import Path

from tools.kvm_utils import bench

IPI_OUT = {"mode": "ipi", "iterations": 2048, "runs": 0, "tsc_cycles": 2048 * 50_000, "ns": 2048 * 19_260,
           "cpu_ns": 1, "tsc_khz": 2_596_000, "pid": 1, "userspace_exits": {},
           "op_samples": 2048, "op_cycles_min": 30_000, "op_cycles_p50": 40_000, "op_cycles_p99": 90_000,
           "op_cycles_max": 400_000}


def test_lapic_result_converts_guest_cycles_with_the_vcpu_tsc_rate() -> None:
    c, ns = bench.per_iter(IPI_OUT)
    r = bench.lapic_result("ipi", "ipi", "x", IPI_OUT, c, ns, 0.0)
    assert (r.median_cycles, r.p99_cycles, r.op_samples) == (40_000, 90_000, 2048)
    assert r.median_ns == round(40_000 / 2.596, 1) and r.p99_ns == round(90_000 / 2.596, 1)
    assert r.net_cycles_per_iter is None          # not the nop loop's loop: nothing to subtract
    assert r.cycles_per_iter == 50_000.0


def test_lapic_result_without_tsc_rate_has_no_ns() -> None:
    out = dict(IPI_OUT, tsc_khz=-1)               # KVM_GET_TSC_KHZ failed
    r = bench.lapic_result("ipi", "ipi", "x", out, *bench.per_iter(out), 0.0)
    assert r.median_cycles == 40_000 and r.median_ns is None and r.p99_ns is None


def test_table_shows_percentile_columns_only_with_a_lapic_case() -> None:
    nop = bench.BenchResult("nop_loop", "nop", "x", 4, 1.0, 2.0, 0.0, 0.0, 0.0)
    assert "op cyc p50" not in bench.format_table([nop])
    ipi = bench.lapic_result("ipi", "ipi", "x", IPI_OUT, *bench.per_iter(IPI_OUT), 0.0)
    failed = bench.BenchResult("tscdeadline", "tscdeadline", "x", error="PVM: bench helper tscdeadline: no")
    lines = bench.format_table([nop, ipi, failed]).splitlines()
    assert "op cyc p50" in lines[0] and "op ns p99" in lines[0]
    assert lines[1].split()[-4:] == ["-", "-", "-", "-"]
    assert lines[2].split()[-4:] == ["40000", "90000", "15408.3", "34668.7"]
    assert lines[3] == "tscdeadline          error: PVM: bench helper tscdeadline: no"   # one line


def test_hypervisor_from_sys_module(tmp_path: Path) -> None:
    assert bench.hypervisor(tmp_path) is None
    (tmp_path / "kvm_amd").mkdir()
    assert bench.hypervisor(tmp_path) == "SVM"
    (tmp_path / "kvm_pvm").mkdir()                # checked first (it serves /dev/kvm on this machine)
    assert bench.hypervisor(tmp_path) == "PVM"


def test_every_lapic_mode_is_a_bench_test() -> None:
    assert {mode for mode, _ in bench.TESTS.values()} >= bench.LAPIC_MODES
