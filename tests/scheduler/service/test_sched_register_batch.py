"""Host registrations in batches (``HostService.register_many``, what the registration
thread runs for POST /v1/hosts), on SQLite and PostgreSQL: each registration of a batch
answered its own result or error, a refused one changing nothing while the others are
written; a bad layout refused before it queues; two replicas registering the same and
different hosts at once; a batch that meets another replica's insert of the same new
host; and a replica killed in the middle of a batch leaving no host of it written."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from sched_helpers import ADM, HOST, TA, host_body, make_client, vm_body
from scheduler.db.models import Audit, Host
from scheduler.errors import HostNotYours, LayoutShrink
from scheduler.repo import hosts as host_repo
from scheduler.schemas.hosts import HostRegister
from scheduler.service.hosts import HostService, RegisterItem
from tools.dev.host_shapes import Shape

pytestmark = [pytest.mark.xdist_group("sched-register-batch")]

REPO = Path(__file__).resolve().parents[3]
SMALL = Shape("small", nodes=2, cores_per_node=4, smt=2, io_cores_per_node=1, host_cores=1,
              pages_2m_per_node=2048, vfs_per_node=0, disks_per_node=0)
TINY = Shape("tiny", nodes=1, cores_per_node=2, smt=2, io_cores_per_node=1, host_cores=0,
             pages_2m_per_node=512, vfs_per_node=0, disks_per_node=0)


def item(name: str, actor: str = "hst", *, shape: Shape = SMALL, bound: str | None = None,
         address: str = "") -> RegisterItem:
    body = HostRegister.model_validate(host_body(name, shape, address=address))
    return RegisterItem(body, actor, False, bound, host_repo.check_layout(body.layout, body.cpu_siblings))


def hosts(svc: HostService) -> dict[str, Host]:
    with svc.store.read() as s:
        return {h.name: h for h in s.scalars(select(Host))}


def audits(svc: HostService, action: str) -> list[str]:
    with svc.store.read() as s:
        return sorted(s.scalars(select(Audit.target).where(Audit.action == action)))


def test_each_registration_its_own_answer(db_url):
    with make_client(db_url) as api:
        svc: HostService = api.app.state.hosts
        # h-old: another principal's host (hst2), too small for the VM; h-vm: the VM on it,
        # so a smaller layout is refused
        assert api.post("/v1/hosts", json=host_body("h-old", TINY, address="old:1"),
                        headers={"Authorization": "Bearer hst2"}).status_code == 201
        assert api.post("/v1/hosts", json=host_body("h-vm", SMALL, address="vm:1"), headers=HOST).status_code == 201
        r = api.post("/v1/vms", json=vm_body("v1", vcpus=6), headers={**TA, "Idempotency-Key": "k1"})
        assert r.status_code == 202 and r.json()["host"] == "h-vm", r.text
        before = hosts(svc)
        got = svc.register_many([
            item("h-a"),
            item("h-old", shape=TINY, address="stolen:1"),  # hst may not act for hst2's host
            item("h-b", bound="h-z"),  # a token bound to another host
            item("h-vm", shape=TINY, address="vm:2"),  # its VM's CPUs would go: LayoutShrink
            item("h-c"),
            item("h-a", address="again:1"),  # the same host twice in one batch: an update
        ])
        assert [type(r).__name__ for r in got] == ["tuple", "HostNotYours", "HostNotYours", "LayoutShrink",
                                                   "tuple", "tuple"]
        assert isinstance(got[1], HostNotYours) and got[1].field == "name"
        assert isinstance(got[3], LayoutShrink) and got[3].field == "layout" and "drain" in got[3].message
        assert (got[0][0].name, got[0][1], got[4][1]) == ("h-a", True, True)
        assert (got[5][0].address, got[5][1]) == ("again:1", False)
        after = hosts(svc)
        assert set(after) == {"h-old", "h-vm", "h-a", "h-c"}
        for name in ("h-old", "h-vm"):  # the refused: as they were, every column
            a, b = before[name], after[name]
            assert {c.key: getattr(a, c.key) for c in Host.__table__.columns} == \
                {c.key: getattr(b, c.key) for c in Host.__table__.columns}, name
        assert after["h-a"].address == "again:1" and after["h-a"].owner == "hst"
        assert after["h-a"].seq == after["h-c"].seq > before["h-vm"].seq  # one change stamp for the batch
        ids = [h.beat_id for h in after.values()]
        assert None not in ids and len(set(ids)) == len(ids)
        assert audits(svc, "host.register") == ["h-a", "h-c", "h-old", "h-vm"]
        assert audits(svc, "host.update") == ["h-a"]
        assert audits(svc, "host.register.denied") == ["h-b", "h-old"]
        # the index learns the batch's hosts from the change feed, as any registration's
        r = api.post("/v1/hosts/h-c/heartbeat", headers=HOST)
        assert r.status_code == 200, r.text


@pytest.mark.parametrize("batch", [64, 0])
def test_bad_layout_refused_before_it_queues(db_url, batch):
    """The same answers with batches and without (``register_batch = 0``: a transaction
    each on a worker thread, the bench's baseline)."""
    with make_client(db_url, placement={"register_batch": batch}) as api:
        svc: HostService = api.app.state.hosts
        body = host_body("h-bad", SMALL)
        body["layout"]["nodes"][0]["vm_cpus"][1] = "x"
        r = api.post("/v1/hosts", json=body, headers=HOST)
        assert r.status_code == 422, r.text
        err = r.json()["error"]
        assert err["code"] == "hyb.host.bad_layout" and err["field"] == "layout"
        assert "layout.nodes[0].vm_cpus[1]: expected an integer" in err["message"]
        assert hosts(svc) == {} and audits(svc, "host.register") == []
        # a good one after it: written, and the API says 201 then 200
        assert api.post("/v1/hosts", json=host_body("h-ok", SMALL), headers=HOST).status_code == 201
        assert api.post("/v1/hosts", json=host_body("h-ok", SMALL), headers=HOST).status_code == 200
        r = api.post("/v1/hosts", json=host_body("h-ok", SMALL), headers={"Authorization": "Bearer hst2"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "hyb.host.not_yours", r.text
        assert audits(svc, "host.register.denied") == ["h-ok"]
        batches = [ln for ln in api.get("/metrics", headers=ADM).text.splitlines()
                   if ln.startswith("hyb_sched_register_batch_size_count")]
        assert batches == [f"hyb_sched_register_batch_size_count {3.0 if batch else 0.0}"], batches


def test_two_replicas_at_once(db_url):
    """Two apps on one database (two replicas), 120 registrations each at once through
    their registration threads: 100 hosts of their own, 20 the same on both. Every host
    once, with its own beat id; each shared host created by exactly one of them."""
    with make_client(db_url) as a, make_client(db_url) as b:
        svcs: list[HostService] = [a.app.state.hosts, b.app.state.hosts]

        async def run() -> list[list]:
            async def one(svc: HostService, name: str):  # type: ignore[no-untyped-def]
                body = HostRegister.model_validate(host_body(name, SMALL))
                return await svc.register_async(body, actor="hst", admin=False, bound_host=None)
            shared = [f"both-{i}" for i in range(20)]
            return await asyncio.gather(*(asyncio.gather(*(one(svc, n) for n in
                                                           [f"r{k}-{i}" for i in range(100)] + shared))
                                          for k, svc in enumerate(svcs)))
        got = asyncio.run(run())
        for k in (0, 1):
            assert all(r[1] is True for r in got[k][:100])
        created = [got[0][100 + i][1] + got[1][100 + i][1] for i in range(20)]
        assert created == [1] * 20  # each shared host: created once, updated once
        rows = hosts(svcs[0])
        assert len(rows) == 220
        ids = [h.beat_id for h in rows.values()]
        assert None not in ids and len(set(ids)) == 220
        assert len(audits(svcs[0], "host.register")) == 220 and len(audits(svcs[0], "host.update")) == 20
        # batches formed: fewer transactions than registrations
        text = a.get("/metrics", headers=ADM).text + b.get("/metrics", headers=ADM).text
        count = sum(float(ln.split()[-1]) for ln in text.splitlines()
                    if ln.startswith("hyb_sched_register_batch_size_count"))
        assert 2 <= count < 200, count


def test_another_replica_inserts_the_same_host_meanwhile(db_url):
    """Another replica's transaction inserts h-dup and commits while a batch holding
    h-dup waits for it (PostgreSQL: on the unique index, the batch then fails and is
    redone one registration at a time; SQLite: on the writer lock, the batch then finds
    the row). Either way: h-dup updated, not twice, and the others created."""
    with make_client(db_url) as a, make_client(db_url) as b:
        svc: HostService = a.app.state.hosts
        other: HostService = b.app.state.hosts
        holding, release = threading.Event(), threading.Event()

        def insert_and_hold() -> None:
            body = HostRegister.model_validate(host_body("h-dup", SMALL, address="first:1"))
            with other.store.write() as s:
                other._upsert(s, body, other.clock(), actor="hst", admin=False, parsed=None)
                holding.set()
                release.wait(30)
        t = threading.Thread(target=insert_and_hold)
        t.start()
        assert holding.wait(30)
        out: list = []
        batch = threading.Thread(target=lambda: out.extend(svc.register_many(
            [item("h-1"), item("h-dup", address="second:1"), item("h-2")])))
        batch.start()
        time.sleep(0.5)  # the batch now waits for the other transaction
        assert out == []
        release.set()
        t.join(30)
        batch.join(30)
        assert [(r[0].name, r[1]) for r in out] == [("h-1", True), ("h-dup", False), ("h-2", True)]
        rows = hosts(svc)
        assert sorted(rows) == ["h-1", "h-2", "h-dup"] and rows["h-dup"].address == "second:1"
        assert audits(svc, "host.register") == ["h-1", "h-2", "h-dup"] and audits(svc, "host.update") == ["h-dup"]


KILLED = textwrap.dedent("""
    import os, signal, sys
    sys.path[:0] = [{tests!r}, {repo!r}]
    from sched_helpers import host_body, make_client
    from scheduler.repo import audit as audit_repo
    from scheduler.schemas.hosts import HostRegister
    from scheduler.service.hosts import RegisterItem
    from scheduler.repo import hosts as host_repo
    from test_sched_register_batch import SMALL

    def die(**_):  # the batch's hosts flushed, its audit rows next: the process dies here
        print("dying", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    audit_repo.insert_rows = die
    with make_client({url!r}) as api:
        items = []
        for i in range(5):
            b = HostRegister.model_validate(host_body(f"k-{{i}}", SMALL))
            items.append(RegisterItem(b, "hst", False, None, host_repo.check_layout(b.layout, b.cpu_siblings)))
        api.app.state.hosts.register_many(items)
        print("not killed", flush=True)
""")


def test_replica_killed_mid_batch_writes_nothing(db_url, tmp_path):
    with make_client(db_url) as api:
        assert api.post("/v1/hosts", json=host_body("k-0", SMALL, address="was:1"), headers=HOST).status_code == 201
    script = tmp_path / "killed.py"
    script.write_text(KILLED.format(tests=str(REPO / "tests/scheduler"), repo=str(REPO), url=db_url))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests/scheduler/service"), str(REPO)])}
    p = subprocess.run([sys.executable, str(script)], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGKILL, (p.returncode, p.stdout, p.stderr[-2000:])
    assert "dying" in p.stdout and "not killed" not in p.stdout
    with make_client(db_url) as api:
        svc: HostService = api.app.state.hosts
        rows = hosts(svc)
        assert sorted(rows) == ["k-0"] and rows["k-0"].address == "was:1"  # k-0's update gone with the rest
        with svc.store.read() as s:
            assert s.scalar(select(func.count()).select_from(Audit).where(Audit.target.like("k-%"))) == 1
        # nothing held: the same registrations go through at once
        t = time.monotonic()
        for i in range(5):
            assert api.post("/v1/hosts", json=host_body(f"k-{i}", SMALL), headers=HOST).status_code == (200 if i == 0
                                                                                                        else 201)
        assert time.monotonic() - t < 10
