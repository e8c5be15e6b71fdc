"""The kprobe engine: what no kvm tracepoint shows, from kprobes (or fentry) on KVM functions.

Four views, each one bpftrace program built from the symbols `kprobe_table.resolve` found at
start (never a kernel module):
- `handling`: time from the vendor exit handler's entry to its return (`vmx_handle_exit`,
  `svm_handle_exit`, `pvm_handle_exit`), per exit reason. The reason comes from the
  kvm_exit tracepoint, read at the handler's return: it fires before the handler on VMX and
  inside it on SVM before 6.4 (svm_handle_exit's first statement on Debian's 6.1); where it
  never fires (PVM) every exit is "ALL". Fastpath exits that re-enter the guest without the handler are not
  in it (the tracepoint engines count them). Maps use bpf.py's names and log-linear
  buckets, so bpf.to_summary reads them: `latency --engine kprobe` prints the same document.
- `wakeups`: who woke which halted vCPU and how long it had slept (the halt probe, then the
  scheduler's `sched_waking` of that vCPU thread: immune to `kvm_vcpu_wake_up` being inlined,
  as it is into `kvm_vcpu_kick` on Debian's 6.1), `kvm_vcpu_wake_up`'s own calls (a symbol
  that never fired while its work was seen is named in `blind`), `kvm_vcpu_kick`,
  `pi_wakeup_handler` (posted-interrupt wake-ups, per host CPU).
- `timers`: `apic_timer_fn` (per host CPU: it runs in hrtimer interrupt context, not on
  the vCPU thread), `kvm_lapic_expired_hv_timer` per vCPU thread, next to the TSC_DEADLINE
  writes the kvm_msr tracepoint sees.
- `halts`: `kvm_vcpu_halt` (`kvm_vcpu_block` before 5.17) durations, `kvm_vcpu_on_spin`.

bpftrace runs in its text mode (not -f json): the output is what a person running the
same one-liner sees, so recordings from anywhere are fixtures, read by the parser every
engine shares (bpftrace_output: maps, hist()/lhist() blocks, printf lines). Program text
and summaries are pure; `run` is the only part touching the host; render.render_view
writes the views' documents.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from tools.kvm_utils import kprobe_table
from tools.kvm_utils.errors import NotAvailable
# The same log-linear bucket code as the tracepoint latency engine: its ll_stats turns the
# buckets into percentiles, so both engines report percentiles the same way.
from tools.kvm_utils.sources import bpfwindow
from tools.kvm_utils.sources.bpf import _BUCKET
from tools.kvm_utils.sources.bpftrace_output import Output, int_maps

VIEWS = ("handling", "wakeups", "timers", "halts")
#: the label of exits whose reason no tracepoint gave (kvm_exit silent, e.g. PVM)
NO_REASON = "ALL (no kvm_exit: reason unknown)"
#: the scheduler's wake-up of a task, in the waker's context: who woke a halted vCPU thread
WAKING = "tracepoint:sched:sched_waking"


@dataclass(frozen=True)
class ViewSpec:
    primary: tuple[str, ...]      # probe roles (kprobe_table.Probe.role) the view cannot do without
    secondary: tuple[str, ...]    # roles it shows when present


VIEW_SPECS = {
    "handling": ViewSpec(("exit handler entry to return",), ()),
    "wakeups": ViewSpec(("vCPU wake-up",), ("halt duration", "vCPU kick", "posted-interrupt wake-up")),
    "timers": ViewSpec(("LAPIC hrtimer expiry",), ("VMX preemption-timer expiry",)),
    "halts": ViewSpec(("halt duration",), ("pause-loop exit",)),
}

#: the first parameter's name in BTF, for fentry's `args` (kprobes use arg0)
FIRST_PARAM = {"kvm_vcpu_wake_up": "vcpu", "kvm_vcpu_kick": "vcpu", "kvm_vcpu_halt": "vcpu",
               "kvm_vcpu_block": "vcpu", "kvm_vcpu_on_spin": "me", "kvm_lapic_expired_hv_timer": "vcpu",
               "vmx_handle_exit": "vcpu", "svm_handle_exit": "vcpu", "pvm_handle_exit": "vcpu"}


class KprobeUnavailable(NotAvailable):
    """The engine cannot run here; the message names each missing symbol or refused facility."""


@dataclass(frozen=True)
class Style:
    """How probes are spelled for one attach mechanism and bpftrace version."""
    kind: str                 # "kprobe" | "fentry"
    entry: str
    ret: str
    args_dot: bool = False    # fentry args as args.NAME (bpftrace >= 0.21) rather than args->NAME

    def arg0(self, symbol: str) -> str:
        if self.kind == "kprobe":
            return "arg0"
        name = FIRST_PARAM.get(symbol, "vcpu")
        return f"(uint64)args.{name}" if self.args_dot else f"(uint64)args->{name}"


def style_for(kind: str, bpftrace_version: tuple[int, int, int]) -> Style:
    """kprobe/kretprobe everywhere; fentry is `kfunc`/`kretfunc` before bpftrace 0.20 (the
    fentry/fexit aliases came with bpftrace PR #2844, Nov 2023), and its arguments
    `args.NAME` from 0.21 (`args->NAME` deprecated there)."""
    if kind == "kprobe":
        return Style("kprobe", "kprobe", "kretprobe")
    if kind != "fentry":
        raise ValueError(f"attach kind {kind!r} is not kprobe or fentry")
    if bpftrace_version < (0, 20, 0):
        return Style("fentry", "kfunc", "kretfunc")
    return Style("fentry", "fentry", "fexit", args_dot=bpftrace_version >= (0, 21, 0))


@dataclass(frozen=True)
class Plan:
    view: str
    style: Style
    symbols: dict[str, str]                       # role -> symbol to attach
    lost: tuple[str, ...] = ()                    # secondary probes missing: what the output lacks
    vendor: str = ""                              # vmx/svm: kvm_exit names each exit; pvm: it never fires


def make_plan(view: str, res: kprobe_table.Resolution, style: Style) -> Plan:
    """Which symbols `view` attaches; KprobeUnavailable naming every missing primary symbol and
    what is lost without it."""
    spec = VIEW_SPECS[view]
    by_role = {p.probe.role: p for p in res.probes}
    symbols = {r: by_role[r].symbol for r in spec.primary + spec.secondary
               if by_role[r].status == "found" and by_role[r].symbol}
    missing = [by_role[r] for r in spec.primary if r not in symbols]
    if missing:
        where = f"{res.vendor}, kernel {res.kernel[0]}.{res.kernel[1]}"
        raise KprobeUnavailable(f"kprobe view {view!r} cannot run ({where}): "
                                + "; ".join(p.message for p in missing))
    lost = tuple(by_role[r].message for r in spec.secondary if by_role[r].status == "missing")
    return Plan(view, style, symbols, lost, res.vendor)


def view_coverage(res: kprobe_table.Resolution, has_waking: bool) -> list[tuple[str, bool, str]]:
    """Per view, for `doctor`: (view, usable?, what it attaches and what it is blind to here).
    Pure: from the table's resolution and whether sched:sched_waking exists."""
    by_role = {p.probe.role: p for p in res.probes}
    out: list[tuple[str, bool, str]] = []
    for view, spec in VIEW_SPECS.items():
        missing = [by_role[r].message for r in spec.primary if by_role[r].status != "found"]
        if missing:
            out.append((view, False, "blind: " + "; ".join(missing)))
            continue
        found = [by_role[r].symbol for r in spec.primary + spec.secondary if by_role[r].status == "found"]
        blind = [by_role[r].message for r in spec.secondary if by_role[r].status != "found"]
        extra = ""
        if view == "wakeups":
            if "halt duration" not in {r for r in spec.secondary if by_role[r].status == "found"}:
                blind.append("no halt probe: wakers only, not which vCPU nor how long it slept")
            elif has_waking:
                found.append("sched:sched_waking")
                extra = ("; who woke a halted vCPU comes from sched_waking, whichever function woke it "
                         f"({by_role['vCPU wake-up'].symbol} may be inlined into its callers, as on Debian's 6.1: "
                         "a run names it under `blind` when it never fired)")
            else:
                blind.append("no sched:sched_waking tracepoint: who woke a halted vCPU only where "
                             f"{by_role['vCPU wake-up'].symbol} is called out of line")
        detail = "probes " + ", ".join(found) + extra
        out.append((view, True, detail + ("; blind: " + "; ".join(blind) if blind else "")))
    return out


def _guard(pids: tuple[int, ...]) -> str:
    return ("if (" + " && ".join(f"pid != {int(p)}" for p in pids) + ") { return; } ") if pids else ""


def _handling(plan: Plan, pids: tuple[int, ...]) -> list[str]:
    s, sym = plan.style, plan.symbols["exit handler entry to return"]
    # Attach order (issue 42): bpftrace attaches the probes one by one, so while a guest runs
    # the handler probe may be in place before the tracepoint that names the reason; on
    # VMX/SVM an exit whose kvm_exit was not seen (@isa is 1 or 2 once it was) is dropped at
    # the handler's return, not counted as "reason unknown". Checked at the return, not the
    # entry: on SVM before 6.4 (Debian's 6.1) svm_handle_exit itself fires kvm_exit, after
    # its entry (VMX fires it in vmx_vcpu_run, before). Where it never fires (PVM) all count.
    seen = " && @isa[tid]" if plan.vendor in ("vmx", "svm") else ""
    return [
        "tracepoint:kvm:kvm_exit { @reason[tid] = args->exit_reason; @isa[tid] = args->isa; }",
        f"{s.entry}:{sym} {{ {_guard(pids)}@hs[tid] = nsecs; }}",
        f"{s.ret}:{sym} /@hs[tid]{seen}/ {{\n  $d = nsecs - @hs[tid]; $r = @reason[tid]; $i = @isa[tid];\n{_BUCKET}"
        "  @e_n[$i, $r] = count(); @e_sum[$i, $r] = sum($d); @e_min[$i, $r] = min($d); @e_max[$i, $r] = max($d);\n"
        "  @e_ll[$i, $r, $k] = count(); @t_n[tid] = count(); @x[tid, $i, $r] = count();\n"
        "  delete(@hs[tid]); delete(@reason[tid]); delete(@isa[tid]);\n}",
    ]


def _wakeups(plan: Plan, pids: tuple[int, ...]) -> list[str]:
    s, sy = plan.style, plan.symbols
    wake, halt = sy["vCPU wake-up"], sy.get("halt duration")
    out: list[str] = []
    if halt:
        # A halted vCPU is known by its struct kvm_vcpu pointer (what the wake-up and kick
        # functions take) and by its thread. Who woke it is the scheduler's wake-up of that
        # thread (sched_waking runs in the waker's context), whichever KVM function did it:
        # kvm_vcpu_wake_up is inlined into kvm_vcpu_kick and kvm_make_vcpu_request on
        # Debian's 6.1, so its probe never fires for the timer and IPI wake-ups (issue 42).
        # Its own probe still counts its out-of-line calls, so a never-hit symbol is named.
        out += [f"{s.entry}:{halt} {{ {_guard(pids)}$v = {s.arg0(halt)}; @hstart[$v] = nsecs; @vtid[$v] = tid; "
                "@vof[tid] = $v; @halted[tid] = nsecs; }",
                f"{s.ret}:{halt} /@vof[tid]/ {{ if (@halted[tid]) {{ @unslept[tid] = count(); }} "
                "delete(@hstart[@vof[tid]]); delete(@vof[tid]); delete(@halted[tid]); }",
                f"{WAKING} /@halted[args->pid]/ {{ @woke[tid, args->pid] = count(); "
                "@slept_ns = hist(nsecs - @halted[args->pid]); delete(@halted[args->pid]); }"]
        only_seen = "if (@vtid[$v] == 0) { return; } " if pids else ""
        out.append(f"{s.entry}:{wake} {{ $v = {s.arg0(wake)}; {only_seen}@wake_call[tid, @vtid[$v]] = count();\n"
                   "  if (@hstart[$v] == 0) { @wake_running[tid, @vtid[$v]] = count(); }\n}")
        if "vCPU kick" in sy:
            out.append(f"{s.entry}:{sy['vCPU kick']} {{ $v = {s.arg0(sy['vCPU kick'])}; {only_seen}"
                       "@kick[tid, @vtid[$v]] = count(); }")
    else:
        # no halt probe: nothing maps a vCPU pointer to its thread, so only wakers are known
        out.append(f"{s.entry}:{wake} {{ @wake_by[tid] = count(); }}")
        if "vCPU kick" in sy:
            out.append(f"{s.entry}:{sy['vCPU kick']} {{ @kick_by[tid] = count(); }}")
    if "posted-interrupt wake-up" in sy:
        out.append(f"{s.entry}:{sy['posted-interrupt wake-up']} {{ @pi_wake[cpu] = count(); }}")
    return out


def _timers(plan: Plan, pids: tuple[int, ...]) -> list[str]:
    s, sy = plan.style, plan.symbols
    out = [f"{s.entry}:{sy['LAPIC hrtimer expiry']} {{ @apic_timer[cpu] = count(); }}",
           f"tracepoint:kvm:kvm_msr /args->write && args->ecx == 0x6e0/ {{ {_guard(pids)}"
           "@tscdeadline_wrmsr[tid] = count(); }"]
    if "VMX preemption-timer expiry" in sy:
        out.append(f"{s.entry}:{sy['VMX preemption-timer expiry']} {{ {_guard(pids)}@hv_timer[tid] = count(); }}")
    return out


def _halts(plan: Plan, pids: tuple[int, ...]) -> list[str]:
    s, sy = plan.style, plan.symbols
    halt = sy["halt duration"]
    out = [f"{s.entry}:{halt} {{ {_guard(pids)}@hs[tid] = nsecs; }}",
           f"{s.ret}:{halt} /@hs[tid]/ {{ $d = nsecs - @hs[tid]; @halt_n[tid] = count(); "
           "@halt_ns_sum[tid] = sum($d); @halt_ns = hist($d); delete(@hs[tid]); }"]
    if "pause-loop exit" in sy:
        out.append(f"{s.entry}:{sy['pause-loop exit']} {{ {_guard(pids)}@spin[tid] = count(); }}")
    return out


_BUILD: dict[str, Callable[[Plan, tuple[int, ...]], list[str]]] = {
    "handling": _handling, "wakeups": _wakeups, "timers": _timers, "halts": _halts}
#: per-thread scratch maps, cleared in END so bpftrace does not print them
_SCRATCH = {"handling": ("hs", "reason", "isa"), "wakeups": ("hstart", "vtid", "vof", "halted"), "timers": (),
            "halts": ("hs",)}


def program(plan: Plan, duration: float | None, pids: Iterable[int] = ()) -> str:
    """The bpftrace program of `plan` (pids: only these VM processes' vCPU threads; wake-ups
    and kicks then only of vCPUs seen halting in them; host-CPU probes are never filtered)."""
    pids = tuple(sorted(set(int(p) for p in pids)))
    parts = [bpfwindow.begin(), *_BUILD[plan.view](plan, pids), *bpfwindow.stop(duration)]
    scratch = [m for m in _SCRATCH[plan.view] if plan.view != "wakeups" or "halt duration" in plan.symbols]
    parts.append("END { " + " ".join([*(f"clear(@{m});" for m in scratch), bpfwindow.CLEAR]) + " }")
    return "\n".join(parts) + "\n"


# ---- summaries ---------------------------------------------------------------------------

def handling_summary(parsed: Output):
    """`latency --engine kprobe`: the tracepoint engine's Summary of handler times; exits with
    no kvm_exit reason (isa 0) are labelled NO_REASON rather than UNKNOWN(0x00)."""
    from tools.kvm_utils.sources.bpf import to_summary
    maps = int_maps(parsed)
    summary = to_summary(maps, "kprobe-handling")
    if (0, 0) in maps.get("e_n", {}):
        from tools.kvm_utils.arch import exit_reason_name
        stale = exit_reason_name(None, 0)
        summary = replace(summary, exits=tuple(replace(r, reason=NO_REASON) if r.reason == stale else r
                                               for r in summary.exits))
    return summary


def handling_counts(parsed: Output, target_of: Callable[[int], object],
                    spec: Callable[[str, str], object]):
    """`exits --engine kprobe`: handler calls per thread and reason, as the counting engines'
    Counter keyed (target, spec)."""
    from collections import Counter

    from tools.kvm_utils.arch import ISA_TO_VENDOR, exit_reason_name
    out: Counter = Counter()
    for (tid, isa, code), n in int_maps(parsed).get("x", {}).items():
        label = NO_REASON if isa == 0 else exit_reason_name(ISA_TO_VENDOR.get(isa), code)
        out[(target_of(tid), spec("exit", label))] += n
    return out


def wake_up_blindness(maps: dict, plan: Plan | None) -> list[str]:
    """A wake-up symbol that never fired although its work was seen: inlined into its callers
    on this kernel (its out-of-line copy, which kallsyms and BTF list, serves other callers).
    kvm_vcpu_kick always calls kvm_vcpu_wake_up first, and a halted vCPU that the scheduler
    woke was woken through it, so either count with none of its own gives it away."""
    sym = (plan.symbols.get("vCPU wake-up") if plan else None) or "kvm_vcpu_wake_up"
    calls = sum(maps.get("wake_call", {}).values()) + sum(maps.get("wake_by", {}).values())
    if calls:
        return []
    woken = sum(maps.get("woke", {}).values())
    kicks = sum(maps.get("kick", {}).values()) + sum(maps.get("kick_by", {}).values())
    seen = [f"{woken} halted vCPUs were woken (sched_waking)"] if woken else []
    seen += [f"kvm_vcpu_kick, which calls it first, fired {kicks} times"] if kicks else []
    if not seen:
        return []
    return [f"{sym} never fired while {' and '.join(seen)}: it is inlined into its callers on this kernel "
            "(Debian's 6.1 inlines it into kvm_vcpu_kick and kvm_make_vcpu_request); woke_halted comes from "
            "sched:sched_waking, woke_running and wake_up_calls see only its out-of-line calls"]


def view_summary(view: str, parsed: Output, duration_s: float, plan: Plan | None = None,
                 name: Callable[[int], str] = str) -> dict:
    """Pure: a wakeups/timers/halts run -> its document: lists of rows (dicts) and
    histograms (tuples of aggregate.Bucket), which render.render_view writes as a table or
    JSON. `name(tid)` labels a thread."""
    m = int_maps(parsed)
    rate = (lambda n: round(n / duration_s, 1)) if duration_s > 0 else (lambda n: 0.0)

    def pairs(map_name: str, a: str, b: str) -> list[dict]:
        rows = sorted(m.get(map_name, {}).items(), key=lambda kv: (-kv[1], kv[0]))
        return [{a: name(k[0]), b: name(k[1]) if k[1] else None, "count": n, "rate": rate(n)} for k, n in rows]

    def singles(map_name: str, a: str, label: Callable[[int], object] = name) -> list[dict]:
        rows = sorted(m.get(map_name, {}).items(), key=lambda kv: (-kv[1], kv[0]))
        return [{a: label(k[0]), "count": n, "rate": rate(n)} for k, n in rows]

    doc: dict = {"view": view, "duration_s": round(duration_s, 3),
                 "symbols": dict(plan.symbols) if plan else {}, "lost": list(plan.lost) if plan else [],
                 "blind": []}
    if view == "wakeups":
        doc.update(woke_halted=pairs("woke", "waker", "vcpu"), woke_running=pairs("wake_running", "waker", "vcpu"),
                   wake_up_calls=pairs("wake_call", "waker", "vcpu"), halts_unslept=singles("unslept", "vcpu"),
                   kicks=pairs("kick", "kicker", "vcpu"), wakes_by=singles("wake_by", "waker"),
                   kicks_by=singles("kick_by", "kicker"), pi_wakeups=singles("pi_wake", "cpu", int),
                   halted_ns_hist=tuple(parsed.hists.get("slept_ns", {}).get((), ())),
                   blind=wake_up_blindness(m, plan))
    elif view == "timers":
        doc.update(apic_timer_fn=singles("apic_timer", "cpu", int), hv_timer=singles("hv_timer", "vcpu"),
                   tsc_deadline_wrmsr=singles("tscdeadline_wrmsr", "vcpu"))
    elif view == "halts":
        sums = m.get("halt_ns_sum", {})
        doc.update(halts=[{"vcpu": name(k[0]), "count": n, "rate": rate(n),
                           "mean_ns": round(sums.get(k, 0) / n, 1) if n else None}
                          for k, n in sorted(m.get("halt_n", {}).items(), key=lambda kv: (-kv[1], kv[0]))],
                   halt_ns_hist=tuple(parsed.hists.get("halt_ns", {}).get((), ())),
                   pause_loop_exits=singles("spin", "vcpu"))
    else:
        raise ValueError(f"view {view!r} has no document of its own (handling is `latency --engine kprobe`)")
    return doc


# ---- the host ----------------------------------------------------------------------------

def bpftrace_version(exe: str = "bpftrace") -> tuple[int, int, int] | None:
    path = shutil.which(exe)
    if path is None:
        return None
    r = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    m = re.search(r"v?(\d+)\.(\d+)\.(\d+)", r.stdout + r.stderr)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def resolve_here(kind: str, tracefs, release: str | None = None) -> kprobe_table.Resolution:
    """Resolve the table on this host: kprobes need the symbol in kallsyms; fentry needs it in
    BTF and, when ftrace's list is readable, in available_filter_functions."""
    import platform

    from tools.kvm_utils import symbols
    from tools.kvm_utils.record import host_vendor
    kall = symbols.kallsyms_report()
    btf = symbols.btf_report()
    if kind == "kprobe":
        available = kall.names or frozenset()
    else:
        available = btf.names or frozenset()
        ftrace = symbols.filter_functions_report(tracefs)
        if ftrace.names is not None:
            available = available & ftrace.names
    vendor = kprobe_table.engine_vendor(host_vendor(), (kall.names or frozenset()) | (btf.names or frozenset()))
    if vendor is None:
        raise KprobeUnavailable("no vmx/svm CPU flag and no pvm_handle_exit in kallsyms or BTF: no KVM "
                                "vendor whose functions the kprobe engine could attach to")
    return kprobe_table.resolve(kprobe_table.parse_version(release or platform.release()), vendor, available)


def auto_picks_kprobe(question: str, cpu_vendor: str | None, kind: str | None, why: str) -> tuple[bool, str]:
    """`--engine auto` for `exits`/`latency`: the kprobe engine only where tracepoints cannot
    answer, i.e. where kvm_exit does not fire (no vmx/svm flag: a software hypervisor such
    as PVM); (use it?, the sentence saying why)."""
    if cpu_vendor is not None:
        return False, f"kvm_exit names every exit on this {cpu_vendor} host: tracepoints answer {question}"
    if kind is None:
        return False, (f"kvm_exit does not fire here (no vmx/svm CPU flag); the kprobe engine would see "
                       f"exits at the exit handler but is unavailable: {why}")
    return True, f"kvm_exit does not fire here (no vmx/svm CPU flag): {question} from the exit handler, by {kind}"


def prepare(view: str, tracefs) -> Plan:
    """The plan for `view` on this host, or KprobeUnavailable saying exactly why not."""
    from tools.kvm_utils import doctor
    support = doctor.kprobe_engine_support(tracefs)
    if support.kind is None:
        raise KprobeUnavailable(f"the kprobe engine cannot run here: {support.why}")
    version = bpftrace_version()
    if version is None:
        raise KprobeUnavailable("bpftrace not found: apt-get install bpftrace")
    return make_plan(view, resolve_here(support.kind, tracefs), style_for(support.kind, version))


def run(plan: Plan, duration: float | None, pids: Iterable[int] = (), bpftrace: str = "bpftrace"
        ) -> tuple[Output, float]:
    """Run the plan's program until `duration` or Ctrl-C; (parsed text output, seconds from
    ready to the end). bpf.run_script in text mode: bpftrace is stopped the same way
    (bpf.stop), so it prints its maps."""
    from tools.kvm_utils.sources import bpf
    if shutil.which(bpftrace) is None:
        raise KprobeUnavailable("bpftrace not found: apt-get install bpftrace")
    return bpf.run_script(program(plan, duration, pids),
                          f"Tracing {plan.view} with {plan.style.entry} probes... Hit Ctrl-C to end.",
                          bpftrace, json_output=False)
