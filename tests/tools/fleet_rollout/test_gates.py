"""The gate's decisions on samples with known distributions."""

from __future__ import annotations

import random

from tools.fleet_rollout.gates import Sample, judge
from tools.fleet_rollout.spec import Gate


def window(n: int, psi: float, p99: float | None = 2.0, foreign: float = 0.0, failed: int = 0,
           seed: int = 1) -> list[Sample]:
    rnd = random.Random(seed)
    return [Sample(float(i), max(0.0, psi + rnd.gauss(0, psi * 0.1 + 0.05)),
                   None if p99 is None else max(0.0, p99 + rnd.gauss(0, p99 * 0.05)), foreign, failed)
            for i in range(n)]


def test_a_healthy_host_passes() -> None:
    v = judge(window(30, 2.0, seed=1), window(30, 2.0, seed=2), window(60, 2.0, seed=3), Gate())
    assert v.decision == "pass", v.reasons
    assert set(v.numbers) >= {"psi_some_avg10/baseline", "psi_some_avg10/controls", "probe_p99_ms/controls"}


def test_a_probe_p99_rise_over_the_allowance_fails_against_both_references() -> None:
    v = judge(window(30, 2.0, p99=3.0, seed=1), window(30, 2.0, seed=2), window(60, 2.0, seed=3), Gate())
    assert v.decision == "fail"
    assert any("probe_p99_ms rose over its baseline" in r for r in v.reasons)
    assert any("probe_p99_ms rose over its controls" in r for r in v.reasons)
    assert v.numbers["probe_p99_ms/baseline"]["p"] < 0.01


def test_a_significant_rise_inside_the_allowance_passes() -> None:
    # 5 % higher, very significant with 200 samples, but the spec allows 10 %
    v = judge(window(200, 2.0, p99=2.1, seed=1), window(200, 2.0, p99=2.0, seed=2), [], Gate())
    assert v.numbers["probe_p99_ms/baseline"]["p"] < 0.01
    assert v.decision == "pass", v.reasons


def test_a_large_rise_in_few_noisy_samples_is_not_significant() -> None:
    soak = [Sample(i, 2.0, x, 0.0, 0) for i, x in enumerate([1, 9, 1, 9, 1, 9, 1, 9, 1, 9])]
    base = [Sample(i, 2.0, x, 0.0, 0) for i, x in enumerate([9, 1, 9, 1, 9, 1, 9, 1, 9, 2])]
    assert judge(soak, base, [], Gate()).decision == "pass"


def test_ceilings_fail_on_their_own() -> None:
    v = judge(window(30, 20.0, seed=1), window(30, 20.0, seed=2), [], Gate(psi_some_avg10_max=10))
    assert v.decision == "fail" and any("over the ceiling 10" in r for r in v.reasons)
    v = judge(window(30, 1.0, foreign=0.3), window(30, 1.0, seed=2), [], Gate())
    assert v.decision == "fail" and any("foreign CPU" in r for r in v.reasons)
    v = judge(window(30, 1.0, failed=1), window(30, 1.0, seed=2), [], Gate())
    assert v.decision == "fail" and any("failed probes" in r for r in v.reasons)


def test_too_few_samples_is_undecided_never_a_pass() -> None:
    assert judge(window(3, 1.0), window(30, 1.0), [], Gate()).decision == "undecided"
    v = judge(window(30, 1.0), window(4, 1.0), [], Gate())
    assert v.decision == "undecided" and any("fewer than 10 samples" in r for r in v.reasons)


def test_a_host_without_a_probe_is_judged_on_what_it_has() -> None:
    v = judge(window(30, 1.0, p99=None), window(30, 1.0, p99=None, seed=2), [], Gate())
    assert v.decision == "pass" and not any(k.startswith("probe_p99") for k in v.numbers)
    assert judge(window(30, 1.0, p99=None), None, [], Gate()).decision == "pass"


def test_a_rise_the_controls_share_over_the_same_windows_is_the_fleets() -> None:
    """Load rose across the fleet between the baseline and the soak (probe p99 2 -> 3 ms on
    the host and on its controls alike): the host is no worse than its controls, and its
    rise over its own baseline is the controls' rise, so it passes and says why. Without
    the controls' baseline samples the same host fails, as before."""
    soak, base = window(30, 2.0, p99=3.0, seed=1), window(30, 2.0, p99=2.0, seed=2)
    controls, controls_base = window(60, 2.0, p99=3.0, seed=3), window(60, 2.0, p99=2.0, seed=4)
    v = judge(soak, base, controls, Gate(), controls_base)
    assert v.decision == "pass", v.reasons
    assert 1.4 < v.numbers["probe_p99_ms/fleet"]["rise"] < 1.6, v.numbers
    assert v.numbers["probe_p99_ms/baseline"]["fleet_rise"] == v.numbers["probe_p99_ms/fleet"]["rise"]
    assert any("probe_p99_ms rose over its baseline" in r and "as its controls did" in r for r in v.reasons)
    assert judge(soak, base, controls, Gate()).decision == "fail"


def test_a_host_that_rose_more_than_its_controls_still_fails() -> None:
    """The controls rose 2 -> 3 ms, the host 2 -> 4.5: over its baseline grown by the
    controls' rise (2 x 1.5 x 1.1 + 0.2 = 3.5) and over its controls now."""
    v = judge(window(30, 2.0, p99=4.5, seed=1), window(30, 2.0, seed=2), window(60, 2.0, p99=3.0, seed=3),
              Gate(), window(60, 2.0, seed=4))
    assert v.decision == "fail", v.reasons
    assert any("probe_p99_ms rose over its baseline" in r and "allowed 3." in r for r in v.reasons), v.reasons
    assert any("probe_p99_ms rose over its controls" in r for r in v.reasons)


def test_controls_that_did_not_rise_explain_nothing() -> None:
    """The controls' p99 stayed at 2 ms while the host's went to 3: no fleet rise, the
    baseline comparison fails as it would without them."""
    v = judge(window(30, 2.0, p99=3.0, seed=1), window(30, 2.0, seed=2), window(60, 2.0, seed=3), Gate(),
              window(60, 2.0, seed=4))
    assert v.decision == "fail"
    assert "probe_p99_ms/fleet" not in v.numbers
    assert any("probe_p99_ms rose over its baseline" in r for r in v.reasons)
