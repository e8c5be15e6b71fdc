"""fleet-rollout's side of the rollouts the scheduler keeps (tools/fleet_rollout/store.py
against a real scheduler app, conftest.py): the API's refusals arrive as the store's
errors the engine acts on (a stale state, a held or lost lease), a lease of a process
gone from this machine is taken over at once, and a scheduler that does not answer is
one line naming it. The API's own rules are tested in tests/scheduler/api/."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time

import pytest

from tools.fleet_rollout.clients import Scheduler
from tools.fleet_rollout.inventory import Host
from tools.fleet_rollout.plan import make_plan
from tools.fleet_rollout.spec import parse_spec
from tools.fleet_rollout.store import (LeaseHeld, LeaseLost, StaleFence, StaleState, Store, StoreError,
                                      StoreUnavailable)


def created(store: Store) -> Store:
    spec = parse_spec({"name": "r1", "policy": "p", "policy_text": "x"})
    store.create(spec, make_plan([Host(f"h{i}", f"h{i}:1", f"r{i % 2}") for i in range(4)], spec))
    return store


def test_transitions_are_compare_and_set_and_recorded(rollouts) -> None:  # type: ignore[no-untyped-def]
    s = created(rollouts())
    s.acquire("r1", 10)
    s.move("r1", "h0", "pending", "baselined", {"samples": 30}, {"baseline": [1, 2]})
    with pytest.raises(StaleState):
        s.move("r1", "h0", "pending", "baselined")
    assert s.host("r1", "h0").data == {"baseline": [1, 2]}
    assert s.brief("r1")[0].data == {}  # the poll leaves the baseline out
    t = s.transitions("r1", "h0")
    assert [(x["from"], x["to"], x["detail"]) for x in t] == [("pending", "baselined", {"samples": 30})]
    with pytest.raises(StoreError, match="hyb.rollout.exists"):
        s.create(s.rollout("r1").spec, make_plan([Host("x", "x:1", "r")], s.rollout("r1").spec))
    assert s.find("nope") is None


def test_a_second_controller_is_refused_with_the_holder_until_the_lease_lapses(rollouts) -> None:  # type: ignore[no-untyped-def]
    a = created(rollouts("alice@host1:11"))
    b = rollouts("bob@host2:22")
    assert a.acquire("r1", 0.5) == 1
    with pytest.raises(LeaseHeld) as e:
        b.acquire("r1", 10)
    assert "is being run by rollout-admin-token's controller alice@host1:11 (fence 1," in str(e.value)
    time.sleep(0.6)
    assert b.acquire("r1", 10) == 2  # a dead holder's lease lapsed: the next fence
    with pytest.raises(StaleFence) as e:  # and the old holder can no longer write: fenced
        a.move("r1", "h0", "pending", "baselined")
    assert "fence 1 is stale: rollout-admin-token's controller bob@host2:22 took the lease at fence 2 at " \
        in str(e.value)
    with pytest.raises(LeaseLost):
        a.renew("r1", 10)
    b.move("r1", "h0", "pending", "baselined")
    assert [(t["holder"], t["fence"]) for t in b.transitions("r1", "h0")] == [("bob@host2:22", 2)]


def test_two_controllers_racing_for_the_lease_get_increasing_fences_and_the_losers_writes_are_refused(
        rollouts) -> None:  # type: ignore[no-untyped-def]
    """Both ask at once: one gets the lease, the other LeaseHeld. Each later take (a
    lapsed lease, a holder found dead) gets a greater fence, and every write under an
    older one is refused, whatever it is, naming who took the lease."""
    created(rollouts())
    ctl = [rollouts(f"ctl-{i}") for i in range(2)]
    start = threading.Barrier(2)
    got: dict[int, object] = {}

    def take(i: int) -> None:
        start.wait()
        try:
            got[i] = ctl[i].acquire("r1", 0.5)
        except LeaseHeld as e:
            got[i] = e
    threads = [threading.Thread(target=take, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    (winner,) = [i for i, g in got.items() if g == 1]
    loser = 1 - winner
    assert isinstance(got[loser], LeaseHeld), got
    fences = [1]
    for rnd in range(2):
        time.sleep(0.6)  # the winner's lease lapses
        fences.append(ctl[loser].acquire("r1", 0.5))
        for write in (lambda: ctl[winner].move("r1", "h0", "pending", "baselined"),
                      lambda: ctl[winner].note("r1", "h0", {"x": 1}),
                      lambda: ctl[winner].set_rollout("r1", "halted", expect="running"),
                      lambda: ctl[winner].renew("r1", 5)):
            with pytest.raises(StaleFence, match=f"took the lease at fence {fences[-1]} at "):
                write()
        winner, loser = loser, winner
    assert fences == [1, 2, 3]
    assert ctl[winner].state("r1") == ("running", 0)
    assert [h.state for h in ctl[winner].brief("r1")] == ["pending"] * 4


def test_a_lease_of_a_process_gone_from_this_machine_is_not_live(rollouts) -> None:  # type: ignore[no-untyped-def]
    """A run that could not release its lease (it died, or the scheduler's disk was full)
    blocks the next run on the same machine only while its process lives."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    here = socket.gethostname()
    created(rollouts(f"alice@{here}:{gone.pid}")).acquire("r1", 3600)
    bob = rollouts(f"bob@{here}:{os.getpid()}")
    bob.acquire("r1", 10)
    bob.release("r1")
    # a live process of this machine, or a holder elsewhere, still holds its lease
    for live in (f"alice@{here}:{os.getpid()}", f"alice@elsewhere:{gone.pid}"):
        holder = rollouts(live)
        holder.acquire("r1", 3600)
        with pytest.raises(LeaseHeld):
            rollouts(f"carol@{here}:1").acquire("r1", 10)
        holder.release("r1")


def test_a_scheduler_that_does_not_answer_is_one_line_after_the_retries() -> None:
    s = Store(Scheduler("http://127.0.0.1:9", "t"), holder="c1", retry_s=1.0)  # nothing listens on port 9
    t0 = time.monotonic()
    with pytest.raises(StoreUnavailable) as e:
        s.rollouts()
    assert 1.0 <= time.monotonic() - t0 < 5
    msg = str(e.value)
    assert msg.startswith("rollout state at http://127.0.0.1:9: scheduler GET /v1/rollouts: ") and "\n" not in msg
    s.api.close()
