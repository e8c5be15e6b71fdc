"""tools/dev/fleetsim.py: a fleet of real `hostd serve` processes on generated host trees,
registered with a real scheduler (SQLite, HTTPS, mTLS from the dev CA).

The hosts are generated trees (fleetsim_tree.py: 1 node, 8 CPUs, cgroup v1) kept alive by
the fleet's animator, and libvirt's test driver: no real hardware behind them. Checked
here: every host registers with its rack and labels; GetHostStats carries the healthy
signal, and a degraded host's signal (PSI, a foreign thread on io_cpus, a refused probe)
within a few seconds, in hostd and in the scheduler's stats history; a VM created over
gRPC survives a SIGKILL and restart of its hostd (and not a host reboot); a stopped hostd
times calls out; a broken tree makes a carve fail midway and roll back; stop() leaves no
process."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from tools.dev.fleetsim import SimFleet
from tools.dev.fleetsim_tree import CPUSET, IO_PID, NOISY_PID, POOL
from tools.dev.procs import REPO

from api import hostd_pb2 as pb

# xdist: simulated hosts on their own trees: not the machine group
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("fleetsim")]
N, RACKS = 10, 5


@pytest.fixture(scope="module")
def fleet(sched):
    f = SimFleet(sched["dir"] / "sim", N, RACKS, scheduler_url=sched["sched"].url, host_token=sched["host_token"],
                 admin_token=sched["admin"], certs=sched["certs"], days_s=2,
                 beat_stats=True)
    try:
        f.start(timeout_s=120)
        yield f
    finally:
        f.stop()


def stats(fleet: SimFleet, name: str, n: int = 3) -> list:
    stub, ch = fleet.stub(name, "fleet-rollout")  # read-only: any certificate of the CA
    try:
        return list(stub.GetHostStats(pb.GetHostStatsRequest(last=n), timeout=10).samples)
    finally:
        ch.close()


def wait(fn, what: str, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def test_every_host_registers_with_rack_and_labels(fleet: SimFleet) -> None:
    got = fleet.wait_registered()
    assert len(fleet.hosts) == N
    for h in fleet.hosts:
        row = got[h.name]
        assert (row["rack"], row["labels"], row["address"], row["state"]) == (h.rack, h.labels, h.address, "active")
        assert row["nodes"][0]["vm_cpus"] == [2, 3, 4, 5, 6, 7]  # the policy's layout on the tree
    assert {h.rack for h in fleet.hosts} == {f"r{i:02d}" for i in range(RACKS)}
    assert {h.labels["wave"] for h in fleet.hosts} == {"0", "1", "2", "3", "4"}
    assert len({h.pid for h in fleet.hosts}) == N and len({h.root for h in fleet.hosts}) == N


def test_every_host_sends_its_day_and_the_fleet_view_counts_it(fleet: SimFleet) -> None:
    """Each hostd folds its samples into its host-local day (hostd/health/daily.py) and
    sends it every days_s; the scheduler's utilisation view counts every host, with its
    CPU share as the simulated tree's animator makes it (the IO service and the agents
    busy on 8 CPUs)."""
    import datetime as dt
    today = dt.date.today().isoformat()  # the hosts' local day: this machine's

    def view() -> dict | None:
        with fleet.api() as api:
            r = api.get("/v1/fleet/utilization", params={"day": today, "window": "0-24",
                                                         "group": "rack", "bins": 20})
        assert r.status_code == 200, r.text
        d = r.json()["day"]
        return d if d["hosts_included"] == N else None
    d = wait(view, "every host's day in the fleet view", timeout=30)
    assert d["hosts_missing"] == 0 and len(d["groups"]) == RACKS
    assert all(0 < g["mean"] < 1 for g in d["groups"].values()), d["groups"]


def test_degrade_shows_in_hostd_and_scheduler(fleet: SimFleet) -> None:
    bad, good = fleet.hosts[1].name, fleet.hosts[2].name
    healthy = wait(lambda: len(s := stats(fleet, bad)) >= 2 and s, "two samples")
    for s in healthy:
        assert s.psi_some_avg10 < 1 and s.probe_failed == 0
        assert NOISY_PID not in [f.pid for f in s.top_foreign] and s.io_cpus == [0]
    # a 1 s sample may end before its probe answers on a loaded machine, so one sample can
    # count no probe: the probes answer across the samples, and none fails
    assert sum(s.probe_ok for s in healthy) >= 1, healthy
    fleet.degrade(bad)
    try:
        last = wait(lambda: (s := stats(fleet, bad, 1)[-1]).psi_some_avg10 > 20 and s.probe_failed and s,
                    "degraded signal", 10)
        noisy = [f for f in last.top_foreign if f.pid == NOISY_PID]
        assert noisy and noisy[0].cpu == 0 and noisy[0].comm == "scrub-backup" and not noisy[0].kernel
        assert all(s.psi_some_avg10 < 1 for s in stats(fleet, good))
        with fleet.api() as api:  # the heartbeat (every 2 s) carries it to the scheduler's history
            wait(lambda: (b := api.get(f"/v1/hosts/{bad}/stats").json()["items"]) and
                 (b[-1]["psi_some_avg10_max"] or 0) > 20 and b[-1]["probe_failed"] > 0, "stats", 10)
    finally:
        fleet.degrade(bad, on=False)
    wait(lambda: all(s.psi_some_avg10 < 1 and s.probe_ok and not s.probe_failed for s in stats(fleet, bad, 2)),
         "healed signal", 10)


def test_vm_survives_kill_and_restart_not_a_reboot(fleet: SimFleet) -> None:
    h = fleet.hosts[3]
    stub, ch = fleet.stub(h.name)  # the scheduler's certificate may create VMs
    try:
        vm = stub.CreateVM(pb.CreateVMRequest(request_id="fleet-vm-1", name="fleet-vm-1", vcpus=2, memory_mib=512,
                                              image="smoke"), timeout=30)
        assert vm.state == pb.VM_STATE_RUNNING and len(vm.vcpu_pins) == 2
    finally:
        ch.close()
    old = h.pid
    fleet.kill(h.name)
    assert h.pid is None and not Path(f"/proc/{old}").exists()
    stub, ch = fleet.stub(h.name)
    try:
        with pytest.raises(grpc.RpcError) as e:
            stub.Health(pb.HealthRequest(), timeout=3)
        assert e.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    finally:
        ch.close()
    fleet.restart(h.name)
    assert h.pid and h.pid != old
    stub, ch = fleet.stub(h.name)
    try:
        vms = stub.ListVMs(pb.ListVMsRequest(), timeout=10).vms
        assert [(v.vm_id, v.state, list(v.vcpu_pins)) for v in vms] == [(vm.vm_id, pb.VM_STATE_RUNNING,
                                                                          list(vm.vcpu_pins))]
    finally:
        ch.close()
    fleet.restart(h.name, keep_vms=False)  # a host reboot: the hypervisor lost every domain
    stub, ch = fleet.stub(h.name)
    try:
        assert list(stub.ListVMs(pb.ListVMsRequest(), timeout=10).vms) == []
    finally:
        ch.close()


def test_unreachable_host_times_calls_out(fleet: SimFleet) -> None:
    h = fleet.hosts[4]
    stub, ch = fleet.stub(h.name)
    try:
        fleet.unreachable(h.name)
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as e:
            stub.Health(pb.HealthRequest(), timeout=1.5)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED and time.monotonic() - t0 < 5
        fleet.reachable(h.name)
        assert stub.Health(pb.HealthRequest(), timeout=10).libvirt == "connected"
    finally:
        fleet.reachable(h.name)
        ch.close()


@pytest.mark.root
def test_broken_tree_fails_the_carve_midway_and_rolls_back(fleet: SimFleet) -> None:
    """`hostd carve` on a sim host's tree (the CLI the Carve RPC shares its code with):
    the pool write is refused after the cpuset steps ran; all of them are undone. Mended,
    the carve goes through, the animator shows the IO service in its cpuset and grants the
    pool, and the running hostd's signal counts the IO service's CPU as its own."""
    h = fleet.hosts[5]
    carve = [sys.executable, "-m", "hostd.cli", "--config", str(h.config_path), "carve", "--json"]
    attr = fleet.break_carve(h.name)
    r = subprocess.run(carve, check=False, capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 1 and "apply_failed" in r.stderr and "nr_hugepages" in r.stderr
    # the IO service had been moved into hyb-io: the rollback wrote it back to the root cpuset
    assert (h.root / CPUSET / "cgroup.procs").read_text().strip() == str(IO_PID)
    assert not fleet.carved(h.name) and not (h.root / CPUSET / "machine").exists()
    assert not (h.state_dir / "carve-journal.json").exists()
    fleet.repair_carve(h.name)
    assert attr.read_text().strip() == "0"
    try:
        r = subprocess.run(carve, check=False, capture_output=True, text=True, cwd=REPO, timeout=60)
        assert r.returncode == 0, r.stderr
        assert attr.read_text().strip() == "2048" and fleet.carved(h.name)
        wait(lambda: "hyb-io" in (h.root / f"proc/{IO_PID}/cgroup").read_text(), "the IO service moved", 5)
        wait(lambda: (h.root / POOL / "free_hugepages").read_text().strip() == "2048", "the pool granted", 5)
        moved = wait(lambda: [s for s in stats(fleet, h.name, 1) if s.cpu_io_service > 0], "hyb-io sampled", 10)
        assert not [f for f in moved[0].top_foreign if f.pid == IO_PID]  # its own CPUs are not foreign
    finally:
        subprocess.run([sys.executable, "-m", "hostd.cli", "--config", str(h.config_path), "uncarve"],
                       check=False, capture_output=True, cwd=REPO, timeout=60)
    assert not fleet.carved(h.name)


def test_stop_leaves_no_process(sched, tmp_path: Path) -> None:
    f = SimFleet(tmp_path / "sim2", 3, 1, scheduler_url=sched["sched"].url, host_token=sched["host_token"],
                 certs=sched["certs"], prefix="stop")
    try:
        f.start(timeout_s=60)
        pids = [h.pid for h in f.hosts]
        assert all(pids)
        f.unreachable(f.hosts[0].name)  # a stopped process is stopped too
    finally:
        f.stop()
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists(), f"hostd {pid} still there"
    assert not f.trees_dir.exists() or f.trees_dir == tmp_path / "sim2" / "trees"
