"""The gate: is the IO service on a converted host worse than before, and worse than
on unconverted hosts over the same window?

Automated canary analysis in the way Kayenta/Spinnaker does it, scaled down: each
metric's samples over the soak window are compared with (1) the host's own baseline
window before the change and (2) the pooled samples of control hosts (not converted)
over the same soak window, with a one-sided Mann-Whitney U test (scipy): a metric
fails a comparison when the soak samples are significantly higher (p < alpha) *and*
their median rose by more than the spec allows (plus a small absolute floor, so a
metric at zero does not fail on noise). Ceilings (PSI, foreign CPU on io_cpus, failed
probes) fail on their own. Too few samples, or none, is *undecided*: the rollout
pauses for the operator instead of passing the host.

A rise over the host's own baseline that the controls share is the fleet's, not the
conversion's: when the controls' samples over the host's baseline window are known too,
and the controls rose significantly from then to the soak window, the host's baseline
allowance grows by the controls' rise (their soak median over their baseline median; a
difference in differences). The host must still not be worse than the controls now.

Pure: samples in, verdict out; the engine fetches the samples (GetHostStats).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from tools.fleet_rollout.spec import Gate

# Absolute rise a comparison must also exceed, per metric (units of the metric).
RISE_FLOOR = {"psi_some_avg10": 1.0, "probe_p99_ms": 0.2}
CEILING_QUANTILE = 0.9  # ceilings judge the window's 90th percentile, not one spike


@dataclass(frozen=True)
class Sample:
    """One IO-health interval of one host (a GetHostStats sample, reduced)."""

    at: float
    psi_some_avg10: float | None
    probe_p99_ms: float | None
    foreign_cpu: float  # CPU-seconds per second of foreign user threads on io_cpus
    probe_failed: int

    def to_dict(self) -> dict:
        return {"at": self.at, "psi": self.psi_some_avg10, "p99": self.probe_p99_ms,
                "foreign": self.foreign_cpu, "failed": self.probe_failed}

    @classmethod
    def from_dict(cls, d: dict) -> Sample:
        return cls(d["at"], d["psi"], d["p99"], d["foreign"], d["failed"])


@dataclass
class Verdict:
    decision: str  # "pass" | "fail" | "undecided"
    reasons: list[str] = field(default_factory=list)
    numbers: dict[str, dict] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"decision": self.decision, "reasons": self.reasons, "numbers": self.numbers}


def _values(samples: Sequence[Sample], metric: str) -> list[float]:
    return [v for s in samples if (v := getattr(s, metric)) is not None]


def judgeable(samples: Sequence[Sample]) -> int:
    """How many of ``samples`` the gate can compare: the fewest of any metric it compares
    that the host measures (after a hostd outage the first samples may carry PSI but no
    probe round trip)."""
    measured = [n for m in RISE_FLOOR if (n := len(_values(samples, m)))]
    return min(measured) if measured else len(samples)


def _quantile(v: list[float], q: float) -> float:
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


def compare(soak: list[float], ref: list[float], rise_pct: float, floor: float, alpha: float,
            min_samples: int, scale: float = 1.0) -> tuple[str, dict]:
    """One metric, one reference: ("pass" | "fail" | "undecided", the numbers). ``scale``:
    the reference's median is taken as this many times itself (the fleet's rise over a
    host's baseline, ``fleet_rise``)."""
    if len(soak) < min_samples or len(ref) < min_samples:
        return "undecided", {"n": len(soak), "n_ref": len(ref), "why": f"fewer than {min_samples} samples"}
    m_soak, m_ref = statistics.median(soak), statistics.median(ref)
    if len(set(soak) | set(ref)) == 1:
        p = 1.0  # identical constants: nothing to test (scipy would warn)
    else:
        # scipy.stats costs ~0.9 s of CPU to import: every `fleet-rollout status` paid it
        from scipy.stats import mannwhitneyu
        p = float(mannwhitneyu(soak, ref, alternative="greater").pvalue)
    allowed = m_ref * scale * (1 + rise_pct / 100) + floor
    nums = {"median": round(m_soak, 4), "median_ref": round(m_ref, 4), "p": round(p, 6),
            "allowed": round(allowed, 4), "n": len(soak), "n_ref": len(ref)}
    if scale != 1.0:
        nums["fleet_rise"] = round(scale, 4)
    return ("fail" if p < alpha and m_soak > allowed else "pass"), nums


def fleet_rise(controls: list[float], controls_baseline: list[float], alpha: float,
               min_samples: int) -> tuple[float, dict] | None:
    """How much the controls rose from the host's baseline window to its soak window (the
    ratio of their medians), if they rose significantly; None if not, or if either window
    has too few samples or a baseline median of zero."""
    if len(controls) < min_samples or len(controls_baseline) < min_samples:
        return None
    d, nums = compare(controls, controls_baseline, 0.0, 0.0, alpha, min_samples)
    if d != "fail" or nums["median_ref"] <= 0:
        return None
    return nums["median"] / nums["median_ref"], nums


def judge(soak: Sequence[Sample], baseline: Sequence[Sample] | None, controls: Sequence[Sample],
          gate: Gate, controls_baseline: Sequence[Sample] = ()) -> Verdict:
    """``baseline`` None: the spec measures no baseline (steps.baseline_s = 0).
    ``controls_baseline``: the controls' samples over the host's baseline window (empty:
    not known, and a rise over the baseline is judged on the host's samples alone)."""
    v = Verdict("pass")
    if len(soak) < gate.min_samples:
        return Verdict("undecided", [f"soak window has {len(soak)} samples, fewer than {gate.min_samples}"])
    rises = {"psi_some_avg10": gate.psi_rise_pct, "probe_p99_ms": gate.probe_p99_rise_pct}
    for metric, pct in rises.items():
        s = _values(soak, metric)
        if not s and not _values(baseline or [], metric):
            continue  # the host does not measure it (no probe; no PSI): nothing to judge
        refs = [("baseline", _values(baseline, metric))] if baseline is not None else []
        if controls:
            refs.append(("controls", _values(controls, metric)))
        for ref_name, ref in refs:
            d, nums = compare(s, ref, pct, RISE_FLOOR[metric], gate.alpha, gate.min_samples)
            if d == "fail" and ref_name == "baseline" and controls_baseline and (
                    rise := fleet_rise(_values(controls, metric), _values(controls_baseline, metric),
                                       gate.alpha, gate.min_samples)) is not None:
                factor, fleet = rise
                v.numbers[f"{metric}/fleet"] = {**fleet, "rise": round(factor, 4)}
                # the allowance over the baseline, grown by what the controls rose
                d, nums = compare(s, ref, pct, RISE_FLOOR[metric], gate.alpha, gate.min_samples, scale=factor)
                if d == "pass":
                    v.reasons.append(f"{metric} rose over its baseline (median {nums['median_ref']} -> "
                                     f"{nums['median']}) as its controls did (x{factor:.2f}): the fleet's, passed")
            v.numbers[f"{metric}/{ref_name}"] = nums
            if d == "fail":
                v.reasons.append(f"{metric} rose over its {ref_name}: median {nums['median']} > allowed "
                                 f"{nums['allowed']} (p={nums['p']})")
            elif d == "undecided":
                v.reasons.append(f"{metric} vs {ref_name}: {nums['why']}")
            v.decision = _worse(v.decision, d)
    _ceilings(soak, gate, v)
    return v


def _ceilings(soak: Sequence[Sample], gate: Gate, v: Verdict) -> None:
    psi = _values(soak, "psi_some_avg10")
    if gate.psi_some_avg10_max is not None and psi:
        q = _quantile(psi, CEILING_QUANTILE)
        v.numbers["psi_some_avg10/ceiling"] = {"p90": q, "max": gate.psi_some_avg10_max}
        if q > gate.psi_some_avg10_max:
            v.reasons.append(f"psi_some_avg10 p90 {q} over the ceiling {gate.psi_some_avg10_max}")
            v.decision = "fail"
    if gate.foreign_cpu_max is not None:
        q = _quantile(_values(soak, "foreign_cpu"), CEILING_QUANTILE)
        v.numbers["foreign_cpu/ceiling"] = {"p90": round(q, 4), "max": gate.foreign_cpu_max}
        if q > gate.foreign_cpu_max:
            v.reasons.append(f"foreign CPU on io_cpus p90 {q:.3f} s/s over the ceiling {gate.foreign_cpu_max}")
            v.decision = "fail"
    if gate.probe_failed_max is not None:
        failed = sum(s.probe_failed for s in soak)
        v.numbers["probe_failed/ceiling"] = {"sum": failed, "max": gate.probe_failed_max}
        if failed > gate.probe_failed_max:
            v.reasons.append(f"{failed} failed probes over the allowed {gate.probe_failed_max}")
            v.decision = "fail"


def _worse(a: str, b: str) -> str:
    order = {"pass": 0, "undecided": 1, "fail": 2}
    return a if order[a] >= order[b] else b
