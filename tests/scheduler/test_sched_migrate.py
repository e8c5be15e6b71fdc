"""Live migration, the scheduler's side (scheduler/service/migrations.py), with real
parts but QEMU: a real scheduler (its drain loop, SQLite and PostgreSQL) and three real
hostd gRPC servers in-process, each with its own libvirt test driver and ledger
(tests/scheduler/drain_fleet.py ``private_fleet``): hostd's own PrepareMigration,
MigrateVM, CompleteMigration and AbortMigration run, with their claims and refusals;
only libvirt's job is played (tools/dev/hostd_inproc.py ``InprocMigrations``). The QEMU
move with two real libvirtd hosts is tests/e2e/test_e2e_migrate.py.

The invariant checked throughout: exactly one hostd runs the VM, and the scheduler's
claims agree with the hostds' ledgers once a move settles."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import libvirt
import pytest
import uvicorn

from api.states import VmStatus
from drain_fleet import Fleet, certs, create, private_fleet, wait  # noqa: F401 - fixtures
from tools.dev.hostd_inproc import SWITCH
from tools.dev.procs import REPO, free_port
from sched_helpers import ADM, HOST, TA, Clock
from scheduler.repo import hosts as host_repo
from scheduler.resources import Usage

MIGRATE = {"on_maintenance": "migrate"}
DISK = {"disks": [{"class": "nvme", "iotune": {"total_bytes_sec": 10**8, "total_iops_sec": 1000}}]}


def running_on(f: Fleet, vm_id: str) -> list[str]:
    """The hosts that run the VM: its domain runs (not paused) on the host's own test
    driver, whatever the host's ledger says meanwhile (incoming, migrating, running)."""
    out = []
    with SWITCH:  # no switch-over half seen
        for name, h in f.hostds.items():
            for v in h.manager.list():
                if v.request_id == vm_id:  # the scheduler's VM id is hostd's request id
                    try:
                        if h.libvirt.conn().lookupByUUIDString(v.vm_id).state()[0] == libvirt.VIR_DOMAIN_RUNNING:
                            out.append(name)
                    except libvirt.libvirtError:
                        pass
    return out


def claimed(api, host: str) -> tuple[list[int], list[str]]:  # type: ignore[no-untyped-def]
    """The scheduler's claims on a host: CPUs and disks held."""
    with api.app.state.store.read() as s:
        u = Usage.from_dict(host_repo.get_host(session=s, name=host).usage)
    return sorted(u.cpus), sorted(u.disks)


def hostd_claims(f: Fleet, host: str) -> tuple[list[int], list[str]]:
    u = f.hostds[host].manager.ledger.usage()
    return sorted(u.cpus), sorted(u.disks)


def vm(api, vm_id: str) -> dict:  # type: ignore[no-untyped-def]
    return api.get(f"/v1/vms/{vm_id}", headers=ADM).json()


def audit(api, vm_id: str) -> list[dict]:  # type: ignore[no-untyped-def]
    return [a["detail"] for a in api.get("/v1/audit", headers=ADM).json()["items"]
            if a["action"] == "vm.migrate" and a["target"] == vm_id]


def test_a_drain_moves_migrate_vms_live_one_at_a_time_under_a_budget_of_one(private_fleet: Fleet) -> None:
    f = private_fleet
    with f.scheduler(register=True) as api:
        web = MIGRATE | {"disruption_budget": {"group": "web", "max_unavailable": 1}}
        ids = [create(api, n, **web) for n in ("web-1", "web-2", "web-3")]
        db = create(api, "db-1", **MIGRATE, **DISK)
        before = {i: vm(api, i) for i in [*ids, db]}
        assert {v["host"] for v in before.values()} == {"h1"}
        samples: list[tuple[int, dict[str, list[str]]]] = []  # (moving web VMs, where each VM runs)
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                vms = api.get("/v1/vms", headers=ADM).json()["items"]
                moving = sum(1 for v in vms if v["migration"] and v["name"].startswith("web-"))
                samples.append((moving, {i: running_on(f, i) for i in [*ids, db]}))
                time.sleep(0.02)
        t = threading.Thread(target=sample)
        t.start()
        try:
            assert api.post("/v1/hosts/h1/drain", json={"reason": "kernel"}, headers=ADM).status_code == 200
            view = wait(lambda: (v := api.get("/v1/hosts/h1/drain", headers=HOST).json())["drained"] and v,
                        "h1 drained", 60)
        finally:
            done.set()
            t.join()
        assert all(s["action"] == "done" for s in view["steps"]) and view["left"] == 0
        # one web VM moving at a time; every VM ran on exactly one hostd at every sample
        assert samples and max(m for m, _ in samples) == 1, samples[:10]
        bad = [(i, where) for _, runs in samples for i, where in runs.items() if len(where) != 1]
        assert not bad, bad[:5]
        after = {i: vm(api, i) for i in [*ids, db]}
        for i in [*ids, db]:  # the same VMs (not replacements), running elsewhere, nothing left moving
            a, b = before[i], after[i]
            assert b["id"] == i and b["status"] == "running" and b["host"] in ("h2", "h3") and b["migration"] is None
            assert b["hostd_vm_id"] == a["hostd_vm_id"] and b["reason"] == ""
            assert running_on(f, i) == [b["host"]]
            [d] = audit(api, i)[:1]  # newest first: done
            assert d["result"] == "done" and d["from"] == "h1" and d["to"] == b["host"] and d["downtime_ms"] == 3
        # the disk came with db-1 (exactly its size, on the target's allow-list), its throttle kept
        assert [d["name"] for d in after[db]["placement"]["disks"]] == ["nvme0n1"]
        assert after[db]["placement"]["disks"][0]["bytes_sec"] == 10**8
        # h1 is free on both sides; the claims agree with the hostds' ledgers everywhere
        assert claimed(api, "h1") == ([], []) == hostd_claims(f, "h1")
        assert f.hostds["h1"].manager.list() == []
        for h in ("h2", "h3"):
            assert claimed(api, h) == hostd_claims(f, h)
        assert api.get("/v1/hosts/h1", headers=HOST).json()["vms"] == 0


def test_an_operator_moves_a_vm_by_hand_and_bad_asks_change_nothing(private_fleet: Fleet) -> None:
    f = private_fleet
    with f.scheduler(register=True) as api:
        a = create(api, "app-1")
        peer = create(api, "app-2", anti_affinity={"group": "app"})
        v = vm(api, a)
        assert v["host"] == "h1"
        hosts_before = {h: claimed(api, h) for h in ("h1", "h2", "h3")}
        assert api.post("/v1/hosts/h2/cordon", json={"reason": "x"}, headers=ADM).status_code == 200
        refused = [
            ({"target_host": "h9"}, 422, "hyb.request.invalid", "target_host", "no host named 'h9'"),
            ({"target_host": "h1"}, 409, "hyb.migration.refused", "target_host", "runs on h1 already"),
            ({"target_host": "h2"}, 409, "hyb.migration.refused", "target_host", "h2 is cordoned"),
            ({"target_host": ""}, 422, "hyb.request.invalid", "target_host", ""),
            ({"target": "h3"}, 422, "hyb.request.invalid", "target", ""),
        ]
        for body, status, code, field, text in refused:
            r = api.post(f"/v1/vms/{a}/migrate", json=body, headers=ADM)
            assert r.status_code == status and r.json()["error"]["code"] == code, (body, r.text)
            assert r.json()["error"]["field"] == field and text in r.json()["error"]["message"], (body, r.text)
        # the VM's disruption budget (none left: 0) and a VF (it cannot move live) refuse too
        quorum = create(api, "q-1", disruption_budget={"group": "q", "max_unavailable": 0})
        with_vf = create(api, "vf-1", vfs=[{"max_tx_rate_mbps": 100}])
        for vm_id, field, text in ((quorum, "disruption_budget", "group a/q: 0 of its VMs unavailable"),
                                   (with_vf, "vfs[0].migration", "SR-IOV VF does not move live with migration=none")):
            r = api.post(f"/v1/vms/{vm_id}/migrate", json={"target_host": "h3"}, headers=ADM)
            assert r.status_code == 409 and r.json()["error"]["field"] == field, r.text
            assert text in r.json()["error"]["message"], r.text
            assert vm(api, vm_id)["migration"] is None and audit(api, vm_id) == []
        hosts_before = {h: claimed(api, h) for h in ("h1", "h2", "h3")}
        # a tenant may not move its VM: an operator's act (scheduler/policies.py move_vm)
        r = api.post(f"/v1/vms/{a}/migrate", json={}, headers=TA)
        assert r.status_code == 403, r.text
        # nothing changed
        assert vm(api, a) == v and {h: claimed(api, h) for h in ("h1", "h2", "h3")} == hosts_before
        assert audit(api, a) == [] and running_on(f, a) == ["h1"]

        # the move, held at the source's job: a second ask answers the running move
        gate = threading.Event()
        f.hostds["h1"].migrations.gate = gate
        r = api.post(f"/v1/vms/{a}/migrate", json={"target_host": "h3"}, headers=ADM)
        assert r.status_code == 202, r.text
        assert r.json()["host"] == "h1" and r.json()["migration"]["target_host"] == "h3"
        assert f.hostds["h1"].migrations.waiting.wait(10)
        moving = vm(api, a)
        assert moving["migration"]["state"] == "migrating" and moving["host"] == "h1"
        again = api.post(f"/v1/vms/{a}/migrate", headers=ADM)  # no body: whatever target
        assert again.status_code == 200 and again.json()["migration"]["target_host"] == "h3"
        other = api.post(f"/v1/vms/{a}/migrate", json={"target_host": "h2"}, headers=ADM)
        assert other.status_code == 409 and other.json()["error"]["code"] == "hyb.vm.migrating"
        assert "moving live to h3" in other.json()["error"]["message"]
        # both claims held while it moves: the source's and the target's
        assert claimed(api, "h1")[0] and claimed(api, "h3")[0]
        assert api.delete(f"/v1/vms/{a}", headers=TA).status_code == 409  # not while it moves
        gate.set()
        got = wait(lambda: (x := vm(api, a))["migration"] is None and x, "the move to end")
        assert got["host"] == "h3" and got["status"] == "running" and running_on(f, a) == ["h3"]
        assert claimed(api, "h1") == hostd_claims(f, "h1") and claimed(api, "h3") == hostd_claims(f, "h3")
        assert [d["result"] for d in audit(api, a)] == ["done", "started"]

        # placement picks (anti-affinity: app-2's host is avoided; the VM itself is not
        # counted against itself)
        assert api.post("/v1/hosts/h2/uncordon", headers=ADM).status_code == 200
        p = vm(api, peer)
        r = api.post(f"/v1/vms/{peer}/migrate", headers=ADM)
        assert r.status_code == 202, r.text
        got = wait(lambda: (x := vm(api, peer))["migration"] is None and x, "app-2's move")
        assert got["host"] not in (p["host"],) and running_on(f, peer) == [got["host"]]


def test_a_failed_move_leaves_the_vm_running_on_its_source(private_fleet: Fleet) -> None:
    f = private_fleet
    with f.scheduler(register=True) as api:
        a = create(api, "app-1", **DISK)
        f.hostds["h1"].migrations.fail = ["unable to connect to server: Connection refused"]
        r = api.post(f"/v1/vms/{a}/migrate", json={"target_host": "h2"}, headers=ADM)
        assert r.status_code == 202
        got = wait(lambda: (x := vm(api, a))["migration"] is None and x, "the move to fail")
        assert got["host"] == "h1" and got["status"] == "running" and running_on(f, a) == ["h1"]
        assert got["reason"].startswith("migration failed: to h2 (") and "Connection refused" in got["reason"]
        assert got["reason"].endswith("; it runs on h1")
        # the target let go of what it prepared, on both sides
        assert f.hostds["h2"].manager.list() == [] and claimed(api, "h2") == ([], []) == hostd_claims(f, "h2")
        assert claimed(api, "h1") == hostd_claims(f, "h1")
        [failed, _started] = audit(api, a)
        assert failed["result"] == "failed" and "Connection refused" in failed["reason"]
        # asked again, it moves; the note goes
        assert api.post(f"/v1/vms/{a}/migrate", json={"target_host": "h2"}, headers=ADM).status_code == 202
        got = wait(lambda: (x := vm(api, a))["migration"] is None and x, "the second move")
        assert got["host"] == "h2" and got["reason"] == "" and running_on(f, a) == ["h2"]


def test_a_target_that_does_not_answer_is_asked_once_a_round_until_it_does(private_fleet: Fleet, caplog) -> None:  # type: ignore[no-untyped-def]
    """h2 registered at an address nothing listens on (its hostd restarting, say): not down
    (it registered just now), so the move waits, asked again by each drain round, not at
    once: the retries woke the drain loop at once, ~15 a second in a CI run, until gRPC's
    reconnect backoff refused every call and the move was undone. Once h2 answers at its
    address again, the move goes through."""
    f = private_fleet
    caplog.set_level(logging.WARNING, logger="scheduler.service.migrations")
    with f.scheduler(register=True, drain={"interval_s": 0.5}) as api:
        a = create(api, "app-1", **DISK)
        f.register(api, "h2", address=f"localhost:{free_port()}")
        assert api.post(f"/v1/vms/{a}/migrate", json={"target_host": "h2"}, headers=ADM).status_code == 202
        t0 = time.monotonic()
        time.sleep(3)
        asked = [r for r in caplog.records if "PrepareMigration on h2" in r.getMessage()]
        rounds = (time.monotonic() - t0) / 0.5
        assert 1 <= len(asked) <= rounds + 2, (len(asked), rounds)
        held = vm(api, a)
        assert held["host"] == "h1" and held["migration"]["state"] == "preparing", held
        assert "not settled yet" in held["reason"] and running_on(f, a) == ["h1"]
        f.register(api, "h2")  # back at its own address
        got = wait(lambda: (x := vm(api, a))["migration"] is None and x, "the move once h2 answers", 60)
        assert got["host"] == "h2" and got["reason"] == "" and running_on(f, a) == ["h2"]
        assert claimed(api, "h2") == hostd_claims(f, "h2") and claimed(api, "h1") == hostd_claims(f, "h1")


@pytest.mark.parametrize("point,phase,ends_on", [("claimed", "preparing", "h2"), ("prepared", "starting", "h1"),
                                                  ("migrated", "settling", "h2")])
def test_a_scheduler_stopped_mid_move_is_resumed_or_undone_by_the_next(private_fleet: Fleet, point: str, phase: str,
                                                                       ends_on: str) -> None:
    """The first scheduler stops driving the move at ``point`` (what it persisted stays);
    the next one, on the same database, settles it: before PrepareMigration it carries
    the move on; with ``migrating`` recorded but MigrateVM never sent the target has
    nothing running, so it is aborted and the source kept; after MigrateVM the VM runs on
    the target, which is completed. One running copy throughout, claims as the hostds'."""
    f = private_fleet
    with f.scheduler(register=True, drain={"interval_s": 0}) as api:  # no loop: nothing resumes here
        a = create(api, "app-1", **DISK)
        api.app.state.migrations.crash_at = {point}
        assert api.post(f"/v1/vms/{a}/migrate", json={"target_host": "h2"}, headers=ADM).status_code == 202
        stopped = wait(lambda: not api.app.state.migrations._busy and vm(api, a), "the first scheduler to stop")
        assert stopped["migration"] is not None and stopped["host"] == "h1"
        assert stopped["migration"]["phase"] == phase  # where it stopped, as the API shows it
        assert len(running_on(f, a)) == 1
    # the next one, a second later: its drain round resumes the move, the lease having run
    # out (on SQLite, one process, at once)
    with f.scheduler(migration={"lease_s": 0.5}, clock=Clock(1_000_001.0)) as api:
        got = wait(lambda: (x := vm(api, a))["migration"] is None and x, "the move to settle", 30)
        assert got["host"] == ends_on and got["status"] == VmStatus.RUNNING and running_on(f, a) == [ends_on]
        for h in ("h1", "h2"):
            assert claimed(api, h) == hostd_claims(f, h), h
        other = "h1" if ends_on == "h2" else "h2"
        assert f.hostds[other].manager.list() == []
        last = got["last_migration"]
        assert (last["from_host"], last["to_host"], last["result"]) == ("h1", "h2", "done" if ends_on == "h2" else
                                                                        "failed")
        assert last["started"] == 1_000_000.0 and last["total_s"] == 1.0  # asked by the first, settled by the next
        if ends_on == "h1":
            assert got["reason"].startswith("migration failed: to h2") and "a scheduler stopped mid-way" in got["reason"]
            assert "a scheduler stopped mid-way" in last["reason"] and last["downtime_ms"] == 0


def test_a_drain_tries_a_failed_move_again_at_once(private_fleet: Fleet) -> None:
    """A ``migrate`` VM whose first move fails (libvirt's job: the VM stays on h1) is
    moved by the drain's next round; the failure is in the audit, the drain finishes."""
    f = private_fleet
    with f.scheduler(register=True) as api:
        a = create(api, "app-1", **MIGRATE)
        f.hostds["h1"].migrations.fail = ["operation failed: migration job: unexpectedly failed"]
        assert api.post("/v1/hosts/h1/drain", headers=ADM).status_code == 200
        assert wait(lambda: api.get("/v1/hosts/h1/drain", headers=HOST).json()["drained"], "h1 drained", 30)
        got = vm(api, a)
        assert got["host"] in ("h2", "h3") and got["reason"] == "" and running_on(f, a) == [got["host"]]
        results = [d["result"] for d in audit(api, a)]
        assert results == ["done", "started", "failed", "started"], results
        assert "unexpectedly failed" in audit(api, a)[2]["reason"]
        assert claimed(api, "h1") == ([], []) == hostd_claims(f, "h1")


STATS = {"time_elapsed": 1500, "memory_remaining": 64 << 20, "disk_remaining": 1 << 30, "memory_bps": 100 << 20,
         "downtime": 40}  # libvirt's job statistics, as hostd's sampler keeps them


def test_a_moves_progress_is_shown_while_it_runs_and_its_end_after(private_fleet: Fleet) -> None:
    """While the source's job runs, the VM (and the drain view) shows the source hostd's
    GetMigration sample the driving scheduler took, with its age; API reads do not ask
    the hostd. Afterwards the VM keeps the last move's end: total time, libvirt's job time
    and downtime; a failed move its reason. The scheduler counts both."""
    f = private_fleet
    clock = Clock(1_000_000.0)
    with f.scheduler(register=True, clock=clock, migration={"progress_s": 0.2}) as api:
        a = create(api, "app-1", **DISK)
        src = f.hostds["h1"].migrations
        src.gate, src.stats = threading.Event(), dict(STATS)
        asked = clock.t
        r = api.post(f"/v1/vms/{a}/migrate", json={"target_host": "h2"}, headers=ADM)
        assert r.status_code == 202, r.text
        assert r.json()["migration"]["phase"] == "preparing" and r.json()["migration"]["progress"] is None
        assert r.json()["migration"]["started"] == asked and r.json()["last_migration"] is None
        assert src.waiting.wait(10)
        m = wait(lambda: (x := vm(api, a)["migration"])["progress"] and x, "the first sample")
        assert m["state"] == "migrating" and m["phase"] == "disks" and m["target_host"] == "h2"
        assert m["progress"] == {"sampled_at": clock.t, "age_s": 0.0, "active": True, "elapsed_ms": 1500,
                                 "memory_remaining_bytes": 64 << 20, "disk_remaining_bytes": 1 << 30,
                                 "memory_bps": 100 << 20, "expected_downtime_ms": 40}
        # its age: the clock moves on; a read shows the sample it has and how old it is
        clock.t += 7
        p = vm(api, a)["migration"]["progress"]
        assert p["age_s"] == round(clock.t - p["sampled_at"], 3) and p["sampled_at"] in (clock.t - 7, clock.t)
        # reads are answered from the row: the hostd is asked every progress_s, not per read
        calls: list[float] = []
        progress = src.progress
        src.progress = lambda name: (calls.append(time.monotonic()), progress(name))[1]  # type: ignore[method-assign]
        t0 = time.monotonic()
        for _ in range(40):
            assert vm(api, a)["migration"]["progress"] is not None
        took = time.monotonic() - t0
        assert len(calls) <= took / 0.2 + 2 and len(calls) < 40, (len(calls), took)
        # the disks are mirrored: memory is copied now
        src._last[hostd_name(a, "app-1")]["disk_remaining"] = 0
        wait(lambda: vm(api, a)["migration"]["phase"] == "memory", "the memory phase")
        # the drain view shows the move with the same progress
        steps = api.get("/v1/hosts/h1/drain", headers=HOST).json()["steps"]
        [step] = [s for s in steps if s["vm"] == a]
        assert step["migration"]["target_host"] == "h2" and step["migration"]["phase"] == "memory"
        assert step["migration"]["progress"]["memory_remaining_bytes"] == 64 << 20
        src.gate.set()
        got = wait(lambda: (x := vm(api, a))["migration"] is None and x, "the move to end")
        assert got["host"] == "h2"
        assert got["last_migration"] == {"from_host": "h1", "to_host": "h2", "result": "done", "reason": "",
                                         "started": asked, "finished": clock.t, "total_s": 7.0, "job_ms": 12,
                                         "downtime_ms": 3, "data_bytes": 4096}
        assert audit(api, a)[0]["total_s"] == 7.0

        # a move that fails: its end says why, it never switched over (no downtime)
        src.gate, src.stats = None, None
        back = api.post(f"/v1/vms/{a}/migrate", json={"target_host": "h1"}, headers=ADM)
        assert back.status_code == 202 and back.json()["last_migration"]["result"] == "done"  # the last one, still
        f.hostds["h2"].migrations.fail = ["operation failed: migration job: unexpectedly failed"]
        got = wait(lambda: (x := vm(api, a))["migration"] is None and x, "the move to fail")
        last = got["last_migration"]
        assert got["host"] == "h2" and last["result"] == "failed" and last["from_host"] == "h2"
        assert "unexpectedly failed" in last["reason"] and last["downtime_ms"] == 0 and last["total_s"] == 0.0
        metrics = api.get("/metrics", headers=ADM).text
        for line in ('hyb_sched_migrations_total{result="started"} 2.0',
                     'hyb_sched_migrations_total{result="done"} 1.0',
                     'hyb_sched_migrations_total{result="failed"} 1.0',
                     'hyb_sched_migration_seconds_count{result="done"} 1.0',
                     'hyb_sched_migration_seconds_sum{result="done"} 7.0',
                     'hyb_sched_migration_seconds_count{result="failed"} 1.0'):
            assert line in metrics, line


def hostd_name(vm_id: str, name: str) -> str:
    return f"{name}-{vm_id[:8]}"


@contextlib.contextmanager
def served(app) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """The scheduler app the TestClient started (its lifespan ran there), also over real
    HTTP on a local port, for a client that is a process of its own (hybctl)."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), lifespan="off",
                                           log_level="warning"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    wait(lambda: server.started, "uvicorn to listen", 10)
    try:
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        t.join(10)


def hybctl(url: str, token: Path, *argv: str, background: bool = False):  # type: ignore[no-untyped-def]
    """hybctl ARGV, the installed command, against ``url`` with the admin's token file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYBCTL_")}
    cmd = [str(REPO / ".venv/bin/hybctl"), "--server", url, "--token-file", str(token), *argv]
    env |= {"HYBCTL_CONFIG": str(token.parent / "none.yaml"), "COLUMNS": "250"}
    if background:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)


def test_hybctl_moves_a_vm_follows_its_progress_and_names_a_failure(private_fleet: Fleet, tmp_path: Path) -> None:
    """``hybctl vm migrate --wait`` against a real scheduler (over HTTP) and hostds: it
    draws the move's progress until the VM runs on the target and exits 0; a move that
    fails exits 1 with one line naming its reason; a refusal names the field;
    ``vm show`` and ``host drain --status`` show a running move and the last one's end."""
    f = private_fleet
    token = tmp_path / "adm.token"
    token.write_text("adm\n")
    token.chmod(0o600)
    with f.scheduler(register=True, migration={"progress_s": 0.1}) as api, served(api.app) as url:
        a = create(api, "app-1", **DISK)
        src = f.hostds["h1"].migrations
        src.gate, src.stats = threading.Event(), dict(STATS)
        p = hybctl(url, token, "vm", "migrate", a, "--to", "h2", "--wait", "--interval", "0.2", background=True)
        try:
            assert src.waiting.wait(20)
            wait(lambda: vm(api, a)["migration"]["progress"], "the first sample")
            show = hybctl(url, token, "vm", "show", a)
            assert show.returncode == 0, show.stderr
            moving = next(ln for ln in show.stdout.splitlines() if ln.startswith("moving live"))
            assert "to h2: disks, 64 MiB memory + 1 GiB disk left at 100 MiB/s, downtime ~40 ms" in moving, moving
            drain = hybctl(url, token, "host", "drain", "h1", "--status")
            assert drain.returncode == 0, drain.stderr
            row = next(ln for ln in drain.stdout.splitlines() if ln.startswith(a))
            assert "moving live to h2" in row and "to h2: disks, 64 MiB memory + 1 GiB disk left" in row, row
        finally:
            src.gate.set()
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        assert err == "" and "moving live to h2: disks, 64 MiB memory + 1 GiB disk left" in out, out
        assert out.rstrip().splitlines()[-1].startswith(f"VM {a} on h2: h1 -> h2 done in "), out
        assert "(job 12 ms, downtime 3 ms)" in out
        assert vm(api, a)["host"] == "h2" and running_on(f, a) == ["h2"]

        # a move that fails: exit 1, one line with the failure; the VM runs where it was
        src.gate, src.stats = None, None
        f.hostds["h2"].migrations.fail = ["operation failed: migration job: unexpectedly failed"]
        r = hybctl(url, token, "vm", "migrate", a, "--to", "h1", "--wait", "--interval", "0.2")
        assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
        assert r.stderr.startswith(f"error: VM {a}: the move to h1 failed: MigrateVM on h2: ") and \
            "unexpectedly failed" in r.stderr and r.stderr.rstrip().endswith("it runs on h2"), r.stderr
        assert running_on(f, a) == ["h2"]
        show = hybctl(url, token, "vm", "show", a)
        last = next(ln for ln in show.stdout.splitlines() if ln.startswith("last move"))
        assert "h2 -> h1 failed" in last and "unexpectedly failed" in last, last
        # refusals name the field, change nothing
        for argv, text in ((["--to", "h9"], "hyb.request.invalid [target_host]: no host named 'h9'"),
                           (["--to", "h2"], "hyb.migration.refused [target_host]: the VM runs on h2 already")):
            r = hybctl(url, token, "vm", "migrate", a, *argv)
            assert r.returncode == 1 and r.stderr.count("\n") == 1 and text in r.stderr, r.stderr
        r = hybctl(url, token, "vm", "migrate", a, "--to", " ")
        assert r.returncode == 2 and "--to" in r.stderr and r.stderr.count("\n") == 1, r.stderr
        assert vm(api, a)["migration"] is None and vm(api, a)["host"] == "h2"


def test_vms_whose_vfs_say_how_they_move_move_live_by_hand(private_fleet: Fleet) -> None:
    """Issue 38 item 3, the scheduler's side: a VM whose VF asks ``interrupt`` moves; the
    target's own VF is claimed on both sides (its allocation, its hostd's ledger), the
    source's is freed. hostd unplugged the source's VF before the job and plugged the
    target's after arrival (device hot-plug and the job are played: the test driver has
    neither; no SR-IOV here, the PFs are the in-process layout's). The failover pair's XML
    and its refusals: tests/hostd/domain, tests/hostd/apply/test_migration_vf.py."""
    f = private_fleet
    with f.scheduler(register=True) as api:
        a = create(api, "vf-i", vfs=[{"max_tx_rate_mbps": 100, "migration": "interrupt"}])
        assert vm(api, a)["host"] == "h1"
        r = api.post(f"/v1/vms/{a}/migrate", json={"target_host": "h3"}, headers=ADM)
        assert r.status_code == 202, r.text
        moved = wait(lambda: (v := vm(api, a))["migration"] is None and v["host"] == "h3" and v, "moved", 30)
        assert moved["status"] == "running" and running_on(f, a) == ["h3"]
        assert [v["pf"] for v in moved["placement"]["vfs"]] == ["ens1f0"]
        (src_call,) = f.hostds["h1"].migrations.calls
        (dst_call,) = f.hostds["h3"].migrations.calls
        assert (src_call[0], dst_call[0]) == ("detach", "attach") and "<alias name=\"ua-vf0\"" in dst_call[2]
        assert f.hostds["h1"].manager.ledger.usage().vfs == frozenset()
        assert f.hostds["h3"].manager.ledger.usage().vfs == frozenset({("ens1f0", 0)})
        with api.app.state.store.read() as s:
            assert Usage.from_dict(host_repo.get_host(session=s, name="h3").usage).vfs == frozenset({("ens1f0", 0)})
            assert Usage.from_dict(host_repo.get_host(session=s, name="h1").usage).vfs == frozenset()
