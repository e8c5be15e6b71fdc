"""Store: migrations, and the no-double-booking guarantee under concurrency — 64 parallel
clients against two real `scheduler serve` processes on one database (SQLite file, and
PostgreSQL as integration), more requests than capacity."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from sqlalchemy import inspect, text

from tools.dev.host_shapes import Shape
from tools.dev.procs import Scheduler, free_port
from sched_helpers import ADM, HOST, TA, host_body, token_config, vm_body
from scheduler.db.engine import Checkpointer, Store
from scheduler.db.migrate import current, downgrade, upgrade
from scheduler.db.models import LIVE, Host, Vm
from scheduler.resources import Allocation, Usage

REPO = Path(__file__).resolve().parents[3]
# 2 nodes x 3 VM cores x 2 threads = 12 VM CPUs per host, 512 x 2 MiB pages per node
TIGHT = Shape("tight", nodes=2, cores_per_node=4, smt=2, io_cores_per_node=1, host_cores=0,
              pages_2m_per_node=512, vfs_per_node=2, pf_mbps=1000, disks_per_node=1)


def test_migrations_up_down_up(db_url):
    store = Store.from_url(db_url)
    try:
        upgrade(store.engine)
        assert current(store.engine) == "0020"
        rollouts = {"rollouts", "rollout_hosts", "rollout_transitions", "rollout_leases"}
        assert {"hosts", "vms", "audit", "host_beats"} | rollouts <= set(inspect(store.engine).get_table_names())
        assert {"owner", "beat_id", "metrics_url", "hostd_version", "carved_policy", "admin_owner", "admin_reason",
                "admin_since"} <= {c["name"] for c in inspect(store.engine).get_columns("hosts")}
        assert {"host_days", "console_sessions"} <= set(inspect(store.engine).get_table_names())
        def columns(table: str) -> set[str]:
            return {c["name"] for c in inspect(store.engine).get_columns(table)}
        assert {"fence", "principal", "taken"} <= columns("rollout_leases")
        assert {"fence", "principal"} <= columns("rollout_transitions")
        assert {"migration_progress", "last_migration"} <= columns("vms")
        downgrade(store.engine, "0018")
        assert not {"migration_progress", "last_migration"} & columns("vms") and "migration_state" in columns("vms")
        downgrade(store.engine, "0016")
        assert "host_beats" not in inspect(store.engine).get_table_names()
        assert "beat_id" not in columns("hosts")
        downgrade(store.engine, "0015")
        assert not {"fence", "principal", "taken"} & columns("rollout_leases")
        assert not {"fence", "principal"} & columns("rollout_transitions")
        assert "peak_io_mcpu" in {c["name"] for c in inspect(store.engine).get_columns("host_days")}
        downgrade(store.engine, "0014")
        assert "peak_io" in {c["name"] for c in inspect(store.engine).get_columns("host_days")}
        downgrade(store.engine, "0013")
        assert "console_sessions" not in inspect(store.engine).get_table_names()
        downgrade(store.engine, "0012")
        assert "host_days" not in inspect(store.engine).get_table_names()
        assert "down_since" in {c["name"] for c in inspect(store.engine).get_columns("hosts")}
        downgrade(store.engine, "0011")
        assert "down_since" not in {c["name"] for c in inspect(store.engine).get_columns("hosts")}
        assert {"replaces", "disruption_group"} <= {c["name"] for c in inspect(store.engine).get_columns("vms")}
        downgrade(store.engine, "0010")
        assert "replaces" not in {c["name"] for c in inspect(store.engine).get_columns("vms")}
        downgrade(store.engine, "0009")
        assert not rollouts & set(inspect(store.engine).get_table_names())
        downgrade(store.engine, "0008")
        assert "admin_owner" not in {c["name"] for c in inspect(store.engine).get_columns("hosts")}
        downgrade(store.engine, "0007")
        assert "metrics_url" not in {c["name"] for c in inspect(store.engine).get_columns("hosts")}
        downgrade(store.engine, "0001")
        assert "audit" not in inspect(store.engine).get_table_names()
        downgrade(store.engine, "base")
        assert "hosts" not in inspect(store.engine).get_table_names()
        out = subprocess.run([sys.executable, "-m", "scheduler.cli", "db", "upgrade", "--url", db_url],
                             capture_output=True, text=True, cwd=REPO, check=True)
        assert out.stdout.strip() == "0020"
    finally:
        store.dispose()


def test_kept_peaks_become_the_milli_cpus_they_read_as(db_url):
    """0015 turns a kept day's REAL peak into milli-CPUs from the decimal it reads as
    (PostgreSQL's single-precision 2.4 is 2.4000000953674316 as a double, "2.4" as text):
    2.4 of 48 CPUs becomes 2400 of 48000, exactly 5 %; and back on downgrade."""
    from sqlalchemy import text
    store = Store.from_url(db_url)
    try:
        upgrade(store.engine, "0014")
        row = {"day": "2025-11-25", "host": "h", "utc_offset_min": 0, "cpus": 48, "samples": 1, "peak_start": 0,
               "peak_end": 60, "peak_samples": 1, "io": 0.3, "vms": 2.4, "other": 65535.125, "hours": bytes(24),
               "hist": bytes(40), "fc": 0.0, "pf": 0}
        with store.engine.begin() as c:
            c.execute(text("INSERT INTO host_days VALUES (:day, :host, :utc_offset_min, :cpus, :samples, :peak_start, "
                           ":peak_end, :peak_samples, :io, :vms, :other, :hours, :hist, NULL, NULL, :fc, :pf)"), row)
        upgrade(store.engine)
        with store.engine.connect() as c:
            got = c.execute(text("SELECT peak_io_mcpu, peak_vms_mcpu, peak_other_mcpu FROM host_days")).one()
        assert tuple(got) == (300, 2400, 65535125)
        downgrade(store.engine, "0014")
        with store.engine.connect() as c:
            back = c.execute(text("SELECT peak_io, peak_vms, peak_other FROM host_days")).one()
        assert tuple(back) == (0.3, 2.4, 65535.125)
    finally:
        store.dispose()


def _config(tmp: Path, db_url: str, claim_lock: str = "store") -> Path:
    toks = "\n".join(f'[[auth.tokens]]\nname = "{t["name"]}"\nsha256 = "{t["sha256"]}"\n'
                     f'scopes = {t["scopes"]!r}\n'.replace("'", '"') for t in token_config())
    cfg = tmp / "scheduler.toml"
    cfg.write_text(f'log_level = "WARNING"\n[server]\nplaintext = true\n[db]\nurl = "{db_url}"\npool_size = 4\n'
                   f'[dispatch]\nenabled = false\n[reconcile]\ninterval_s = 0\n'
                   f'[placement]\nclaim_retries = 32\nclaim_lock = "{claim_lock}"\n{toks}')
    return cfg


def test_batch_write_keeps_its_connection_and_commits_or_rolls_back(db_url):
    """The claim thread's batches run on one kept connection (no pool checkout, ping or
    session transaction per batch), each batch one transaction (SQLite: under the writer
    lock): committed when it ends, rolled back (and the connection dropped) when it
    raises; another thread keeps its own; dispose closes them."""
    import threading

    from sqlalchemy import text
    from scheduler.db.engine import RAW, driver
    store = Store.from_url(db_url)
    upgrade(store.engine)
    seq = text("SELECT seq FROM fleet WHERE id = 1")
    bump = text("UPDATE fleet SET seq = seq + 1 WHERE id = 1")
    seen = []
    with store.batch_write() as s:
        seen.append(s.info[RAW])
        assert driver(s) is s.info[RAW]
        before = s.execute(seq).scalar()
        s.execute(bump)
        if store.sqlite:  # the writer lock and SQLite's own are held: nobody else can write
            other = store.engine.raw_connection()
            other.driver_connection.execute("PRAGMA busy_timeout = 0")
            with pytest.raises(Exception, match="locked"):
                other.driver_connection.execute("BEGIN IMMEDIATE")
            other.invalidate()
    with store.read() as r:
        assert r.execute(seq).scalar() == before + 1  # committed
    with store.batch_write() as s:
        assert s.info[RAW] is seen[0]  # the same connection, kept
    with pytest.raises(RuntimeError):
        with store.batch_write() as s:
            s.execute(bump)
            raise RuntimeError("the batch fails")
    with store.batch_write() as s:
        assert s.execute(seq).scalar() == before + 1  # rolled back
        assert s.info[RAW] is not seen[0]  # the failed batch's connection was dropped
        seen.append(s.info[RAW])
    got = []

    def other_thread() -> None:
        with store.batch_write() as s:
            got.append(s.info[RAW])
    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    assert got and got[0] is not seen[1]
    kept = list(store._kept_all)
    store.dispose()
    assert len(kept) == 2 and all(c.closed for c in kept) and store._kept_all == []


def test_64_clients_two_processes_never_overcommit(db_and_lock, tmp_path):
    """On PostgreSQL with either claim lock: one claim transaction at a time across the
    two processes ("store"), or concurrent batches that row-lock their hosts ("rows")."""
    db_url, claim_lock = db_and_lock
    store = Store.from_url(db_url)
    upgrade(store.engine)  # before both processes start, so they do not race on the schema
    cfg = _config(tmp_path, db_url, claim_lock)
    servers = [Scheduler(cfg, free_port(), dict(os.environ), tmp_path / f"s{i}.log") for i in range(2)]
    http = httpx.Client(timeout=60)  # one for the 64 threads: a client is ~30 ms of CPU
    try:
        for srv in servers:
            srv.spawn()
        for srv in servers:
            srv.wait_ready()
        base = [srv.url for srv in servers]

        def post(url: str, body: dict, headers: dict) -> httpx.Response:
            # a loaded replica may shed (503 hyb.scheduler.overloaded, Retry-After): a client
            # retries, as hybctl and hostd do (a VM with the same key); the ledger is judged below
            for _ in range(30):
                r = http.post(url, json=body, headers=headers)
                if r.status_code != 503:
                    break
                assert r.json()["error"]["code"] == "hyb.scheduler.overloaded", r.text
                time.sleep(float(r.headers["Retry-After"]))
            return r
        for n in range(3):
            r = post(f"{base[0]}/v1/hosts", host_body(f"h{n}", TIGHT), HOST)
            assert r.status_code == 201, r.text
        # capacity: 3 hosts x 2 nodes x 6 VM CPUs = 36 CPUs; 64 requests of 1-3 vCPUs ask for ~128
        def one(i: int) -> tuple[int, dict]:
            body = vm_body(f"vm-{i}", vcpus=1 + i % 3, memory_mib=256 * (1 + i % 2),
                           vfs=[{"min_tx_rate_mbps": 300}] if i % 4 == 0 else [])
            r = post(f"{base[i % 2]}/v1/vms", body, TA | {"Idempotency-Key": f"key-{i}"})
            return r.status_code, r.json()
        with ThreadPoolExecutor(64) as pool:
            results = list(pool.map(one, range(64)))
        codes = Counter(c for c, _ in results)
        assert set(codes) <= {202, 507, 409}, codes
        assert codes[202] >= 12, codes
        for c, body in results:
            if c != 202:
                assert body["error"]["code"] in ("hyb.placement.no_valid_host", "hyb.concurrent_update")
        # the ledger: no CPU, page, VF or min-rate budget handed out twice, and each host's
        # usage equals the sum of its live allocations
        with store.read() as s:
            vms = s.query(Vm).filter(Vm.status.in_(LIVE)).all()
            assert len(vms) == codes[202]
            for h in s.query(Host).all():
                allocs = [Allocation.from_dict(v.allocation) for v in vms if v.host == h.name]
                cpus = [c for a in allocs for c in a.cpus]
                assert len(cpus) == len(set(cpus)), f"{h.name}: CPU double-booked"
                used = Usage.of(allocs)
                assert Usage.from_dict(h.usage) == used, f"{h.name}: ledger != sum of allocations"
                for node in (0, 1):
                    assert used.pages.get((node, 2048), 0) <= 512
                    assert len([c for c in used.cpus if c in node_cpus(node)]) <= 6
                assert all(v <= 1000 for v in used.reserved_mbps.values())
                vfs = [(v.pf, v.index) for a in allocs for v in a.vfs]
                assert len(vfs) == len(set(vfs))
        listed = http.get(f"{base[1]}/v1/vms?limit=1000", headers=ADM).json()["items"]
        assert len(listed) == codes[202]
    finally:
        http.close()
        for srv in servers:
            srv.stop()
        store.dispose()


def node_cpus(node: int) -> set[int]:
    cores = TIGHT.nodes * TIGHT.cores_per_node
    return {node * TIGHT.cores_per_node + k + t * cores for k in range(TIGHT.cores_per_node) for t in (0, 1)}


def test_stale_index_refits_and_stale_generation_loses(db_url):
    """Two placers (two scheduler instances) with the same warm index: the second one's
    candidate is stale, so its claim re-checks inside the transaction and takes other CPUs;
    a write with an old generation touches 0 rows."""
    from sched_helpers import make_client
    from scheduler.fit import VmWant
    from scheduler.repo.hosts import bump_usage
    from scheduler.errors import ConcurrentUpdate, NoValidHost
    from scheduler.service.claims import Affinity
    one = Shape("one", nodes=1, cores_per_node=3, smt=1, io_cores_per_node=1, host_cores=0,
                pages_2m_per_node=64, vfs_per_node=0, disks_per_node=0)
    with make_client(db_url) as a, make_client(db_url) as b:
        assert a.post("/v1/hosts", json=host_body("h1", one), headers=HOST).status_code == 201
        pa, pb_ = a.app.state.placer, b.app.state.placer
        pb_.cache.refresh(pb_.store, now=pb_.clock())
        pb_.cache.refresh = lambda *a, **k: None  # b's index never refreshes: always stale
        pb_.cache.learn = lambda *a, **k: None  # ... and never learns from its own claims
        rows = []

        def write(tag):
            def w(s, host, alloc):
                rows.append((tag, alloc.cpus))
                return alloc
            return w
        pa.claim(VmWant(1, 2), Affinity(), write("a"))
        pb_.claim(VmWant(1, 2), Affinity(), write("b"))  # stale index says CPU 1 is free
        assert rows == [("a", (1,)), ("b", (2,))]
        with pytest.raises(ConcurrentUpdate):
            pb_.claim(VmWant(1, 2), Affinity(), write("c"))  # full: the re-fit fails everywhere
        # a's index follows the change feed: it knows the host is full and says why
        with pytest.raises(NoValidHost) as e:
            pa.claim(VmWant(1, 2), Affinity(), write("d"))
        assert e.value.extra["rejections"] == {"vcpus": 1}
        with pa.store.write() as s:
            gen = s.get(Host, "h1").generation
            assert not bump_usage(session=s, name="h1", seen_generation=gen - 1, usage=Usage(), now=0)
            assert Usage.from_dict(s.get(Host, "h1").usage).cpus == {1, 2}


def test_index_learns_down_hosts_from_the_quiet_query_not_full_passes(db_url, monkeypatch):
    """The index judges "down" from the indexed quiet-hosts query, not by reading every
    host's heartbeat: a host that stops heartbeating drops out of placement, one that
    resumes comes back (through the feed stamp its heartbeat makes, and also when that
    stamp is missing), and no full pass runs after the first."""
    from sqlalchemy import update

    from sched_helpers import Clock, make_client
    from scheduler.repo import hosts as host_repo
    from scheduler.fit import VmWant
    from scheduler.service.hostcache import HostCache
    clock = Clock()
    with make_client(db_url, clock=clock) as c:
        for n in ("h1", "h2", "h3"):
            assert c.post("/v1/hosts", json=host_body(n), headers=HOST).status_code == 201
        store = c.app.state.store
        cache = HostCache(heartbeat_timeout_s=60, full_refresh_s=1e9, down_check_s=0)
        cache.refresh(store, now=clock())  # first use: the full pass
        fulls: list[int] = []
        monkeypatch.setattr(host_repo, "fleet_state", lambda **k: fulls.append(1) or [])

        def states() -> dict[str, str]:
            cache.refresh(store, now=clock())
            return {n: e.view.state for n, e in sorted(cache.index.entries.items())}

        def beat(*names: str) -> None:
            for n in names:
                assert c.post(f"/v1/hosts/{n}/heartbeat", headers=HOST).status_code == 200
        assert states() == {"h1": "active", "h2": "active", "h3": "active"}
        clock.t += 61
        beat("h2", "h3")
        assert states() == {"h1": "down", "h2": "active", "h3": "active"}
        assert cache.row("h1").state == "down" and cache.row("h2").state == "active"
        assert cache.walk(VmWant(1, 1024), avoid_hosts=frozenset(), avoid_racks=frozenset(), skip=frozenset(),
                          limit=3)[0].candidates[0].host != "h1"
        beat("h1")  # back from down: its heartbeat stamps the feed
        assert states() == {"h1": "active", "h2": "active", "h3": "active"}
        clock.t += 61
        beat("h2", "h3")
        assert states()["h1"] == "down"
        with store.write() as s:  # a heartbeat written without its stamp: the quiet check alone
            s.execute(update(Host).where(Host.name == "h1").values(last_heartbeat=clock()))
        assert states() == {"h1": "active", "h2": "active", "h3": "active"}
        assert fulls == []


def test_example_config_documents_every_key(monkeypatch):
    """scheduler/scheduler.example.toml loads, sets every key the Settings model has, and
    the environment overrides it."""
    import tomllib

    from scheduler.config import Settings, load_settings
    path = REPO / "scheduler/scheduler.example.toml"
    data = tomllib.loads(path.read_text())
    for name, f in Settings.model_fields.items():
        if hasattr(f.annotation, "model_fields") and name != "auth":
            assert set(data[name]) == set(f.annotation.model_fields), name
    monkeypatch.setenv("HYB_SCHED_DB__URL", "sqlite:////tmp/x.db")
    s = load_settings(path)
    assert s.db.url == "sqlite:////tmp/x.db" and s.placement.default_policy == "pack"
    assert [t.scopes for t in s.auth.tokens] == [["admin"], ["tenant:web"], ["host"]]


def test_sqlite_checkpoints_beside_the_writers_not_in_a_commit(tmp_path):
    """A commit that takes SQLite's WAL past 1,000 pages does not checkpoint (the default
    would, inside that commit and so under the writer lock every replica queues on: an
    fsync of the database file, up to 2.5 s on this machine's shared disk); the store's
    checkpointer thread copies the WAL back soon after the writes, and a store that was
    never written to runs none. A checkpoint is seen in the database file: the pages a
    commit adds live in the WAL until one copies them there."""
    db = tmp_path / "s.db"
    store = Store.from_url(f"sqlite:///{db}")
    try:
        upgrade(store.engine)
        assert store.checkpointer is not None
        with store.engine.connect() as c:
            assert c.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == 0
        store.checkpointer.close()
        store.checkpointer = Checkpointer(str(db), every_s=3600)  # the commit below, alone
        size = db.stat().st_size
        with store.write() as s:  # ~2,000 pages of 4 KiB in one commit
            s.execute(text("INSERT INTO audit (at, principal, action, target, detail) "
                           "VALUES (:at, 'test', 'fill', :t, :d)"),
                      [{"at": i, "t": f"t{i}", "d": '"' + "x" * 3000 + '"'} for i in range(2000)])
        assert db.stat().st_size == size  # in the WAL only: the commit did not checkpoint
        assert Path(f"{db}-wal").stat().st_size > 1000 * 4096

        reader = Store.from_url(f"sqlite:///{db}")
        try:
            with reader.read() as s:
                assert s.execute(text("SELECT count(*) FROM audit")).scalar() >= 2000
            assert reader.checkpointer is not None and reader.checkpointer._thread is None  # read only: none
        finally:
            reader.dispose()

        store.checkpointer.close()
        store.checkpointer = ckpt = Checkpointer(str(db), every_s=0.2)
        timed: list[float] = []
        ckpt.observe = timed.append  # the replica's hyb_sched_sqlite_checkpoint_seconds
        with store.write() as s:
            s.execute(text("INSERT INTO audit (at, principal, action, target, detail) "
                           "VALUES (1, 'test', 'one', 't', '{}')"))
        deadline = time.monotonic() + 30
        # the file grows while the checkpoint runs; it is counted once its fsync is done
        while db.stat().st_size < size + 1500 * 4096 or ckpt.runs == 0:
            assert time.monotonic() < deadline, (size, db.stat().st_size, ckpt.runs)
            time.sleep(0.1)
        assert len(timed) == ckpt.runs and all(0 <= t < 30 for t in timed)
    finally:
        store.dispose()
    assert ckpt._thread is not None and not ckpt._thread.is_alive()  # stopped with the store
