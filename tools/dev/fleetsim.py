#!/usr/bin/env python3
"""tools/dev/fleetsim: a fleet of real `hostd serve` processes on this one machine.

Each simulated host is a real hostd process with its own generated host tree as root
(``fleetsim_tree.py``: 1 node, 8 CPUs, cgroup v1 cpuset, a 2 MiB pool, the IO service in
its /proc), its own state dir, its own gRPC port on 127.0.0.1 (mTLS from the dev CA),
libvirt's test driver (each process its own in-memory hypervisor), registered with a
real scheduler with its rack and labels, heartbeating every ``heartbeat_s`` with the IO
signal sampled every second. One animator thread keeps every tree alive (fleetsim_tree).

    fleet = SimFleet(workdir, n_hosts=50, racks=10, scheduler_url=url, host_token=tok,
                     certs=tls_dir, admin_token=admin)
    try:
        fleet.start()                 # trees, configs, processes (bounded pool), registered
        fleet.degrade("sim-0003")     # PSI high, a foreign thread on io_cpus, probe refused
        fleet.kill("sim-0004"); fleet.restart("sim-0004")   # SIGKILL by PID; same state dir
        fleet.unreachable("sim-0005") # SIGSTOP: gRPC calls time out, heartbeats stop
        fleet.break_carve("sim-0006") # the carve's hugepage write is refused midway
    finally:
        fleet.stop()                  # every process it started, by PID

The hypervisor outlives hostd on a real host; here it dies with the process. So
``restart(keep_vms=True)`` plays the surviving hypervisor: it hands the new process a
test-driver node file holding a domain (with hostd's metadata) for every VM the ledger
records as running or stopped (the test driver starts them all: a stopped VM comes back
running), and hostd's reconcile finds them as after a hostd restart on a real host.
``keep_vms=False`` is a host reboot: every domain is gone. The test driver accepts the
designer's kvm domain XML as it is (virt_type stays "kvm"), but has no domain events.

As a bench (starts its own scheduler, SQLite, TLS):

    .venv/bin/python tools/dev/fleetsim.py --hosts 50 --racks 10 --idle 20
prints the start time, each hostd's RSS/PSS and idle CPU, and the animator's cost.
Here (2 CPUs, 24 GiB, shared with other test runs): a hostd start costs ~0.5 CPU-s
(10 hosts ready and registered in 5.5 s; 50 in 22 s when the machine was otherwise
quiet, 40-48 s beside other test runs); each idle hostd holds 81 MiB RSS / 43 MiB PSS and
uses 0.2-0.3 % of a CPU (sample 1 s, probe 1 s, heartbeat 2 s); the animator ~0.25 ms
per host and tick. So 1,000 hosts do not fit this machine (~3 CPUs and ~43 GiB idle):
that bench needs a bigger one.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import signal
import sqlite3
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self
from xml.sax.saxutils import escape

import httpx
from tools.dev.fleetsim_tree import CPUSET, IO_TAG, POOL, Animator, write_tree
from tools.dev.procs import toml_value

REPO = Path(__file__).resolve().parents[2]
POLICY = f"""# fleetsim: what every simulated host carves
[io_service]
process = "{IO_TAG}"
cpus = "0"
[host]
cpus = "1"
[[hugepages.pools]]
size = "2M"
count_per_node = 2048
[hugepages]
io_floor_percent = 20
"""
NODE_EMPTY = "<node/>\n"


@dataclass
class SimHost:
    name: str
    rack: str
    labels: dict[str, str]
    root: Path  # its host tree
    state_dir: Path
    port: int
    config_path: Path
    log: Path
    hypervisor: Path  # the test driver's node file this process loads
    probe_port: int | None = None
    proc: subprocess.Popen | None = field(default=None, repr=False)  # shared by a worker's hosts
    group: int = 0  # its worker process (hosts_per_process > 1), else its own index
    started_s: float = 0.0  # spawn -> ready file, last start
    spawned_at: float = 0.0  # monotonic time of the last spawn
    port_retries: int = 0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc and self.proc.poll() is None else None

    @property
    def address(self) -> str:
        return f"localhost:{self.port}"


def default_labels(i: int, n: int) -> dict[str, str]:
    """Five waves in host order (wave 0 is the first fifth), every third host on HDDs."""
    return {"wave": str(i * 5 // max(n, 1)), "disk": "hdd" if i % 3 == 2 else "nvme"}


class SimFleet:
    def __init__(self, workdir: Path, n_hosts: int, racks: int, *, scheduler_url: str, host_token: str,
                 certs: Path, admin_token: str = "", policy: str = POLICY, io_cpus: tuple[int, ...] = (0,),
                 heartbeat_s: float = 2.0, probe: bool = True, tick_s: float = 0.5, parallel: int = 0,
                 prefix: str = "sim", labels: Callable[[int, int], dict[str, str]] = default_labels,
                 trees_dir: Path | None = None, real_host: bool = False, hosts_per_process: int = 1,
                 io_interval_s: float = 1.0, days_s: float = 300.0, beat_stats: bool = False):
        """``host_token``: a scheduler token with the host scope (every host registers
        with it); ``admin_token``: for ``wait_registered``; ``certs``: a dev CA directory
        (tools/dev/make-dev-ca.sh) holding hostd's server certificate; ``parallel``: hostd
        processes starting at once (default: 4 per CPU: a start waits ~2/3 of its time); ``trees_dir``: where the host trees
        go (default: a new directory in /dev/shm, removed by ``stop``: the animator replaces
        files by rename, ~30 times cheaper on tmpfs than on ext4, where each rename over a
        file flushes it; else ``workdir/trees``); ``hosts_per_process``: K > 1 serves K hosts'
        hostd daemons from one worker process (tools/dev/fleetsim_multi.py: ``daemon.start`` once per
        host, each its own tree, state dir, port, test driver and registration), for fleets
        past what separate processes allow; ``kill``, ``restart`` and ``unreachable`` then act
        on the host's whole worker, all K hosts; ``parallel`` counts workers starting at once.
        ``io_interval_s``: hostd's IO-health sample and probe interval."""
        if real_host:
            raise NotImplementedError("real_host: run the real machine's hostd beside the fleet with "
                                      "tools/dev/procs.py Hostd (root, libvirtd); fleetsim holds simulated hosts")
        self.workdir = Path(workdir)
        self.url, self.host_token, self.admin_token, self.certs = scheduler_url, host_token, admin_token, certs
        self.policy_text, self.io_cpus, self.heartbeat_s, self.probe = policy, io_cpus, heartbeat_s, probe
        self.days_s = days_s  # how often each hostd sends its days (the utilisation view)
        self.beat_stats = beat_stats  # beats carry stats (the scheduler's 5-minute buckets)
        self.per_process = max(1, hosts_per_process)
        self.io_interval_s = io_interval_s
        # a hostd start waits ~2/3 of its time; a worker's K starts are mostly CPU
        self.parallel = parallel or (4 if self.per_process == 1 else 1) * (os.cpu_count() or 1)
        self.animator = Animator(tick_s)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("HOSTD_")}
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._own_trees = trees_dir is None and os.access("/dev/shm", os.W_OK)
        if self._own_trees:
            self.trees_dir = Path(tempfile.mkdtemp(prefix=f"fleetsim-{os.getpid()}-", dir="/dev/shm"))
            (self.workdir / "trees").unlink(missing_ok=True)
            (self.workdir / "trees").symlink_to(self.trees_dir)
        else:
            self.trees_dir = Path(trees_dir or self.workdir / "trees")
        self.hosts: list[SimHost] = []
        for i in range(n_hosts):
            name = f"{prefix}-{i:04d}"
            d = self.workdir / "hosts" / name
            self.hosts.append(SimHost(name=name, rack=f"r{i % racks:02d}", labels=labels(i, n_hosts),
                                      root=self.trees_dir / name, state_dir=d / "state", port=0,
                                      config_path=d / "hostd.toml", log=d / "hostd.log",
                                      hypervisor=d / "hypervisor.xml", group=i // self.per_process))
        self._by_name = {h.name: h for h in self.hosts}
        self.start_s = 0.0

    def host(self, name: str) -> SimHost:
        return self._by_name[name]

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ start / stop

    def prepare(self) -> None:
        """Trees, configs, the shared image and policy; nothing started."""
        from hostd.apply.images import ImageStore

        images = self.workdir / "images"
        if not (images / "smoke").exists():
            (self.workdir / "vmlinuz").write_bytes(b"fleetsim: the test driver boots nothing")
            ImageStore(images).add("smoke", "1", "kernel", {"kernel": self.workdir / "vmlinuz"})
        (self.workdir / "policy.toml").write_text(self.policy_text)
        token = self.workdir / "host.token"
        token.write_text(self.host_token)
        token.chmod(0o600)
        for h in self.hosts:
            write_tree(h.root, h.name)
            h.state_dir.mkdir(parents=True, exist_ok=True)
            h.hypervisor.write_text(NODE_EMPTY)
            h.probe_port = self.animator.add(h.name, h.root, self.io_cpus, self.probe).probe_port
        # hostd ports once the probe listeners hold theirs (a listener bound later on port 0
        # could take a hostd's port; gRPC binds with SO_REUSEPORT, so a hostd retrying onto
        # another host's port would silently share its connections with that host's hostd)
        for h, port in zip(self.hosts, _free_ports(len(self.hosts))):
            h.port = port
            self._write_config(h)

    def _write_config(self, h: SimHost) -> None:
        c = self.certs
        keys: dict[str, object] = {
            "virt_type": "kvm", "policy": self.workdir / "policy.toml", "state_dir": h.state_dir, "root": h.root,
            "listen": f"127.0.0.1:{h.port}", "metrics_listen": "", "tls_cert": c / "hostd.crt",
            "tls_key": c / "hostd.key", "tls_ca": c / "ca.crt", "libvirt_uri": f"test://{h.hypervisor}",
            "image_dir": self.workdir / "images", "lock_guest_memory": False, "watchdog_s": 5.0,
            "scheduler_url": self.url, "scheduler_token_file": self.workdir / "host.token",
            "scheduler_ca": c / "ca.crt", "host_name": h.name, "advertise_address": h.address,
            "rack": h.rack, "heartbeat_s": self.heartbeat_s, "days_s": self.days_s,
            "heartbeat_stats": self.beat_stats,
            "io_health_interval_s": self.io_interval_s,
            "io_probe_interval_s": self.io_interval_s,
            "io_probe": f"tcp:127.0.0.1:{h.probe_port}" if h.probe_port else "",
            "io_probe_timeout_s": 0.5,
            # the build this host runs (what a hostd rollout changes): "<version>+<id>"
            "release_file": h.state_dir / "release-id"}
        text = "".join(f"{k} = {toml_value(v)}\n" for k, v in keys.items())
        text += "[labels]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in h.labels.items())
        h.config_path.write_text(text)

    def start(self, timeout_s: float = 600) -> None:
        """Prepare, start every hostd (``parallel`` at a time, each waited on by its ready
        file), then wait until the scheduler lists every host (needs ``admin_token``)."""
        t0 = time.monotonic()
        self.prepare()
        self.animator.start()
        self._start_many(self.hosts, timeout_s)
        if self.admin_token:
            self.wait_registered(timeout_s=max(30.0, timeout_s - (time.monotonic() - t0)))
        self.start_s = time.monotonic() - t0

    def group(self, name: str) -> list[SimHost]:
        """The hosts served by the same process as ``name`` (itself alone unless
        hosts_per_process > 1)."""
        g = self.host(name).group
        return [h for h in self.hosts if h.group == g]

    def _start_many(self, hosts: list[SimHost], timeout_s: float) -> None:
        """Start the processes of ``hosts`` (in worker mode: their whole workers), at most
        ``parallel`` starting at once, each done when every host it serves is ready."""
        units: list[list[SimHost]] = []
        for h in hosts:
            if all(u[0].group != h.group for u in units):
                units.append(self.group(h.name) if self.per_process > 1 else [h])
        pending, starting, ready = units, [], set()
        deadline = time.monotonic() + timeout_s
        while pending or starting:
            while pending and len(starting) < self.parallel:
                u = pending.pop(0)
                self._spawn(u)
                starting.append(u)
            for u in list(starting):
                ready |= {h.name for h in u if h.name not in ready and self._ready(h)}
                if all(h.name in ready for h in u):
                    starting.remove(u)
            if time.monotonic() > deadline:
                raise TimeoutError(f"hostd not ready after {timeout_s:.0f} s: "
                                   f"{[h.name for u in starting for h in u if h.name not in ready]}")
            time.sleep(0.05)
        ports: dict[int, str] = {}
        for h in self.hosts:
            if h.port in ports:  # SO_REUSEPORT: both would answer, each some of the calls
                raise RuntimeError(f"{h.name} and {ports[h.port]} both listen on port {h.port}")
            ports[h.port] = h.name

    def _spawn(self, unit: list[SimHost]) -> None:
        """One `hostd serve` process for one host, or one worker (fleetsim_multi.py) for
        a group of hosts (logging to its first host's hostd.log)."""
        h = unit[0]
        for x in unit:
            (x.config_path.parent / "ready").unlink(missing_ok=True)
        if self.per_process == 1:
            ready = h.config_path.parent / "ready"
            argv = [sys.executable, "-m", "hostd.cli", "--config", str(h.config_path), "serve",
                    "--ready-file", str(ready)]
        else:
            argv = [sys.executable, "-m", "tools.dev.fleetsim_multi", *(str(x.config_path.parent) for x in unit)]
        with open(h.log, "a") as log:
            proc = subprocess.Popen(argv, cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
        now = time.monotonic()
        for x in unit:
            x.proc, x.spawned_at = proc, now

    def _ready(self, h: SimHost) -> bool:
        """Whether the host serves; sets ``started_s`` (spawn -> ready) and takes the port
        it bound."""
        ready = h.config_path.parent / "ready"
        text = ready.read_text().split() if ready.exists() else []
        if len(text) == 2:
            h.started_s = time.monotonic() - h.spawned_at
            if int(text[1]) != h.port:  # the worker replaced a port taken meanwhile
                h.port = int(text[1])
                self._write_config(h)
            return True
        if h.proc is not None and h.proc.poll() is not None:
            tail = h.log.read_text()[-3000:]
            if "Address already in use" in tail and h.port_retries < 3 and self.per_process == 1:
                # the free port was taken between picking and binding (another process on
                # this machine): a new port, a new config, the same host
                h.port_retries += 1
                h.port = _free_ports(1)[0]
                self._write_config(h)
                self._spawn([h])
                return False
            raise RuntimeError(f"{h.name}: hostd exited {h.proc.returncode}:\n{tail}")
        return False

    def wait_registered(self, names: list[str] | None = None, timeout_s: float = 60) -> dict[str, dict]:
        """The scheduler's view (GET /v1/hosts) once it lists every host named (default all)."""
        want = set(names or self._by_name)
        deadline = time.monotonic() + timeout_s
        with self.api() as api:
            while True:
                got = {h["name"]: h for h in api.get("/v1/hosts").raise_for_status().json()["items"]}
                if want <= set(got):
                    return got
                if time.monotonic() > deadline:
                    raise TimeoutError(f"not registered after {timeout_s:.0f} s: {sorted(want - set(got))[:10]}")
                time.sleep(0.5)

    def api(self) -> httpx.Client:
        """The scheduler's REST API with the admin token."""
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.admin_token}"},
                            verify=ssl.create_default_context(cafile=str(self.certs / "ca.crt")), timeout=30)

    def stop(self) -> None:
        """Stop every process this fleet started, by PID (SIGCONT first for stopped ones,
        SIGTERM, SIGKILL after 15 s), then the animator; mended carve faults."""
        live = list({h.pid: h for h in self.hosts if h.pid}.values())  # one per process
        for h in live:
            _signal(h, signal.SIGCONT)
            _signal(h, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for h in live:
            try:
                h.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                h.proc.kill()
                h.proc.wait()
        self.animator.stop()
        for h in self.hosts:
            if h.root.exists():
                self.repair_carve(h.name)
        if self._own_trees:
            shutil.rmtree(self.trees_dir, ignore_errors=True)

    # ------------------------------------------------------------------ faults

    def degrade(self, name: str, on: bool = True) -> None:
        """The host's IO signal goes bad: PSI some avg10 25-45 %, a foreign thread
        (``scrub-backup``) burning 0.9 CPU on an io_cpu, its TCP probe refused.
        ``on=False`` heals it."""
        self.animator.degrade(name, on)

    def kill(self, name: str) -> None:
        """SIGKILL the host's hostd by PID (the tree, state and VMs' ledger stay). In worker
        mode (hosts_per_process > 1) the worker dies: every host of ``group(name)``."""
        h = self.host(name)
        if h.pid:
            _signal(h, signal.SIGCONT)
            h.proc.kill()
            h.proc.wait()

    def restart(self, name: str, *, keep_vms: bool = True, timeout_s: float = 120) -> None:
        """Start the host's hostd again on the same state dir and port (killing it first
        if it runs). ``keep_vms``: the hypervisor kept its domains (a hostd restart);
        False: they are gone (a host reboot). In worker mode, every host of the worker."""
        self.kill(name)
        hosts = self.group(name) if self.per_process > 1 else [self.host(name)]
        for h in hosts:
            h.hypervisor.write_text(surviving_domains(h.state_dir / "ledger.db") if keep_vms else NODE_EMPTY)
        self._start_many(hosts, timeout_s)

    def unreachable(self, name: str) -> None:
        """SIGSTOP the hostd: its port still accepts connections (the kernel's backlog),
        no call is answered (gRPC deadlines expire), no heartbeat is sent. In worker mode,
        every host of the worker."""
        _signal(self.host(name), signal.SIGSTOP)

    def reachable(self, name: str) -> None:
        _signal(self.host(name), signal.SIGCONT)

    def break_carve(self, name: str) -> Path:
        """The next carve of this host fails midway: its node's 2 MiB ``nr_hugepages`` is
        made immutable (chattr +i), so the pool write, after the cpuset steps, is refused
        with EPERM (like a kernel refusing it) and the carve rolls back. Returns the file."""
        attr = self._pool_attr(name)
        subprocess.run(["chattr", "+i", str(attr)], check=True, capture_output=True)
        return attr

    def repair_carve(self, name: str) -> None:
        attr = self._pool_attr(name)
        if attr.exists():
            subprocess.run(["chattr", "-i", str(attr)], check=False, capture_output=True)

    def _pool_attr(self, name: str) -> Path:
        return self.host(name).root / POOL / "nr_hugepages"

    # ------------------------------------------------------------------ clients, measures

    def stub(self, name: str, client: str = "scheduler"):  # type: ignore[no-untyped-def]
        """(gRPC stub, channel) to the host's hostd with the dev CA's ``client`` certificate
        (``scheduler`` or ``fleet-rollout`` may mutate). Close the channel."""
        import grpc

        from api import hostd_pb2_grpc as pb_grpc

        c = self.certs
        creds = grpc.ssl_channel_credentials((c / "ca.crt").read_bytes(), (c / f"{client}.key").read_bytes(),
                                             (c / f"{client}.crt").read_bytes())
        ch = grpc.secure_channel(self.host(name).address, creds)
        return pb_grpc.HostdStub(ch), ch

    def info(self, name: str):  # type: ignore[no-untyped-def]
        """The host's GetHostInfo (its carve and who made it), asked as fleet-rollout."""
        from api import hostd_pb2 as pb

        stub, ch = self.stub(name, "fleet-rollout")
        try:
            return stub.GetHostInfo(pb.GetHostInfoRequest(), timeout=10)
        finally:
            ch.close()

    def carved(self, name: str) -> bool:
        """Whether the host's tree shows a carve (the IO service's cpuset exists)."""
        return (self.host(name).root / CPUSET / "hyb-io").is_dir()

    def usage(self) -> dict[str, Usage]:
        """What each running hostd uses so far (memory now, CPU since its start). In worker
        mode a host's share: its worker's usage divided by the hosts it serves."""
        out = {}
        by_pid: dict[int, list[SimHost]] = {}
        for h in self.hosts:
            if h.pid:
                by_pid.setdefault(h.pid, []).append(h)
        for pid, hosts in by_pid.items():
            u = process_usage(pid)
            if u is None:
                continue
            k = len(hosts)
            for h in hosts:
                out[h.name] = Usage(u.rss // k, u.pss // k, u.cpu_s / k)
        return out

    def process_usage(self) -> dict[int, tuple[Usage, int]]:
        """Each running process of the fleet: (its usage, hosts it serves)."""
        out = {}
        for pid in {h.pid for h in self.hosts if h.pid}:
            u = process_usage(pid)
            if u is not None:
                out[pid] = (u, sum(1 for h in self.hosts if h.pid == pid))
        return out


@dataclass(frozen=True)
class Usage:
    rss: int  # bytes, shared libraries counted whole in every process
    pss: int  # bytes, shared pages divided among the processes sharing them: what N hosts cost
    cpu_s: float  # user + system


def process_usage(pid: int) -> Usage | None:
    """A process's memory now (RSS, PSS) and CPU so far; None once it is gone."""
    try:
        mem = {ln.split(":")[0]: int(ln.split()[1]) * 1024
               for ln in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]}
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return Usage(mem["Rss"], mem["Pss"], (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK"))


def surviving_domains(ledger: Path) -> str:
    """A test-driver node file with one domain per VM the ledger holds as running or
    stopped, carrying hostd's metadata (what the hypervisor of a real host still has
    after hostd died). The test driver starts every domain of the file."""
    from hostd.carve.vmclaim import Claim
    from hostd.carve.vmspec import VmSpec
    from hostd.domain.metadata import VmMetadata

    if not ledger.exists():
        return NODE_EMPTY
    db = sqlite3.connect(f"file:{ledger}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT vm_id, request_id, name, claim_json, spec_json, created FROM vms "
                          "WHERE state IN ('running', 'stopped')").fetchall()
    finally:
        db.close()
    doms = []
    for vm_id, request_id, name, claim, spec, created in rows:
        md = VmMetadata(vm_id, request_id, int(created), Claim.from_dict(json.loads(claim)),
                        VmSpec.from_dict(json.loads(spec)))
        sp = md.spec
        doms.append(f"<domain type='kvm'><name>{escape(name)}</name><uuid>{vm_id}</uuid>"
                    f"<metadata>{md.to_xml()}</metadata><memory unit='MiB'>{sp.memory_mib}</memory>"
                    f"<vcpu>{sp.vcpus}</vcpu><os><type arch='x86_64'>hvm</type></os></domain>")
    return "<node>\n" + "\n".join(doms) + "\n</node>\n"


def _signal(h: SimHost, sig: int) -> None:
    if h.pid:
        try:
            os.kill(h.pid, sig)
        except ProcessLookupError:
            pass


def _free_ports(n: int) -> list[int]:
    """n distinct free ports on 127.0.0.1 (held open together, so none repeats)."""
    import socket

    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def write_scheduler_config(path: Path, *, port: int, certs: Path, db: Path, admin_token: str,
                           host_token: str, extra: str = "", log_level: str = "WARNING",
                           shed_loop_lag_s: float = 5.0) -> Path:
    """A scheduler.toml for a fleet: HTTPS from the dev CA, SQLite, dispatch with the
    scheduler's client certificate, an admin and a host token; ``extra`` is appended.
    ``shed_loop_lag_s``: 5 s, not the shipped 0.5: on a 2-CPU machine that the other
    tests fill, the event loop runs half a second late now and then, and a test's own
    requests (plain HTTP clients, which do not retry as hostd, hybctl and fleet-rollout
    do) were shed; shedding has its own tests (tests/scheduler/api/test_sched_shed.py)."""
    path.write_text(f"""log_level = "{log_level}"
[server]
host = "127.0.0.1"
port = {port}
shed_loop_lag_s = {shed_loop_lag_s}
tls_cert = "{certs / 'scheduler-api.crt'}"
tls_key = "{certs / 'scheduler-api.key'}"
[db]
url = "sqlite:///{db}"
[dispatch]
ca = "{certs / 'ca.crt'}"
cert = "{certs / 'scheduler.crt'}"
key = "{certs / 'scheduler.key'}"
server_name = "localhost"
[[auth.tokens]]
name = "ops"
sha256 = "{sha256(admin_token)}"
scopes = ["admin"]
[[auth.tokens]]
name = "hostd"
sha256 = "{sha256(host_token)}"
scopes = ["host"]
{extra}""")
    return path


@contextlib.contextmanager
def fleet_scheduler(w: Path, *, admin_token: str, host_token: str, tenants: dict[str, str] | None = None,
                    extra: str = "") -> Iterator[dict]:
    """A real `scheduler serve` for a simulated fleet in ``w``: SQLite, HTTPS from a dev CA
    that also signs the fleet-rollout client certificate, an admin and a host token, and
    ``tenants`` ({token: tenant}); stopped by PID on the way out, whatever happened.
    Yields what the tests pass around: sched (tools.dev.procs.Scheduler), certs, dir,
    admin, host_token."""
    from tools.dev.procs import Scheduler, free_port
    certs = dev_certs(w / "tls", ("fleet-rollout",))
    port = free_port()
    tenant_tokens = "".join(f'[[auth.tokens]]\nname = "tenant-{t}"\nsha256 = "{sha256(tok)}"\n'
                            f'scopes = ["tenant:{t}"]\n' for tok, t in (tenants or {}).items())
    write_scheduler_config(w / "scheduler.toml", port=port, certs=certs, db=w / "scheduler.db",
                           admin_token=admin_token, host_token=host_token, extra=tenant_tokens + extra)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOSTD_", "HYB_SCHED_"))}
    s = Scheduler(w / "scheduler.toml", port, env, w / "scheduler.log", ca=certs / "ca.crt")
    try:
        s.start()
        yield {"sched": s, "certs": certs, "dir": w, "admin": admin_token, "host_token": host_token}
    finally:
        s.stop()


def dev_certs(d: Path, clients: tuple[str, ...] = ("fleet-rollout",)) -> Path:
    subprocess.run(["bash", str(REPO / "tools/dev/make-dev-ca.sh"), str(d)], check=True, capture_output=True,
                   env={**os.environ, "DEV_CA_CLIENTS": " ".join(clients)})
    return d


# ---------------------------------------------------------------------- the bench


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Start a simulated fleet of real hostd processes, measure it, stop it.",
                                 epilog="example: tools/dev/fleetsim.py --hosts 50 --racks 10 --idle 20")
    ap.add_argument("--hosts", type=int, default=50)
    ap.add_argument("--racks", type=int, default=10)
    ap.add_argument("--idle", type=float, default=20.0, help="seconds to measure the idle fleet")
    ap.add_argument("--parallel", type=int, default=0, help="hostd processes starting at once (4 per CPU)")
    ap.add_argument("--tick", type=float, default=0.5, help="the animator's period (s)")
    ap.add_argument("--heartbeat", type=float, default=2.0, help="hostd heartbeat_s")
    ap.add_argument("--no-probe", action="store_true", help="no TCP probe of the IO service stand-in")
    ap.add_argument("--per-process", type=int, default=1,
                    help="hosts served by one worker process (tools/dev/fleetsim_multi.py); 1: `hostd serve` each")
    ap.add_argument("--io-interval", type=float, default=1.0, help="hostd's IO-health sample and probe interval (s)")
    ap.add_argument("--workdir", type=Path, help="keep everything here (default: a temp dir, removed)")
    args = ap.parse_args(argv)
    from tools.dev.procs import Scheduler, free_port  # tools/dev/procs.py: daemons stopped by PID
    from tools.dev.procstat import machine, machine_load, tree_cpu_s

    tmp = None if args.workdir else tempfile.TemporaryDirectory(prefix="fleetsim-")
    work = args.workdir or Path(tmp.name)
    work.mkdir(parents=True, exist_ok=True)
    certs = dev_certs(work / "tls")
    port = free_port()
    admin, host_tok = "fleetsim-admin", "fleetsim-host"
    write_scheduler_config(work / "scheduler.toml", port=port, certs=certs, db=work / "scheduler.db",
                           admin_token=admin, host_token=host_tok)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOSTD_", "HYB_SCHED_"))}
    sched = Scheduler(work / "scheduler.toml", port, env, work / "scheduler.log", ca=certs / "ca.crt")
    fleet = SimFleet(work / "fleet", args.hosts, args.racks, scheduler_url=sched.url, host_token=host_tok,
                     admin_token=admin, certs=certs, heartbeat_s=args.heartbeat, probe=not args.no_probe,
                     tick_s=args.tick, parallel=args.parallel, hosts_per_process=args.per_process,
                     io_interval_s=args.io_interval)
    try:
        sched.start()
        fleet.start()
        each = sorted(h.started_s for h in fleet.hosts)
        print(f"{args.hosts} hosts started and registered in {fleet.start_s:.1f} s "
              f"(parallel {fleet.parallel}; spawn->ready median {statistics.median(each):.1f} s, max {each[-1]:.1f} s)")
        time.sleep(3)  # past the start's import burst
        u0, m0, a0, s0 = fleet.usage(), machine(), fleet.animator.busy_s, tree_cpu_s(sched.proc.pid)
        t0 = time.monotonic()
        time.sleep(args.idle)
        dt = time.monotonic() - t0
        u1, m1, a1, s1 = fleet.usage(), machine(), fleet.animator.busy_s, tree_cpu_s(sched.proc.pid)
        rss, pss = sorted(u.rss for u in u1.values()), sorted(u.pss for u in u1.values())
        if args.per_process > 1:
            procs = fleet.process_usage()
            threads = sorted(int(ln.split()[1]) for pid in procs
                             for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ln.startswith("Threads:"))
            prss = sorted(u.rss for u, _ in procs.values())
            print(f"{len(procs)} worker processes of {args.per_process} hosts: RSS median {statistics.median(prss) / 2**20:.0f} MiB, "
                  f"threads median {statistics.median(threads)} (max {threads[-1]}); per host below is a worker's share")
        cpu = sorted((u1[n].cpu_s - u0[n].cpu_s) / dt * 100 for n in u1 if n in u0)
        busy, steal = machine_load(m0, m1)
        print(f"hostd RSS: median {statistics.median(rss) / 2**20:.1f} MiB, max {rss[-1] / 2**20:.1f} MiB; "
              f"PSS (shared pages split): median {statistics.median(pss) / 2**20:.1f} MiB, "
              f"fleet total {sum(pss) / 2**30:.2f} GiB")
        print(f"hostd idle CPU: median {statistics.median(cpu):.2f} %, max {cpu[-1]:.2f} % of a CPU "
              f"(heartbeat {args.heartbeat:g} s, IO sample {args.io_interval:g} s, "
              f"probe {'off' if args.no_probe else f'{args.io_interval:g} s'})")
        print(f"animator: {(a1 - a0) / dt * 100:.1f} % of a CPU (tick {args.tick:g} s); scheduler: "
              f"{(s1 - s0) / dt * 100:.1f} %; machine: {busy:.2f} of {os.cpu_count()} CPUs busy, steal {steal:.2f}")
        return 0
    finally:
        fleet.stop()
        sched.stop()
        if tmp:
            tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
