"""`top`: the pure frame model (per VM and per reason rows, sorting) and its text rendering."""

from __future__ import annotations

import io
from collections import Counter

from tools.kvm_utils.live import Spec, Target
from tools.kvm_utils.render.tui import print_frame
from tools.kvm_utils.top import frame

A0 = Target(11, -1, "web1", 0, 10)
A1 = Target(12, -1, "web1", 1, 10)
B0 = Target(21, -1, "db2", 0, 20)
HLT = Spec("exit", "HLT", 1, "exit_reason==12")
IO = Spec("user", "IO", 2, "reason==2 && errno>=0")
PIO = Spec("event", "kvm_pio", 3, None)


def sample() -> tuple[Counter, Counter]:
    delta = Counter({(A0, HLT): 400, (A1, HLT): 100, (B0, PIO): 50, (B0, IO): 50})
    totals = delta + Counter({(A0, HLT): 100, (B0, PIO): 5000, (B0, IO): 5000})
    return delta, totals


def test_frame_rates_totals_and_sorts() -> None:
    delta, totals = sample()
    f = frame(delta, totals, step=0.5, elapsed=10.0)
    assert [(r.key, r.rate, r.total) for r in f.vms] == [("web1", 1000.0, 600), ("db2", 200.0, 10100)]
    assert f.vms[0].extra == "pid 10, 2 vCPU thread(s), top: HLT 500"
    assert [(r.kind, r.key, r.rate, r.total) for r in f.reasons] == [
        ("exit", "HLT", 1000.0, 600), ("user", "IO", 100.0, 5050), ("event", "kvm_pio", 100.0, 5050)]
    assert f.exit_rate == 1000.0
    assert [r.key for r in frame(delta, totals, 0.5, 10.0, sort="total").vms] == ["db2", "web1"]
    assert [r.key for r in frame(delta, totals, 0.5, 10.0, sort="name").reasons] == ["kvm_pio", "HLT", "IO"]


def test_frame_idle_and_empty() -> None:
    f = frame(Counter(), Counter(), step=1.0, elapsed=1.0)
    assert f.vms == () and f.reasons == ()
    out = io.StringIO()
    print_frame(f, out)
    assert "no kvm events yet" in out.getvalue()


def test_print_frame_plain_text() -> None:
    delta, totals = sample()
    out = io.StringIO()
    print_frame(frame(delta, totals, 0.5, 10.0, sort="total"), out)
    text = out.getvalue()
    assert "\x1b[" not in text                       # no colour or cursor codes in a pipe
    assert "sort: total" in text and "web1" in text and "kvm_pio" in text and "5,050" in text
