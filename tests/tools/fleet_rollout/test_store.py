"""The durable store: compare-and-set transitions, the lease and its fencing, on real SQLite."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tools.fleet_rollout.inventory import Host
from tools.fleet_rollout.plan import make_plan
from tools.fleet_rollout.spec import parse_spec
from tools.fleet_rollout.store import (
    LeaseHeld,
    LeaseLost,
    StaleState,
    Store,
    StoreError,
)


def created(path: Path, holder: str = "a") -> Store:
    s = Store(path, holder=holder)
    spec = parse_spec({"name": "r1", "policy": "p", "policy_text": "x"})
    s.create(spec, make_plan([Host(f"h{i}", f"h{i}:1", f"r{i % 2}") for i in range(4)], spec))
    return s


def test_transitions_are_compare_and_set_and_recorded(tmp_path: Path) -> None:
    s = created(tmp_path / "db")
    s.acquire("r1", 10)
    s.move("r1", "h0", "pending", "baselined", {"samples": 30}, {"baseline": [1, 2]})
    with pytest.raises(StaleState):
        s.move("r1", "h0", "pending", "baselined")
    assert s.host("r1", "h0").data == {"baseline": [1, 2]}
    t = s.transitions("r1", "h0")
    assert [(x["from"], x["to"], x["detail"]) for x in t] == [("pending", "baselined", {"samples": 30})]
    with pytest.raises(StoreError):
        s.create(s.rollout("r1").spec, make_plan([Host("x", "x:1", "r")], s.rollout("r1").spec))


def test_a_second_controller_is_refused_with_the_holder_until_the_lease_lapses(tmp_path: Path) -> None:
    a = created(tmp_path / "db", "alice@host1:11")
    b = Store(tmp_path / "db", holder="bob@host2:22")
    a.acquire("r1", 0.5)
    with pytest.raises(LeaseHeld) as e:
        b.acquire("r1", 10)
    assert "alice@host1:11" in str(e.value)
    time.sleep(0.6)
    b.acquire("r1", 10)  # a dead holder's lease lapsed
    with pytest.raises(LeaseLost):  # and the old holder can no longer write: fenced
        a.move("r1", "h0", "pending", "baselined")
    with pytest.raises(LeaseLost):
        a.renew("r1", 10)
    b.move("r1", "h0", "pending", "baselined")


def test_a_lease_of_a_process_gone_from_this_machine_is_not_live(tmp_path: Path) -> None:
    """A run that could not release its lease (it died, or the disk was full) blocks the
    next run on the same machine only while its process lives, not for the TTL."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    here = socket.gethostname()
    a = created(tmp_path / "db", f"alice@{here}:{gone.pid}")
    a.acquire("r1", 3600)
    bob = Store(tmp_path / "db", holder=f"bob@{here}:{os.getpid()}")
    bob.acquire("r1", 10)
    bob.release("r1")
    # a live process of this machine, or a holder elsewhere, still holds its lease
    for live in (f"alice@{here}:{os.getpid()}", f"alice@elsewhere:{gone.pid}"):
        Store(tmp_path / "db", holder=live).acquire("r1", 3600)
        with pytest.raises(LeaseHeld):
            Store(tmp_path / "db", holder=f"carol@{here}:1").acquire("r1", 10)
        Store(tmp_path / "db", holder=live).release("r1")
