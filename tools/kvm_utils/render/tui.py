"""rich rendering of a `top` frame: header, per-VM table, per-reason/event table."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from collections.abc import Iterator

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text


def render_frame(f) -> Group:
    head = Text.assemble(
        ("kvm-utils top", "bold"),
        f"  {f.elapsed:.1f} s, last interval {f.step:.1f} s, scope {f.scope}, "
        f"vendor {f.vendor or 'unknown (no vmx/svm flag)'}, kvm_exit {f.exit_rate:,.0f}/s\n",
        "sort: ", (f.sort, "bold cyan"), "   keys: r rate  t total  n name  q quit")
    vms = Table(title="per VM (all kvm events of its vCPU threads)", title_justify="left", expand=False,
                box=box.SIMPLE_HEAD)
    for col, just in (("VM", "left"), ("events/s", "right"), ("total", "right"), ("", "left")):
        vms.add_column(col, justify=just)
    for r in f.vms:
        vms.add_row(r.key, f"{r.rate:,.1f}", f"{r.total:,}", r.extra)
    reasons = Table(title="per exit reason / userspace exit / event", title_justify="left", expand=False,
                box=box.SIMPLE_HEAD)
    for col, just in (("kind", "left"), ("reason / event", "left"), ("rate/s", "right"), ("total", "right")):
        reasons.add_column(col, justify=just)
    for r in f.reasons:
        reasons.add_row(r.kind, r.key, f"{r.rate:,.1f}", f"{r.total:,}")
    if not f.reasons:
        reasons.add_row("-", "no kvm events yet", "", "")
    return Group(head, vms, reasons)


def print_frame(f, file=None) -> None:
    """One frame as plain text (no colours, no cursor control): --once and pipes."""
    Console(file=file or sys.stdout, width=120, force_terminal=False, no_color=True,
            highlight=False).print(render_frame(f))


@contextmanager
def live_screen() -> Iterator[object]:
    with Live(Text("kvm-utils top: first interval..."), screen=True, auto_refresh=False,
              redirect_stderr=False) as live:
        class _Screen:
            def update(self, renderable) -> None:
                live.update(renderable, refresh=True)
        yield _Screen()
