"""The one rule that turns a share of CPUs in use into a bin (scheduler/utilization.py,
issue 40 A1): a share is an exact fraction of integers, bin i is [i/bins, (i+1)/bins)
with the last bin closed, and the peak's CPUs are kept to the milli-CPU, rounded half to
even from the decimal the host sent. Pure: the API and SQL paths are held to the same
answers in tests/scheduler/api/test_sched_utilization_edges.py."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.states import HostState
from scheduler.utilization import Day, Share, bin_of, distribution, hosts_in_bin, hours_share, milli, value


def peak_day(host: str, cpus: int, vms: float) -> Day:
    return Day(host, "r", HostState.ACTIVE, "", cpus, {"io": 0, "vms": milli(vms), "other": 0}, 60, [None] * 24)


@pytest.mark.parametrize("used, cpus, want", [
    (2.4, 48, 1),     # 5 %: the host; 2.4 / 48 * 20 is 0.9999999999999999 in floats
    (5, 100, 1),      # 5 %
    (0.3, 6, 1),      # 5 %; 0.3 / 6 * 20 is 0.9999999999999998 in floats
    (4.8, 48, 2),     # 10 %
    (0, 16, 0),
    (16, 16, 19),     # 100 %: the last bin
    (30, 16, 19),     # over its CPUs: capped
    (2.399, 48, 0),   # a milli-CPU under 5 %
    (2.401, 48, 1),
    (2.399999999999, 48, 1),  # finer than a milli-CPU: kept as 2.400, on the edge
])
def test_an_edge_share_opens_its_bin(used: float, cpus: int, want: int) -> None:
    d = peak_day("h", cpus, used)
    s = value(d, None, None)
    assert s is not None and bin_of(s, 20) == want
    exact = min(Fraction(1), Fraction(milli(used), 1000 * cpus))
    assert hosts_in_bin([d], window=None, cls=None, bins=20, index=want) == [("h", float(exact))]
    counts = distribution([d], window=None, group="state", bins=20, expected=1)["bins"]
    assert [b["counts"].get(HostState.ACTIVE, 0) for b in counts] == [int(i == want) for i in range(20)]


def test_exact_fractions_a_hair_either_side_of_an_edge() -> None:
    tera = 10 ** 12
    assert bin_of(Share(5 * tera - 1, 100 * tera), 20) == 0  # 1e-12 under 5 %
    assert bin_of(Share(5 * tera, 100 * tera), 20) == 1
    assert bin_of(Share(5 * tera + 1, 100 * tera), 20) == 1
    assert bin_of(Share(tera - 1, tera), 20) == 19 and bin_of(Share(tera, tera), 20) == 19
    assert bin_of(Share(0, 7), 1) == 0 and bin_of(Share(7, 7), 1) == 0


def test_hours_are_percent_hours_of_the_hours_with_data() -> None:
    assert hours_share([29] * 24, (0, 24)) == Share(29 * 24, 2400)
    assert bin_of(Share(29 * 24, 2400), 100) == 29  # 29 / 100 * 100 is 28.999999999999996 in floats
    assert hours_share([None] * 12 + [4, 6] * 6, (0, 24)) == Share(60, 1200)
    assert bin_of(Share(60, 1200), 20) == 1
    assert hours_share([None] * 24, (0, 24)) is None
    assert hours_share([100] * 24, (0, 24)).value() == 1.0  # type: ignore[union-attr]


@pytest.mark.parametrize("sent, kept", [
    (2.4, 2400), (0.3, 300), (0.1 + 0.2, 300), (65536.0, 65536000), (0, 0), (32767.999, 32767999),
    (2.3995, 2400), (2.3985, 2398),  # half to even on the decimal sent, not on the float's binary value
    (1e-4, 0), (5e-4, 0), (1.5e-3, 2),
])
def test_milli_rounds_the_decimal_the_host_sent(sent: float, kept: int) -> None:
    assert milli(sent) == kept


@settings(max_examples=400, deadline=None)
@given(total=st.integers(1, 65536 * 1000), bins=st.integers(1, 100), data=st.data())
def test_the_bin_is_the_floor_of_the_exact_share(total: int, bins: int, data: st.DataObject) -> None:
    """Against Fraction, on edges (k x total / bins when whole) and off them; and the
    float value lies within its bin's float edges (what the API lists beside the bin)."""
    k = data.draw(st.integers(0, bins))
    edge = k * total // bins
    used = data.draw(st.sampled_from([edge, edge + 1, max(0, edge - 1), total, total * 2]) | st.integers(0, total))
    s = Share(used, total)
    i = bin_of(s, bins)
    assert i == min(bins - 1, int(Fraction(used, total) * bins))
    v = s.value()
    assert i / bins <= v and (v < (i + 1) / bins or i == bins - 1)
