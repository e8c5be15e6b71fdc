"""bench/fleet_hosts.py on 120 hosts: a real `scheduler serve`, the hosts registered
through its API, the fleet page's counts from every page of the host list
(the baseline) and from `GET /v1/fleet/hosts` checked equal by the bench (exit 1 when
they differ), and one JSON line with both times and the ratio. The mechanism, not the
numbers: those are the bench's to report."""

from __future__ import annotations


import pytest
from benchrun import bench_json

pytestmark = [pytest.mark.integration]


def test_the_summary_answers_as_the_host_list_does() -> None:
    got = bench_json("fleet_hosts.py", "--hosts", "120", "--repeats", "1", timeout=240)
    assert got["hosts"] == 120 and got["baseline"] == "host list"
    assert got["answer"]["hosts"] == 120 and got["answer"]["states"] == {"active": 120}
    assert got["answer"]["cpus_free"] == got["answer"]["cpus_total"] > 120  # no VMs: all free
    assert got["summary_bytes"] < got["host_list_bytes"] and got["ratio"] > 0
