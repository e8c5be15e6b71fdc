"""Claims in batches (``Placer.claim_many`` through ``VmService.create_many``, what the
API's claim thread runs), on SQLite and PostgreSQL: several VMs in one transaction never
share a CPU, a replay inside a batch returns the earlier VM, a batch that must roll back
(the same Idempotency-Key twice in one batch) is redone one by one and the index is
reloaded from the database, and the claim queue hands every request its own answer."""

from __future__ import annotations

import random
import asyncio
import threading
import time

import pytest
from sqlalchemy import select

from tools.dev.host_shapes import SHAPES, Shape, make_layout
from sched_helpers import ADM, HOST, Clock, host_body, make_client
from scheduler.db.models import LIVE, Audit, Host, Vm
from scheduler.errors import NoValidHost
from scheduler.fit import HostView, VmWant, fit_vm
from scheduler.resources import Allocation, Usage, host_from_layout
from scheduler.schemas.vms import VmCreate
from scheduler.service.claimq import ClaimQueue

# xdist: this worker's own PostgreSQL: not the machine group
pytestmark = [pytest.mark.xdist_group("sched-claim-batch")]

SMALL = Shape("small", nodes=2, cores_per_node=4, smt=2, io_cores_per_node=1, host_cores=1,
              pages_2m_per_node=2048, vfs_per_node=0, disks_per_node=0)  # 10 VM CPUs, 4 GiB per node


def items(svc, n: int, *, key: str = "k", vcpus: int = 2, **body):  # type: ignore[no-untyped-def]
    return [svc.prepare(VmCreate.model_validate({"name": f"vm-{i}", "vcpus": vcpus, "memory_mib": 512,
                                                 "image": "smoke", **body}),
                        tenant="a", key=f"{key}{i}", actor="t") for i in range(n)]


def ledger_ok(store) -> list[tuple[str, Usage]]:  # type: ignore[no-untyped-def]
    """Each host's usage equals the sum of its live VMs' allocations; no CPU twice."""
    with store.read() as s:
        out = []
        for h in s.scalars(select(Host)).all():
            allocs = [Allocation.from_dict(a) for a in
                      s.scalars(select(Vm.allocation).where(Vm.host == h.name, Vm.status.in_(LIVE)))]
            cpus = [c for a in allocs for c in a.cpus]
            assert len(cpus) == len(set(cpus)), h.name
            assert Usage.from_dict(h.usage) == Usage.of(allocs), h.name
            out.append((h.name, Usage.from_dict(h.usage)))
        return out


def test_one_batch_many_vms_replays_and_rejections(db_url):
    with make_client(db_url) as api:
        for h in ("h1", "h2"):
            assert api.post("/v1/hosts", json=host_body(h, SMALL), headers=HOST).status_code == 201
        svc = api.app.state.vms
        first = svc.create_many(items(svc, 6))
        assert all(isinstance(r, tuple) and r[1] is False for r in first), first
        # 6 x 2 vCPUs in one batch, each placed against the index as the batch left it:
        # best fit takes the 4-CPU nodes (node 0) of h1 then h2, then h1's 6-CPU node
        assert [(r[0].host, r[0].allocation["nodes"]) for r in first] == [
            ("h1", [0]), ("h1", [0]), ("h2", [0]), ("h2", [0]), ("h1", [1]), ("h1", [1])]
        with svc.store.read() as s:
            h1, h2 = s.get(Host, "h1"), s.get(Host, "h2")
            assert (h1.generation, h2.generation) == (1 + 4, 1 + 2)  # one step per claim ...
            assert h1.seq == h2.seq  # ... written once per batch, with one change stamp
            assert len(s.scalars(select(Audit).where(Audit.action == "vm.create")).all()) == 6
            # what the batch wrote through the driver (repo/lite.py, repo/pg.py) reads back
            # through the ORM as what was answered
            vm = s.get(Vm, first[4][0].id)
            assert (vm.allocation, vm.request, vm.status) == (first[4][0].allocation, first[4][0].request, "pending")
            a = s.scalars(select(Audit).where(Audit.target == vm.id)).one()
            assert a.detail == {"tenant": vm.tenant, "host": "h1", "nodes": [1], "cpus": vm.allocation["cpus"]}
            assert a.principal == "t"
        # replays, a new VM, one that fits nowhere, and anti-affinity (claimed alone) in one batch
        again = items(svc, 2) + items(svc, 1, key="new") + items(svc, 1, key="big", vcpus=64) + \
            items(svc, 1, key="aa", anti_affinity={"group": "g1"})
        got = svc.create_many(again)
        assert [r[0].id for r in got[:2]] == [r[0].id for r in first[:2]] and got[0][1] is True
        assert got[2][1] is False and got[2][0].host == "h1"  # the last 2 CPUs of h1's node 1
        assert isinstance(got[3], NoValidHost) and got[3].extra["rejections"] == {"vcpus": 2}
        assert got[4][1] is False and got[4][0].affinity_group == "g1"
        ledger_ok(svc.store)
        # the index learnt every claim: a dry run agrees with the database
        free = {h["name"]: sum(n["free_cpus"] for n in h["nodes"])
                for h in api.get("/v1/hosts", headers={"Authorization": "Bearer adm"}).json()["items"]}
        assert free == {"h1": 0, "h2": 4}


def test_batch_that_rolls_back_is_redone_one_by_one(db_url):
    """The same key twice in one batch: the second INSERT violates the unique key at the
    batch's end, the whole batch rolls back, the index (which learnt both claims) is
    reloaded, and the one-by-one redo answers one VM and one replay of it."""
    with make_client(db_url) as api:
        assert api.post("/v1/hosts", json=host_body("h1", SMALL), headers=HOST).status_code == 201
        svc = api.app.state.vms
        twice = items(svc, 1, key="dup") * 2 + items(svc, 1, key="other")
        got = svc.create_many(twice)
        assert got[0][1] is False and got[1][1] is True and got[0][0].id == got[1][0].id
        assert got[2][1] is False
        [(_, usage)] = ledger_ok(svc.store)
        assert len(usage.cpus) == 4
        entry = svc.placer.cache.index.entries["h1"]
        assert entry.view.usage == usage  # not the rolled-back 6 CPUs


def test_the_down_check_runs_before_a_batch_takes_the_claim_lock_never_inside(db_url, monkeypatch):
    """The index's down check (the replicas' liveness rows read and the fleet walked from
    memory: 2-10 ms at 10,000 hosts) never runs inside a claim batch's transaction, where
    it held the claim lock every replica queues on. A replica that only claims (no beats
    kept, no liveness thread: as here) still learns that a host went silent, from the
    check run before the batch takes the lock."""
    from scheduler.service.hostcache import HostCache
    calls: list[tuple[bool, bool]] = []  # (inside a claim batch's transaction, down check)
    real = HostCache._incremental

    def spy(self, store, *, now, session=None, quiet=False):  # type: ignore[no-untyped-def]
        calls.append((session is not None, quiet))
        return real(self, store, now=now, session=session, quiet=quiet)
    monkeypatch.setattr(HostCache, "_incremental", spy)
    clock = Clock()
    with make_client(db_url, clock=clock) as api:
        for h in ("h1", "h2"):
            assert api.post("/v1/hosts", json=host_body(h, SMALL), headers=HOST).status_code == 201
        svc = api.app.state.vms
        svc.placer.cache.down_check_s = 0  # due before every batch
        first = svc.create_many(items(svc, 2))
        assert {r[0].host for r in first} == {"h1"}  # best fit: the first host's node
        clock.t += api.app.state.settings.placement.heartbeat_timeout_s + 1
        assert api.post("/v1/hosts/h2/heartbeat", headers=HOST).status_code == 200
        calls.clear()
        after = svc.create_many(items(svc, 2, key="after"))
        assert {r[0].host for r in after} == {"h2"}  # h1 is silent: down
        assert (False, True) in calls, calls  # the check ran, on its own transaction ...
        assert (True, True) not in calls, calls  # ... and never inside the batch's
        assert (True, False) in calls, calls  # where the feed is still read


def gated_queue(max_batch: int) -> tuple[ClaimQueue, threading.Event, list[list[int]]]:
    """A claim queue whose batches wait for the gate; odd items fail, even ones x10."""
    seen: list[list[int]] = []
    gate = threading.Event()

    def run(batch: list[int], _more: object) -> list[object]:
        gate.wait(5)
        seen.append(batch)
        return [ValueError(f"odd {x}") if x % 2 else x * 10 for x in batch]
    return ClaimQueue(run, max_batch=max_batch), gate, seen


def test_claim_queue_answers_each_request_and_closes():
    q, gate, seen = gated_queue(4)
    futs = [q.submit(i) for i in range(10)]
    time.sleep(0.05)
    gate.set()
    assert [f.result(5) if i % 2 == 0 else None for i, f in enumerate(futs)][::2] == [0, 20, 40, 60, 80]
    with pytest.raises(ValueError, match="odd 3"):
        futs[3].result(5)
    assert all(len(b) <= 4 for b in seen) and sorted(x for b in seen for x in b) == list(range(10))
    assert len(seen) < 10  # queued requests shared batches
    # a request cancelled while queued (its client went away) is skipped, not claimed,
    # and the thread lives on
    gate.clear()
    busy = q.submit(100)
    time.sleep(0.05)  # the thread holds it, waiting on the gate
    gone, after = q.submit(102), q.submit(104)
    assert gone.cancel()
    gate.set()
    assert busy.result(5) == 1000 and after.result(5) == 1040 and gone.cancelled()
    assert 102 not in [x for b in seen for x in b]
    assert q.submit(106).result(5) == 1060
    q.close()
    with pytest.raises(RuntimeError):
        q.submit(1)


def test_claim_queue_stops_when_the_last_request_before_close_was_cancelled():
    """close() queues a stop behind a request whose client went away: the thread skips
    the request and stops (it used to drop the stop with the empty batch and wait for
    ever)."""
    q, gate, seen = gated_queue(4)
    busy = q.submit(0)
    time.sleep(0.05)  # the thread holds 0, waiting on the gate
    gone = q.submit(2)
    assert gone.cancel()
    threading.Timer(0.05, gate.set).start()
    q.close(timeout=5)
    assert busy.result(1) == 0 and not q._thread.is_alive() and seen == [[0]]


def test_claim_queue_settles_asyncio_futures_per_batch():
    """The event loop's path: asyncio futures, settled on their loop once per batch; one
    cancelled while queued is never run."""
    q, gate, seen = gated_queue(8)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        busy = q.submit(0, loop)
        await asyncio.sleep(0.05)  # the thread holds it, waiting on the gate
        futs = [q.submit(i, loop) for i in range(1, 6)]
        futs[1].cancel()  # 2: its client went away while it queued
        gate.set()
        assert await busy == 0
        got = await asyncio.gather(*futs, return_exceptions=True)
        assert [g if isinstance(g, int) else type(g).__name__ for g in got] == \
            ["ValueError", "CancelledError", "ValueError", 40, "ValueError"]
    asyncio.run(main())
    assert seen == [[0], [1, 3, 4, 5]]  # the queued four shared one batch; 2 never ran
    q.close()


def test_claim_queue_takes_late_requests_into_the_running_batch():
    """``more()`` (called by the batch once it holds the writer lock) takes what queued
    since the batch formed, up to ``max_batch`` in all, skipping a request cancelled
    while it queued; each gets its own answer, in order after the batch's first items."""
    gate, took = threading.Event(), []

    def run(batch: list[int], more) -> list[object]:  # type: ignore[no-untyped-def]
        gate.wait(5)  # "waiting for the writer lock"
        late = more()
        took.append((list(batch), late))
        return [x * 10 for x in batch + late]
    q = ClaimQueue(run, max_batch=4)
    first = q.submit(0)
    time.sleep(0.05)  # the thread holds 0, waiting on the gate
    futs = [q.submit(i) for i in range(1, 7)]
    assert futs[1].cancel()  # 2: its client went away while it queued
    gate.set()
    assert first.result(5) == 0 and [f.result(5) for i, f in enumerate(futs) if i != 1] == [10, 30, 40, 50, 60]
    assert took[0] == ([0], [1, 3, 4])  # joined the running batch: 4 in all, 2 skipped
    assert took[1] == ([5, 6], [])
    q.close()


def test_claim_queue_answers_every_request_when_run_miscounts():
    """A ``run`` that answers fewer results than it was handed fails each request of the
    batch rather than leaving one waiting for ever."""
    q = ClaimQueue(lambda batch, more: [1] * (len(batch) + len(more()) - 1), max_batch=4)
    with pytest.raises(RuntimeError, match="answered 0 of 1"):
        q.submit(7).result(5)
    q.close()


def test_late_requests_join_the_batch_transaction(db_url):
    """``create_many(items, more)``: the late requests are claimed in the same write
    transaction as the first ones (one batch), against the index as the
    earlier claims left it, and a late replay is found by the batch's key lookup."""
    with make_client(db_url) as api:
        assert api.post("/v1/hosts", json=host_body("h1", SMALL), headers=HOST).status_code == 201
        svc = api.app.state.vms
        [(old, _)] = svc.create_many(items(svc, 1, key="old"))
        calls = []

        def more():  # type: ignore[no-untyped-def]
            calls.append(1)
            return items(svc, 2, key="late") + items(svc, 1, key="old")
        got = svc.create_many(items(svc, 1, key="early"), more)
        assert calls == [1] and len(got) == 4
        assert [r[1] for r in got] == [False, False, False, True] and got[3][0].id == old.id
        cpus = [c for r in got[:3] for c in r[0].allocation["cpus"]] + old.allocation["cpus"]
        assert len(cpus) == len(set(cpus)) == 8
        batches = api.get("/metrics", headers=ADM).text  # two batches: "old", then 1 + 3 late
        assert "hyb_sched_claim_batch_size_count 2.0" in batches and "hyb_sched_claim_batch_size_sum 5.0" in batches
        ledger_ok(svc.store)


def test_index_churn_is_frozen_out_of_the_cyclic_gc(db_url):
    """Claims replace index entries with new objects; after max(1000, hosts/10) changes the
    claim thread collects the young generations and freezes what is alive, so full
    collections do not walk it again (one took 86 ms under load without this)."""
    import gc
    with make_client(db_url) as api:
        assert api.post("/v1/hosts", json=host_body("h1", SMALL), headers=HOST).status_code == 201
        svc = api.app.state.vms
        cache = svc.placer.cache
        svc.create_many(items(svc, 1))
        row = cache.row("h1")
        gc.unfreeze()
        try:
            cache.freeze_churn()
            assert gc.get_freeze_count() == 0  # a handful of changes: nothing to do
            for i in range(1000):
                cache.learn("h1", generation=row.generation + 1 + i, layout_rev=row.layout_rev, usage=row.usage,
                            admin_state="active", last_heartbeat=None, now=svc.clock())
            cache.freeze_churn()
            assert gc.get_freeze_count() > 0
        finally:
            gc.unfreeze()


def test_first_batch_builds_the_index_before_taking_the_writer_lock(db_url, monkeypatch):
    """SQLite reads the change feed under the writer lock only, but the first batch's full
    read of the fleet (seconds at 10,000 hosts) happens before it: the other replicas'
    claims must not wait for it. (The app builds the index at its start; a replica whose
    start-time pass failed, as here, starts cold and its first batch builds it.)"""
    from contextlib import contextmanager

    from scheduler.api import app as app_module
    monkeypatch.setattr(app_module, "_warm_index", lambda *a: None)
    with make_client(db_url) as api:
        assert api.post("/v1/hosts", json=host_body("h1", SMALL), headers=HOST).status_code == 201
        svc = api.app.state.vms
        cache, store = svc.placer.cache, svc.store
        assert cache.cold
        write, cold_at_write = store.batch_write, []

        @contextmanager
        def spy():  # type: ignore[no-untyped-def]
            cold_at_write.append(cache.cold)
            with write() as s:
                yield s
        store.batch_write = spy
        got = svc.create_many(items(svc, 1))
        assert got[0][0].host == "h1" and cold_at_write == [False]


def test_stale_index_in_a_batch_is_caught_by_the_generation_guard(db_and_lock, caplog):
    """Replica b's index never refreshes or learns (as if the change feed were lost): its
    batch claims against a stale view (under the claim lock without reading the row at
    all), the guarded UPDATE at the batch's end matches fewer rows, the batch rolls back,
    and the one-by-one redo re-checks the row and takes other CPUs. With row locks
    (PostgreSQL, "rows") the batch reads the row and re-fits instead. Nothing is booked
    twice."""
    db_url, lock = db_and_lock
    with make_client(db_url, placement={"claim_lock": lock}) as a, \
            make_client(db_url, placement={"claim_lock": lock}) as b:
        assert a.post("/v1/hosts", json=host_body("h1", SMALL), headers=HOST).status_code == 201
        sa, sb = a.app.state.vms, b.app.state.vms
        sb.placer.cache.refresh(sb.store, now=sb.clock())
        sb.placer.cache.refresh = lambda *x, **k: None
        ra = sa.create_many(items(sa, 1, key="a"))
        rb = sb.create_many(items(sb, 1, key="b"))
        assert ra[0][1] is False and rb[0][1] is False, (ra, rb)
        assert set(ra[0][0].allocation["cpus"]).isdisjoint(rb[0][0].allocation["cpus"])
        ledger_ok(sa.store)
        assert ("claim batch of 1 rolled back" in caplog.text) == (lock == "store")


@pytest.mark.parametrize("seed", range(3))
def test_batches_place_exactly_as_fresh_walks_one_at_a_time(seed, db_url):
    """Each job's first walk runs before the batch takes the claim lock; inside, it is
    used only if a walk would still answer the same (``HostCache.still_first``). So a
    trace claimed in batches of random sizes, with another replica claiming in between
    (its claims reach this one only through the change feed), lands VM for VM where
    ``fit_vm`` over the fresh fleet puts it, 507s included."""
    rnd = random.Random(seed)
    shapes = [SMALL, *SHAPES[:3]]
    with make_client(db_url) as a, make_client(db_url) as b:
        fleet: dict[str, HostView] = {}
        for i in range(12):
            shape = rnd.choice(shapes)
            body = host_body(f"h{i:02d}", shape)
            assert a.post("/v1/hosts", json=body, headers=HOST).status_code == 201
            layout, sib = make_layout(shape)
            fleet[body["name"]] = HostView(host_from_layout(body["name"], layout, siblings=sib))
        sa, sb = a.app.state.vms, b.app.state.vms
        n = 0
        while n < 160:
            svc = sa if rnd.random() < 0.7 else sb
            reqs = [dict(vcpus=rnd.choice([1, 2, 2, 3, 4, 6]), memory_mib=rnd.choice([512, 1024, 2048]),
                         policy=rnd.choice(["pack", "pack", "spread"]), allow_span_nodes=rnd.random() < 0.1)
                    for _ in range(rnd.choice([1, 1, 3, 8, 16]))]
            batch = [svc.prepare(VmCreate.model_validate({"name": f"vm-{n + k}", "image": "smoke", **r}),
                                 tenant="a", key=f"s{n + k}", actor="t") for k, r in enumerate(reqs)]
            n += len(batch)
            for it, got in zip(batch, svc.create_many(batch)):
                want = VmWant(it.body.vcpus, it.body.memory_mib, policy=it.body.policy,
                              allow_span_nodes=it.body.allow_span_nodes)
                ref = fit_vm(list(fleet.values()), want, limit=1)
                if not ref.candidates:
                    assert isinstance(got, NoValidHost), (it.body, got)
                    continue
                c = ref.candidates[0]
                assert isinstance(got, tuple), (it.body, got)
                assert (got[0].host, Allocation.from_dict(got[0].allocation)) == (c.host, c.alloc), it.body
                fleet[c.host] = HostView(fleet[c.host].res, fleet[c.host].usage.plus(c.alloc))
        ledger_ok(sa.store)


@pytest.mark.integration
@pytest.mark.parametrize("claim_lock", ["store", "rows"])
def test_postgres_claim_lock_runs_one_batch_at_a_time(pg_url, claim_lock, monkeypatch):
    """Two replicas on one PostgreSQL database, b's batch started while a's is open.
    claim_lock "store": b waits for the advisory lock (seen waiting in ``pg_locks``) until
    a commits, then claims on what a claimed, from its index alone: no host row read, no
    lost race. "rows": b runs and commits beside a's open batch, reading (and row-locking)
    the hosts it claims on, and so does a after it."""
    import psycopg

    from scheduler.repo import hosts as host_repo
    rows_read: list[str] = []
    real_row = host_repo.claim_row
    monkeypatch.setattr(host_repo, "claim_row", lambda **k: rows_read.append(k["name"]) or real_row(**k))
    over = {"placement": {"claim_lock": claim_lock}}
    with make_client(pg_url, **over) as a, make_client(pg_url, **over) as b:
        for n in ("h1", "h2"):
            assert a.post("/v1/hosts", json=host_body(n, SMALL), headers=HOST).status_code == 201
        sa, sb = a.app.state.vms, b.app.state.vms
        for svc in (sa, sb):
            svc.placer.cache.refresh(svc.store, now=svc.clock())
        got: dict[str, list] = {}
        b_thread = threading.Thread(target=lambda: got.setdefault("b", sb.create_many(items(sb, 2, key="b"))))
        seen: dict[str, object] = {}
        real = sa.placer.cache.refresh

        def refresh(*args, session=None, **kw):  # type: ignore[no-untyped-def]
            real(*args, session=session, **kw)
            if session is None or "b_waits" in seen:
                return
            b_thread.start()  # a's batch is open (and holds the claim lock, if any)
            with psycopg.connect(pg_url, autocommit=True) as c:
                waiting, deadline = 0, time.monotonic() + 10
                while time.monotonic() < deadline and not waiting and b_thread.is_alive():
                    waiting = c.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                                        "AND NOT granted").fetchone()[0]
                    time.sleep(0.01)
            seen["b_waits"], seen["b_done"] = waiting, not b_thread.is_alive()
        sa.placer.cache.refresh = refresh
        got["a"] = sa.create_many(items(sa, 2, key="a"))
        b_thread.join(30)
        assert not b_thread.is_alive()
        if claim_lock == "store":
            assert seen == {"b_waits": 1, "b_done": False}
            assert rows_read == [] and sb.placer.metrics.claim_conflicts._value.get() == 0
        else:
            assert seen == {"b_waits": 0, "b_done": True}
            assert rows_read == ["h1", "h1"]  # b's first claim, then a's (its second VM: held)
        vms = [r[0] for k in ("a", "b") for r in got[k]]
        assert all(r[1] is False for k in ("a", "b") for r in got[k]), got
        assert len({v.id for v in vms}) == 4
        ledger_ok(sa.store)


@pytest.mark.integration
def test_postgres_row_locks_skip_a_held_host_and_count_it_lost(pg_url):
    """claim_lock "rows": a batch never waits for a host row another transaction holds
    (``FOR UPDATE SKIP LOCKED``): the VM goes to the next candidate, and the lost
    candidate is counted once in ``hyb_sched_claim_conflicts_total``."""
    import psycopg
    with make_client(pg_url, placement={"claim_lock": "rows"}) as api:
        for n in ("h1", "h2"):
            assert api.post("/v1/hosts", json=host_body(n, SMALL), headers=HOST).status_code == 201
        svc = api.app.state.vms
        with psycopg.connect(pg_url) as other:  # a transaction holding h1's row
            other.execute("SELECT 1 FROM hosts WHERE name = 'h1' FOR UPDATE")
            t0 = time.monotonic()
            [(vm, replay)] = svc.create_many(items(svc, 1))
            assert time.monotonic() - t0 < 5 and not replay
            assert vm.host == "h2"  # pack would take h1 (same fill, first by name)
            other.rollback()
        [(vm2, _)] = svc.create_many(items(svc, 1, key="after"))
        assert vm2.host == "h2"  # now the fuller one
        assert svc.placer.metrics.claim_conflicts._value.get() == 1
        ledger_ok(svc.store)


@pytest.mark.integration
def test_postgres_key_lookup_probes_the_unique_index_as_vms_grow(pg_url):
    """A claim batch asks which of its (tenant, Idempotency-Key) pairs already exist
    (``repo/pg.py``). On a database that starts empty and fills faster than autovacuum
    analyses it (a new deployment, the bench), a plan made early scans every VM: the
    first version read all of the tenant's VMs, 3.2 ms of server CPU per batch at
    10,000 VMs. The lookup must stay one index probe per pair, and find exactly the
    pairs that exist."""
    from scheduler.db.engine import Store
    from scheduler.db.migrate import upgrade
    from scheduler.repo import pg

    store = Store.from_url(pg_url)
    try:
        upgrade(store.engine)
        pairs = [("t1", "k-1"), ("t1", "k-19999"), ("t1", "absent"), ("t2", "k-5")]
        with store.write() as s:
            for _ in range(8):  # plans made while the table is empty (a prepared statement's would stick)
                assert pg.ids_by_keys(s, pairs) == []
            conn = s.connection().connection.driver_connection
            conn.execute("INSERT INTO hosts (name, address, rack, labels, layout, siblings, pf_min_rate, disk_classes, "
                         "layout_rev, usage, generation, admin_state, last_heartbeat, seq, created, updated) "
                         "VALUES ('h', 'a', '', '{}', '{}', '{}', '{}', '{}', 1, '{}', 1, 'active', 0, 0, 0, 0)")
            conn.execute("INSERT INTO vms (id, tenant, name, idempotency_key, request_hash, request, host, allocation, "
                         "status, reason, hostd_vm_id, affinity_group, attempts, created, updated) "
                         "SELECT 'id-' || i, 't1', 'n', 'k-' || i, 'x', '{}', 'h', '{}', 'pending', '', '', '', 0, 0, 0 "
                         "FROM generate_series(1, 20000) i")
            for _ in range(8):
                got = pg.ids_by_keys(s, pairs)
            assert sorted(got) == [("id-1", "t1", "k-1"), ("id-19999", "t1", "k-19999")]
            plan = "\n".join(r[0] for r in conn.execute(
                "EXPLAIN " + pg._BY_KEYS, ([t for t, _ in pairs], [k for _, k in pairs])))
            assert "Index Scan using uq_vms_tenant_key" in plan and "Seq Scan on vms" not in plan, plan
            assert "Hash" not in plan, plan
            # planned per call: no server-side prepared statement can keep the empty-table plan
            assert not conn.execute("SELECT 1 FROM pg_prepared_statements WHERE statement LIKE '%%CROSS JOIN LATERAL%%'"
                                    ).fetchall()
    finally:
        store.dispose()
