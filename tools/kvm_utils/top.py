"""`top`: a live full-screen view of exits per VM and per reason/event (perf counting mode).

The counters are `exits`' (live.py): one perf tracepoint counter per (vCPU thread, reason
filter or event), re-scanned every interval for new VMs. `frame()` is pure (counter deltas
-> rows, sorted); `render/tui.py` draws it. Keys: r/t/n sort by rate/total/name, q quits.
`--once`, or stdout not a terminal: collect one interval and print one frame.
"""

from __future__ import annotations

import argparse
import os
import select
import sys
import termios
import time
import tty
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from collections.abc import Iterator

from tools.kvm_utils import live
from tools.kvm_utils.arch import Vendor
from tools.kvm_utils.record import host_vendor

SORTS = ("rate", "total", "name")
KEYS = {"r": "rate", "t": "total", "n": "name"}


@dataclass(frozen=True)
class Row:
    key: str            # VM name, or reason/event label
    kind: str           # "vm" | "exit" | "user" | "event"
    rate: float         # per second over the last interval
    total: int          # since start
    extra: str = ""     # VM: "pid N, K vCPUs, top: ..."


@dataclass(frozen=True)
class Frame:
    elapsed: float
    step: float
    sort: str
    scope: str
    vendor: str | None
    vms: tuple[Row, ...]
    reasons: tuple[Row, ...]

    @property
    def exit_rate(self) -> float:
        return sum(r.rate for r in self.reasons if r.kind == "exit")


def _sorted(rows: list[Row], sort: str) -> tuple[Row, ...]:
    if sort == "name":
        return tuple(sorted(rows, key=lambda r: (r.kind, r.key)))
    attr = "rate" if sort == "rate" else "total"
    return tuple(sorted(rows, key=lambda r: (-getattr(r, attr), -r.total, r.key)))


def frame(delta: Counter, totals: Counter, step: float, elapsed: float, sort: str = "rate",
          scope: str = "threads", vendor: str | None = None) -> Frame:
    """Pure: counter deltas of the last interval + totals -> sorted rows per VM and per label.

    A VM's rate counts every kvm event of its threads (exits + userspace exits + events), so
    VMs show up on hosts whose kvm_exit is silent (PVM) too."""
    per = lambda c: c / step if step > 0 else 0.0  # noqa: E731
    lab_d: Counter = Counter()
    lab_t: Counter = Counter()
    vm_d: Counter = Counter()
    vm_t: Counter = Counter()
    vm_top: dict[str, Counter] = {}
    vm_info: dict[str, tuple[set, set]] = {}
    for src, dst, vdst in ((delta, lab_d, vm_d), (totals, lab_t, vm_t)):
        for (t, s), n in src.items():
            dst[(s.kind, s.label)] += n
            vdst[t.vm] += n
            pids, tids = vm_info.setdefault(t.vm, (set(), set()))
            if t.pid is not None:
                pids.add(t.pid)
            if t.tid >= 0:
                tids.add(t.tid)
            if src is delta and n:
                label = f"userspace {s.label}" if s.kind == "user" else s.label
                vm_top.setdefault(t.vm, Counter())[label] += n
    reasons = [Row(label, kind, round(per(lab_d[(kind, label)]), 1), lab_t[(kind, label)])
               for (kind, label) in lab_t if lab_t[(kind, label)]]
    vms = []
    for vm, (pids, tids) in vm_info.items():
        top = ", ".join(f"{lbl} {n}" for lbl, n in vm_top.get(vm, Counter()).most_common(2)) or "idle"
        pid = ",".join(map(str, sorted(pids))) or "-"
        vms.append(Row(vm, "vm", round(per(vm_d[vm]), 1), vm_t[vm],
                       f"pid {pid}, {len(tids) or '-'} vCPU thread(s), top: {top}"))
    return Frame(round(elapsed, 1), step, sort, scope, vendor, _sorted(vms, sort), _sorted(reasons, sort))


@contextmanager
def _cbreak(stream) -> Iterator[bool]:
    """Single-key input from a terminal; yields False (no keys) when stdin is not one."""
    if not stream.isatty():
        yield False
        return
    fd = stream.fileno()
    old = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield True
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, old)


def _wait_key(until: float, keys: bool) -> str | None:
    """Sleep until `until` (monotonic), returning early with a key if one is pressed."""
    while (left := until - time.monotonic()) > 0:
        if not keys:
            time.sleep(left)
            return None
        r, _, _ = select.select([sys.stdin], [], [], left)
        if r:
            return os.read(sys.stdin.fileno(), 1).decode(errors="replace")
    return None


def run_top(args: argparse.Namespace) -> int:
    from tools.kvm_utils.render import tui
    vendor = Vendor(v) if (v := host_vendor()) else None
    counters, engine = live.open_counters(args, vendor)
    once = args.once or not sys.stdout.isatty()
    sort = args.sort
    seen: set[int] = set()
    totals: Counter = Counter()
    try:
        system = live.start_targets(counters, args, engine, seen)
        scope = "system" if system else "threads"
        what = ("every thread in one BPF program" if engine == "bpf" else
                f"{len(counters.targets)} {'CPUs' if system else 'vCPU threads'}, {len(counters.fds)} counters")
        print(f"kvm-utils top: counting {what}", file=sys.stderr, flush=True)
        t0 = last = time.monotonic()
        if once:
            time.sleep(args.interval)
            d = counters.delta()
            totals.update(d)
            now = time.monotonic()
            tui.print_frame(frame(d, totals, now - last, now - t0, sort, scope, vendor and vendor.value))
            return 0
        with _cbreak(sys.stdin) as keys, tui.live_screen() as screen:
            deadline = None if args.duration is None else t0 + args.duration
            d: Counter = Counter()
            step = args.interval
            while deadline is None or time.monotonic() < deadline:
                tick = last + args.interval if deadline is None else min(last + args.interval, deadline)
                key = _wait_key(tick, keys)
                if key == "q":
                    break
                if key in KEYS:            # re-sort the current frame at once
                    sort = KEYS[key]
                elif key is None:          # interval over: new counts
                    d = counters.delta()
                    totals.update(d)
                    now = time.monotonic()
                    step, last = now - last, now
                    live.pick_up_new_threads(counters, args, engine, system, seen)
                screen.update(tui.render_frame(frame(d, totals, step, time.monotonic() - t0, sort, scope,
                                                     vendor and vendor.value)))
    except KeyboardInterrupt:
        pass
    finally:
        counters.close()
    return 0
