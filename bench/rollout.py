#!/usr/bin/env python3
"""bench/rollout: fleet-rollout at scale (issue 21).

Prints three numbers, each against its target or baseline measured in the same run:

1. plan speed: ``make_plan`` (pure) over a generated inventory of 7,000 hosts, against
   the 1 s target; and the preflight's RPC fan-out (PlanCarve to every host of the live
   fleet, in parallel) over the simulated fleet;
2. the controller's CPU per host step: the real ``fleet-rollout run`` as a separate
   process against the fleet, its user + system CPU (``os.wait4`` of that child), divided
   by the host steps it took (the transitions the scheduler keeps for the rollout: a
   host's, with a state change), against the 5 ms target; the CPU of a ``fleet-rollout plan`` of the same
   spec (start-up, inventory, preflight) is printed beside it as the fixed part;
3. the rollout's wall time against the soak-bound ideal, waves x (baseline_s + soak_s):
   what it would take if the controller and the hosts cost nothing. The limits-bound
   ideal (each wave in rounds of ``concurrency`` and ``per_rack``) is printed too.

The fleet is tools/dev/fleetsim.py's, in worker mode (``--per-process K``: K real hostd
daemons per process, tools/dev/fleetsim_multi.py), registered with a real scheduler (SQLite,
HTTPS), heartbeating every 10 s, one animator thread for every tree.

    .venv/bin/python bench/rollout.py                 # 1,000 hosts, 50 per process, 50 racks
    .venv/bin/python bench/rollout.py --short         # 20 hosts, 4 per process: the test's mode
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tools.dev.fleetsim import SimFleet, dev_certs, write_scheduler_config

REPO = Path(__file__).resolve().parents[1]

ADMIN, HOST_TOKEN = "rollout-bench-admin", "rollout-bench-host"
PLAN_TARGET_S = 1.0
STEP_TARGET_MS = 5.0
NAME = "bench-convert"
SPEC = """name = "{name}"
kind = "convert"
policy = "policy.toml"
[inventory]
source = "scheduler"
[waves]
canary = 1
percent = [1, 5, 25, 100]
# a healthy host that fails on the sim's noise must not halt the bench: counted instead
max_failures = [0, {budget}]
[limits]
concurrency = {concurrency}
per_rack = {per_rack}
rpc_timeout_s = 10
unreachable_s = 20
[steps]
baseline_s = {baseline}
soak_s = {soak}
[gate]
min_samples = 4
alpha = 0.05
controls = 3
# The trees' node-agent may run on the io_cpu and the animator, starved on a busy 2-CPU
# machine, catches up in bursts (tests/fleet/test_rollout_fleet.py); the probe's latency
# is the loaded machine's, not a carve's.
foreign_cpu_max = 0.5
probe_p99_rise_pct = 500
"""


@dataclass
class Child:
    rc: int
    out: str
    err: str
    cpu_s: float  # user + system of the child (and any it waited for)
    wall_s: float


def run_child(argv: list[str], cwd: Path, env: dict[str, str], timeout_s: float) -> Child:
    """Run ``argv``; its own CPU from ``os.wait4`` (not the other children of this process)."""
    out, err = cwd / f".{os.getpid()}.out", cwd / f".{os.getpid()}.err"
    t0 = time.monotonic()
    with open(out, "w") as o, open(err, "w") as e:
        p = subprocess.Popen(argv, cwd=cwd, env=env, stdout=o, stderr=e, stdin=subprocess.DEVNULL)
    deadline = t0 + timeout_s
    try:
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                p.kill()
                _, status, ru = os.wait4(p.pid, 0)
                break
            time.sleep(0.1)
    except BaseException:
        p.kill()  # by its PID; reaped here so nothing is left behind
        os.waitpid(p.pid, 0)
        raise
    p.returncode = os.waitstatus_to_exitcode(status)  # reaped by wait4: Popen must not wait again
    wall = time.monotonic() - t0
    child = Child(p.returncode, out.read_text(), err.read_text(), ru.ru_utime + ru.ru_stime, wall)
    out.unlink()
    err.unlink()
    return child


def plan_speed(n: int = 7000, racks: int = 350, repeat: int = 5) -> list[float]:
    """Seconds of ``make_plan`` over ``n`` generated hosts (``repeat`` runs)."""
    from tools.fleet_rollout.inventory import Host
    from tools.fleet_rollout.plan import make_plan
    from tools.fleet_rollout.spec import parse_spec

    rnd = random.Random(21)
    hosts = [Host(f"host-{i:05d}", f"10.{i // 65536}.{i // 256 % 256}.{i % 256}:7443", f"r{rnd.randrange(racks):03d}",
                  {"disk": "hdd" if i % 3 == 2 else "nvme"}) for i in range(n)]
    spec = parse_spec({"name": "plan", "policy": "p", "policy_text": "t",
                       "waves": {"canary": 1, "percent": [1, 5, 25, 100]}})
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        plan = make_plan(hosts, spec)
        out.append(time.perf_counter() - t0)
        assert plan.hosts == n
    return out


def preflight_fanout(fleet: SimFleet, policy: str, certs: Path) -> tuple[float, int]:
    """Seconds of the preflight (PlanCarve to every host, the controller's parallelism)
    with fresh channels (TLS handshakes included), and the hosts it refused."""
    from tools.fleet_rollout.clients import HostdClients, Tls
    from tools.fleet_rollout.inventory import Host
    from tools.fleet_rollout.preflight import preflight
    from tools.fleet_rollout.spec import parse_spec

    spec = parse_spec({"name": "pf", "policy": "p", "policy_text": policy})
    hosts = [Host(h.name, h.address, h.rack, h.labels) for h in fleet.hosts]
    clients = HostdClients(Tls.from_dir(certs), 10.0)
    try:
        t0 = time.monotonic()
        refused = preflight(clients, hosts, spec)
        return time.monotonic() - t0, len(refused)
    finally:
        clients.close()


def rollout_store(sched, certs: Path):  # type: ignore[no-untyped-def]
    """The rollouts the scheduler keeps, read as fleet-rollout reads them."""
    from tools.fleet_rollout.clients import Scheduler
    from tools.fleet_rollout.store import Store

    return Store(Scheduler(sched.url, ADMIN, ca=certs / "ca.crt"), holder="bench")


def host_steps(store, name: str) -> int:  # type: ignore[no-untyped-def]
    return sum(1 for t in store.transitions(name) if t["host"] != "-" and t["from"] != t["to"])


def check_verified(fleet: SimFleet, store, work: Path, certs: Path) -> list[str]:  # type: ignore[no-untyped-def]
    """Hosts the record calls verified whose hostd does not report the spec's policy
    digest, or whose tree shows no carve; their transitions go to disagree.json."""
    from concurrent.futures import ThreadPoolExecutor

    from tools.fleet_rollout.clients import HostdClients, HostError, Tls
    from tools.fleet_rollout.spec import policy_digest

    want = policy_digest(fleet.policy_text)
    verified = [h.name for h in store.brief(NAME) if h.state == "verified"]
    clients = HostdClients(Tls.from_dir(certs), 30.0)

    def why(name: str) -> str:
        try:
            got = clients.info(fleet.host(name).address).carved_digest
        except HostError as e:
            got = f"error: {e}"
        tree = fleet.carved(name)
        return "" if got == want and tree else f"hostd digest {got[:12]!r}, tree carved {tree}"
    try:
        with ThreadPoolExecutor(32) as pool:
            reasons = dict(zip(verified, pool.map(why, verified)))
    finally:
        clients.close()
    wrong = sorted(n for n, r in reasons.items() if r)
    if wrong:
        dump = {n: {"why": reasons[n], "transitions": store.transitions(NAME, n)} for n in wrong}
        (work / "disagree.json").write_text(json.dumps(dump, indent=1))
    return [f"{n}: {reasons[n]}" for n in wrong]


def host_states(store, name: str) -> dict[str, int]:  # type: ignore[no-untyped-def]
    out: dict[str, int] = {}
    for c in store.rollout(name).counts:
        for state, n in c.items():
            out[state] = out.get(state, 0) + n
    return out


def ideals(waves: list[list[str]], racks: dict[str, str], concurrency: int, per_rack: int,
           baseline_s: float, soak_s: float) -> tuple[float, float]:
    """(soak-bound: waves x (baseline + soak), limits-bound: each wave in rounds of at
    most ``concurrency`` hosts and ``per_rack`` per rack, each round a soak: the baseline
    is the samples hostd already holds, so the controller waits for none after the first
    ``baseline_s`` of the fleet's life)."""
    rounds = 0
    for w in waves:
        per: dict[str, int] = {}
        for h in w:
            per[racks[h]] = per.get(racks[h], 0) + 1
        rounds += max(math.ceil(len(w) / concurrency), max(math.ceil(n / per_rack) for n in per.values()))
    return len(waves) * (baseline_s + soak_s), rounds * soak_s


def _machine():  # type: ignore[no-untyped-def]
    from tools.dev.procstat import machine
    return machine()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="fleet-rollout at scale on a simulated fleet: plan speed, controller "
                                             "CPU per host step, wall time against the soak-bound ideal.",
                                 epilog="examples: bench/rollout.py; bench/rollout.py --hosts 500 --per-process 50; "
                                        "bench/rollout.py --short")
    ap.add_argument("--hosts", type=int, default=1000)
    ap.add_argument("--per-process", type=int, default=50, help="hostd daemons per worker process")
    ap.add_argument("--racks", type=int, default=50)
    ap.add_argument("--baseline", type=float, default=10.0, help="steps.baseline_s")
    ap.add_argument("--soak", type=float, default=10.0, help="steps.soak_s")
    ap.add_argument("--concurrency", type=int, default=100)
    ap.add_argument("--per-rack", type=int, default=5)
    ap.add_argument("--io-interval", type=float, default=2.0,
                    help="hostd's IO-health sample and probe interval (s); the gate wants 4 samples per window")
    ap.add_argument("--tick", type=float, default=1.0, help="the animator's period (s)")
    ap.add_argument("--heartbeat", type=float, default=10.0, help="the sim hosts' heartbeat_s")
    ap.add_argument("--plan-hosts", type=int, default=7000)
    ap.add_argument("--short", action="store_true", help="20 hosts, 4 per process, 5 racks, seconds (the test)")
    ap.add_argument("--workdir", type=Path, help="keep everything here (default: a temp dir, removed)")
    args = ap.parse_args(argv)
    if args.short:
        args.hosts, args.per_process, args.racks, args.baseline, args.soak = 20, 4, 5, 5.0, 6.0
        args.concurrency, args.per_rack, args.io_interval, args.tick, args.heartbeat = 10, 2, 1.0, 0.5, 5.0
        args.plan_hosts = 7000
    from tools.dev.procs import Scheduler, free_port
    from tools.dev.procstat import machine_load

    # 1. make_plan alone, before anything else runs here
    runs = plan_speed(args.plan_hosts)
    best = min(runs)
    print(f"plan: make_plan over {args.plan_hosts:,} hosts: {best * 1000:.0f} ms (best of {len(runs)}, median "
          f"{statistics.median(runs) * 1000:.0f} ms) = x{best / PLAN_TARGET_S:.3f} of the {PLAN_TARGET_S:g} s target",
          flush=True)

    tmp = None if args.workdir else tempfile.TemporaryDirectory(prefix="rollout-bench-")
    work = args.workdir or Path(tmp.name)
    work.mkdir(parents=True, exist_ok=True)
    certs = dev_certs(work / "tls", ("fleet-rollout",))
    port = free_port()
    write_scheduler_config(work / "scheduler.toml", port=port, certs=certs, db=work / "scheduler.db",
                           admin_token=ADMIN, host_token=HOST_TOKEN)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOSTD_", "HYB_SCHED_", "FLEET_ROLLOUT_"))}
    sched = Scheduler(work / "scheduler.toml", port, env, work / "scheduler.log", ca=certs / "ca.crt")
    fleet = None
    try:
        sched.start()
        fleet = SimFleet(work / "sim", args.hosts, args.racks, scheduler_url=sched.url, host_token=HOST_TOKEN,
                         admin_token=ADMIN, certs=certs, heartbeat_s=args.heartbeat, tick_s=args.tick,
                         hosts_per_process=args.per_process, io_interval_s=args.io_interval)
        fleet.start(timeout_s=900)
        print(f"fleet: {args.hosts} hosts in {len({h.group for h in fleet.hosts})} processes of {args.per_process}, "
              f"{args.racks} racks, started and registered in {fleet.start_s:.0f} s", flush=True)
        a0, k0, t0 = fleet.animator.busy_s, fleet.animator.ticks, time.monotonic()
        time.sleep(max(args.baseline, args.soak) + 2 * args.io_interval)  # every host has a baseline's samples
        a1, k1, dt = fleet.animator.busy_s, fleet.animator.ticks, time.monotonic() - t0
        per_tree = (a1 - a0) / max(1, k1 - k0) / args.hosts
        print(f"animator (idle fleet): {per_tree * 1000:.2f} ms per tree and tick: {(a1 - a0) / dt * 100:.0f} % "
              f"of a CPU at tick {args.tick:g} s; at 0.5 s it would be {per_tree * args.hosts / 0.5 * 100:.0f} %",
              flush=True)
        procs = fleet.process_usage()
        rss, pss = sum(u.rss for u, _ in procs.values()), sum(u.pss for u, _ in procs.values())
        threads = [_threads(pid) for pid in procs]
        print(f"memory: {rss / 2**20 / args.hosts:.1f} MiB RSS / {pss / 2**20 / args.hosts:.1f} MiB PSS per host "
              f"(fleet {pss / 2**30:.2f} GiB PSS); {statistics.median(threads):.0f} threads per process",
              flush=True)

        # 1b. the preflight's fan-out over the live fleet
        pf_s, refused = preflight_fanout(fleet, fleet.policy_text, certs)
        print(f"preflight: PlanCarve to {args.hosts} hosts (64 in parallel, new TLS channels): {pf_s:.2f} s "
              f"({refused} refused)", flush=True)

        (work / "policy.toml").write_text(fleet.policy_text)
        (work / "admin.token").write_text(ADMIN)
        (work / "rollout.toml").write_text(SPEC.format(
            name=NAME, budget=max(1, args.hosts // 20), concurrency=args.concurrency, per_rack=args.per_rack,
            baseline=args.baseline, soak=args.soak))
        cli_env = {**env, "FLEET_ROLLOUT_SCHEDULER_URL": sched.url,
                   "FLEET_ROLLOUT_TOKEN_FILE": str(work / "admin.token"),
                   "FLEET_ROLLOUT_SCHEDULER_CA": str(certs / "ca.crt"), "FLEET_ROLLOUT_TLS_DIR": str(certs)}
        exe = str(REPO / ".venv/bin/fleet-rollout")
        plan = run_child([exe, "plan", "rollout.toml", "--json"], work, cli_env, 600)
        assert plan.rc == 0, plan.err[-2000:]
        waves = json.loads(plan.out)["waves"]
        print(f"plan command (inventory from the scheduler + preflight + plan): {plan.wall_s:.1f} s wall, "
              f"{plan.cpu_s:.2f} CPU-s; waves {[len(w) for w in waves]}", flush=True)

        # 2 and 3. the rollout
        u0, m0, a0, s0 = fleet.process_usage(), _machine(), fleet.animator.busy_s, _tree_cpu(sched)
        run = run_child([exe, "run", "rollout.toml", "--json"], work, cli_env, 3600)
        u1, m1, a1, s1 = fleet.process_usage(), _machine(), fleet.animator.busy_s, _tree_cpu(sched)
        st = json.loads(run.out) if run.out.strip().startswith("{") else {"state": f"exit {run.rc}", "problems": []}
        store = rollout_store(sched, certs)
        steps = host_steps(store, NAME)
        states = host_states(store, NAME)
        carved = sum(1 for h in fleet.hosts if fleet.carved(h.name))
        print(f"rollout: {st['state']} in {run.wall_s:.0f} s; hosts {states}; carved trees {carved}/{args.hosts}; "
              f"problems {[(p['host'], p['state'], p['reason'][:80]) for p in st['problems']][:5]}", flush=True)
        wrong = check_verified(fleet, store, work, certs)
        store.api.close()
        print(f"verified hosts whose hostd or tree disagrees with the record: {len(wrong)}"
              + (f" {wrong[:10]} (transitions in {work / 'disagree.json'})" if wrong else ""), flush=True)
        if run.rc != 0:
            print(run.err[-3000:], file=sys.stderr)
        per_step = run.cpu_s / max(1, steps) * 1000
        net = (run.cpu_s - plan.cpu_s) / max(1, steps) * 1000
        print(f"controller CPU: {run.cpu_s:.2f} CPU-s over {steps} host steps = {per_step:.2f} ms per host step "
              f"= x{per_step / STEP_TARGET_MS:.2f} of the {STEP_TARGET_MS:g} ms target "
              f"({net:.2f} ms without the plan command's {plan.cpu_s:.2f} CPU-s of start-up, inventory and preflight)")
        racks = {h.name: h.rack for h in fleet.hosts}
        soak_ideal, limits_ideal = ideals(waves, racks, args.concurrency, args.per_rack, args.baseline, args.soak)
        print(f"wall: {run.wall_s:.0f} s = x{run.wall_s / soak_ideal:.2f} of the soak-bound ideal "
              f"({len(waves)} waves x ({args.baseline:g} + {args.soak:g}) s = {soak_ideal:.0f} s); "
              f"x{run.wall_s / limits_ideal:.2f} of the limits-bound ideal ({limits_ideal:.0f} s: rounds of "
              f"{args.concurrency} hosts, {args.per_rack} per rack, a soak each; baselines are "
              f"samples hostd already holds)")
        dt = run.wall_s
        busy, steal = machine_load(m0, m1)
        hosts_cpu = sum(u1[p][0].cpu_s - u0[p][0].cpu_s for p in u1 if p in u0)
        print(f"during the run: hostd {hosts_cpu / dt / args.hosts * 100:.3f} % of a CPU per host "
              f"({hosts_cpu / dt:.2f} CPUs), animator {(a1 - a0) / dt * 100:.0f} % of a CPU "
              f"(tick {args.tick:g} s), scheduler {(s1 - s0) / dt * 100:.0f} %, controller "
              f"{run.cpu_s / dt * 100:.0f} %; machine {busy:.2f} of {os.cpu_count()} CPUs busy, steal {steal:.2f}")
        return 0 if st["state"] == "done" and not wrong else 1
    finally:
        if fleet is not None:
            fleet.stop()
        sched.stop()
        if tmp:
            tmp.cleanup()


def _threads(pid: int) -> int:
    for ln in Path(f"/proc/{pid}/status").read_text().splitlines():
        if ln.startswith("Threads:"):
            return int(ln.split()[1])
    return 0


def _tree_cpu(sched) -> float:  # type: ignore[no-untyped-def]
    from tools.dev.procstat import tree_cpu_s
    return tree_cpu_s(sched.proc.pid)


if __name__ == "__main__":
    sys.exit(main())
