"""Issue 40 A1: a share of CPUs in use that lies exactly on a bin edge is binned in the
bin the edge opens, by every path that bins: ``GET /v1/fleet/utilization`` (by state
and by class), ``/utilization/hosts`` (the hosts of a bin and their value), and
``/utilization/heatmap`` (binned in the database), on SQLite and PostgreSQL. The
expected bins are worked out here with exact fractions of what each host sent (its
peak CPUs kept to the milli-CPU, half to even: scheduler/README.md), never with the
code under test."""

from __future__ import annotations

from collections import Counter
from decimal import ROUND_HALF_EVEN, Decimal
from fractions import Fraction

import pytest

from sched_helpers import ADM, HOST, Clock, host_body, make_client

T0 = 1_764_100_000.0  # 2025-11-25T19:46:40Z
DAY = "2025-11-25"

# host: (CPUs, peak CPUs in use io, vms, other as sent, host-local hours in percent)
HOSTS: dict[str, tuple[int, tuple[str, str, str], list[int | None]]] = {
    "t4-174": (48, ("0", "2.4", "0"), [5] * 24),                  # the issue's host: exactly 5 %
    "e-5of100": (100, ("0", "5", "0"), [4, 6] * 12),              # 5 %, and hours averaging 5 %
    "e-03of6": (6, ("0.3", "0", "0"), [None] * 12 + [10] * 12),   # 5 %; 10 % over the hours it has
    "e-48of48": (48, ("0", "4.8", "0"), [29] * 24),               # 10 %; 29 % (0.29 * 100 < 29 in floats)
    "e-split": (16, ("0.1", "0.6", "0.1"), [57] * 24),            # 5 %, its classes summed below it in floats; 57 % too
    "e-29of100": (100, ("0", "29", "0"), [58] * 24),              # 29 %: 0.29 * 100 < 29 in floats; 58 % too
    "e-zero": (12, ("0", "0", "0"), [0] * 24),
    "e-full": (16, ("2", "12", "2"), [100] * 24),                 # 100 %: the last bin
    "e-over": (16, ("10", "10", "10"), [None] * 23 + [100]),      # over its CPUs: capped, the last bin
    "e-milli-under": (48, ("0", "2.399", "0"), [33, 34, 33] * 8),  # a milli-CPU under 5 %; 1/3 exactly
    "e-1e-12-under": (48, ("0", "2.399999999999", "0"), [34, 33, 34] * 8),  # finer than kept: 5 %
    "e-third": (3, ("1", "0", "0"), [33] * 24),                   # 1/3: an edge with bins=3
    # the largest host: used x bins passes 32 bits (PostgreSQL's INTEGER) at 100 bins
    "e-big-half": (65536, ("32768", "0", "0"), [50] * 24),
    "e-big-over": (65536, ("65535.999", "65536", "65535.999"), [99] * 24),   # capped: the last bin
    "e-big-milli-under": (65536, ("32767.999", "0", "0"), [49] * 24),  # a milli-CPU under 50 %
}
CLASSES = ("io", "vms", "other")


def milli(sent: str) -> Fraction:
    return Fraction(Decimal(sent).quantize(Decimal("0.001"), rounding=ROUND_HALF_EVEN))


def share(name: str, window: str, cls: str | None = None) -> Fraction:
    cpus, peak, hours = HOSTS[name]
    if window == "peak":
        used = sum(milli(p) for c, p in zip(CLASSES, peak) if cls in (None, c))
        return min(Fraction(1), used / cpus)
    start, end = (int(h) for h in window.split("-"))
    got = [h for h in hours[start:end] if h is not None]
    return Fraction(sum(got), 100 * len(got))


def expected_bin(s: Fraction, bins: int) -> int:
    return min(bins - 1, int(s * bins))  # Fraction * int is exact; int() floors a non-negative


def day_body(cpus: int, peak: tuple[str, str, str], hours: list[int | None]) -> dict:
    return {"day": DAY, "utc_offset_min": 0, "cpus": cpus, "samples": 86400,
            "peak": {"start": "21:00", "end": "22:00", "samples": 3600,
                     **{c: float(p) for c, p in zip(CLASSES, peak)}},
            "hours": hours, "hist": [0] * 19 + [86400], "probe_p99_ms_max": None, "psi_some_avg10_max": None,
            "foreign_cpu_s": 0.0, "probe_failed": 0}


@pytest.fixture
def api(db_url):  # type: ignore[no-untyped-def]
    with make_client(db_url, clock=Clock(T0)) as c:
        for name, (cpus, peak, hours) in HOSTS.items():
            assert c.post("/v1/hosts", json=host_body(name), headers=HOST).status_code == 201
            r = c.post(f"/v1/hosts/{name}/days", json={"days": [day_body(cpus, peak, hours)]}, headers=HOST)
            assert r.status_code == 202, r.text
        yield c


def test_the_issue_host_on_5_percent_is_listed_in_5_to_10(api) -> None:  # type: ignore[no-untyped-def]
    """`GET /v1/fleet/utilization/hosts?day=D&bin=0` listed t4-174 (2.4 of 48 CPUs) as
    "5.0 %" under 0-5 %."""
    low = api.get("/v1/fleet/utilization/hosts", params={"day": DAY, "bin": 0}, headers=ADM).json()
    assert "t4-174" not in [h["host"] for h in low["hosts"]], low
    got = api.get("/v1/fleet/utilization/hosts", params={"day": DAY, "bin": 1}, headers=ADM).json()
    assert {"host": "t4-174", "value": 0.05} in got["hosts"], got
    assert (got["lo"], got["hi"]) == (0.05, 0.1)


@pytest.mark.parametrize("window", ["peak", "0-24", "12-24"])
@pytest.mark.parametrize("bins", [20, 100, 3])
def test_every_path_bins_an_exact_edge_share_alike(api, window: str, bins: int) -> None:  # type: ignore[no-untyped-def]
    """The distribution's counts, each bin's host list (with lo <= value < hi, the last
    bin's hi included), the heatmap's counts: all equal to the exact bins."""
    want = {n: expected_bin(share(n, window), bins) for n in HOSTS}
    counts = Counter(want.values())
    u = api.get("/v1/fleet/utilization", params={"day": DAY, "window": window, "group": "state", "bins": bins},
                headers=ADM)
    assert u.status_code == 200, u.text
    d = u.json()["day"]
    assert d["hosts_included"] == len(HOSTS)
    assert [sum(b["counts"].values()) for b in d["bins"]] == [counts[i] for i in range(bins)], (window, bins, want)
    for i in range(bins):
        r = api.get("/v1/fleet/utilization/hosts", params={"day": DAY, "window": window, "bins": bins, "bin": i},
                    headers=ADM)
        assert r.status_code == 200, r.text
        got = r.json()
        assert [h["host"] for h in got["hosts"]] == sorted(n for n, b in want.items() if b == i), (window, bins, i)
        for h in got["hosts"]:
            assert got["lo"] <= h["value"] and (h["value"] < got["hi"] or i == bins - 1 and h["value"] == 1.0), h
            assert h["value"] == float(share(h["host"], window)), h
    hm = api.get("/v1/fleet/utilization/heatmap", params={"day": DAY, "days": 1, "window": window, "bins": bins},
                 headers=ADM)
    assert hm.status_code == 200, hm.text
    assert hm.json()["days"] == [{"day": DAY, "counts": [counts[i] for i in range(bins)], "hosts": len(HOSTS)}]


@pytest.mark.parametrize("bins", [20, 100])
def test_the_split_by_class_bins_each_class_exactly(api, bins: int) -> None:  # type: ignore[no-untyped-def]
    d = api.get("/v1/fleet/utilization", params={"day": DAY, "group": "class", "bins": bins}, headers=ADM).json()["day"]
    for cls in CLASSES:
        want = {n: expected_bin(share(n, "peak", cls), bins) for n in HOSTS}
        counts = Counter(want.values())
        assert [b["counts"].get(cls, 0) for b in d["bins"]] == [counts[i] for i in range(bins)], (cls, want)
        for i in sorted(counts):
            got = api.get("/v1/fleet/utilization/hosts", params={"day": DAY, "bins": bins, "bin": i, "class": cls},
                          headers=ADM).json()
            assert [h["host"] for h in got["hosts"]] == sorted(n for n, b in want.items() if b == i), (cls, i)


def test_random_edges_over_many_days_heatmap_and_distribution_are_exact(db_url) -> None:  # type: ignore[no-untyped-def]
    """Days of shares on, a milli-CPU under and a milli-CPU over the edges of 20, 100, 7
    and 3 bins, on hosts of 1 to 65,536 CPUs: the heatmap (binned in the database) and
    the distribution of each day equal the exact bins, on both stores."""
    import datetime as dt
    import random
    rng = random.Random(40)
    days = [(dt.date(2025, 11, 25) - dt.timedelta(days=i)).isoformat() for i in range(30)][::-1]
    names = [f"r{i:02d}" for i in range(8)]
    used: dict[tuple[str, str], tuple[int, int]] = {}  # (host, day) -> (milli-CPUs, CPUs)
    with make_client(db_url, clock=Clock(T0)) as c:
        for name in names:
            assert c.post("/v1/hosts", json=host_body(name), headers=HOST).status_code == 201
            sent = []
            for day in days:
                cpus = rng.choice([1, 3, 6, 7, 12, 48, 96, 100, 65536])
                b, k = rng.choice([20, 100, 7, 3]), rng.randrange(0, 101)
                m = max(0, min(3 * 65536000, k * cpus * 1000 // b + rng.choice([-1, 0, 0, 1])))
                parts = [min(m, 65536000), min(max(0, m - 65536000), 65536000)]
                parts.append(m - sum(parts))
                used[name, day] = (m, cpus)
                peak = (str(Decimal(parts[0]) / 1000), str(Decimal(parts[1]) / 1000), str(Decimal(parts[2]) / 1000))
                body = day_body(cpus, peak, [None] * 24)
                sent.append(body | {"day": day})
            for j in range(0, len(sent), 3):
                r = c.post(f"/v1/hosts/{name}/days", json={"days": sent[j:j + 3]}, headers=HOST)
                assert r.status_code == 202, r.text
        for bins in (20, 100, 7, 3, 1):
            want = {d: Counter(expected_bin(min(Fraction(1), Fraction(m, 1000 * cpus)), bins)
                               for (_, day), (m, cpus) in used.items() if day == d) for d in days}
            hm = c.get("/v1/fleet/utilization/heatmap", params={"day": days[-1], "days": len(days), "bins": bins},
                       headers=ADM).json()
            assert [x["counts"] for x in hm["days"]] == [[want[d][i] for i in range(bins)] for d in days], bins
            for d in days[::7]:
                u = c.get("/v1/fleet/utilization", params={"day": d, "group": "state", "bins": bins},
                          headers=ADM).json()["day"]
                assert [sum(x["counts"].values()) for x in u["bins"]] == [want[d][i] for i in range(bins)], (d, bins)
