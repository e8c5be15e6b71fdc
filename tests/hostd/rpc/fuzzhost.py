"""One real `hostd serve` process on a simulated host, for the property tests of
test_rpc_fuzz.py: start it, call any RPC of api/hostd.proto as any caller, watch its
memory during the call, and observe everything a refused call must leave as it was.

The host: a copy of tests/data/hosts/1s-8c-nosmt-1pf-8vf (treehost.host_tree: 8 CPUs, one
node, cgroup v2, a PF with 8 VFs, nvme1n1 and nvme3n1 free for VMs) whose /proc/mounts
already holds a 2 MiB hugetlbfs, so VMs can be created before any carve; libvirt's test
driver inside the hostd process (``test://<node file>``, the designer's real domain XML);
mTLS from the dev CA: ``scheduler`` may change things, ``storage-7`` (a storage host's
certificate of the same CA) may only read. Two images: ``smoke`` (a kernel) and ``disky``
(a raw disk, so a VM gets a root overlay under ``<state_dir>/vms/<name>/``).

What ``observe`` records, for "nothing changed": the ledger's rows (read-only SQLite), every
file of the state dir (its bytes; the ledger's own files are compared as rows, and the carve
lock only as present, since every carve writes its holder note into it), every file of
the host tree, and hostd's own answers: ListVMs, GetInventory (but its generation, which
counts claims and releases, a refused call's undone claim too), GetHostInfo. The test driver's domains live inside the hostd
process, so no other process can list them: the ledger's view over RPC stands for them,
and test_rpc_fuzz.py proves with a canary create that a refused CreateVM left no domain
under its name.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
from google.protobuf import text_format
from google.protobuf.message import Message
from tools.dev.hostd_inproc import dev_certs
from tools.dev.procs import Hostd, write_hostd_config
from treehost import host_tree, snapshot

from api import hostd_pb2 as pb

log = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[3]
ADMIN, READER = "scheduler", "storage-7"  # rpc_mutating_callers has the first only
CALL_TIMEOUT_S = 30.0  # per call: a hung hostd fails the example instead of hanging the test
RSS_HEADROOM_KIB = 200 * 1024  # hostd's RSS may grow this much over its warmed-up size
POLICY = """
[io_service]
cgroup = "oss.slice"
cpus_per_node = 2

[[hugepages.pools]]
size = "2M"
count_per_node = 256

[hugepages]
io_floor_percent = 5

[[sriov.pfs]]
name = "enp1s0f0np0"
vfs = 8

[disks]
allow = ["nvme*n1"]
default_bytes_sec = 1000000000
default_iops = 100000
"""
HUGETLBFS = "hugetlbfs /dev/hugepages hugetlbfs rw,relatime,pagesize=2M 0 0\n"
LEDGER_FILES = ("ledger.db", "ledger.db-wal", "ledger.db-shm")
LOCK_FILE = "carve.lock"
# The message hostd's status carries: "hyb.vm.refused [disks[0].disk]: nvme1n1 cannot ..."
ERROR_RE = re.compile(r"(hyb\.[a-z0-9_]+(?:\.[a-z0-9_]+)+)(?: \[(.*?)\])?: ", re.DOTALL)


# ------------------------------------------------------------------ the oracle: hostd/README.md


def readme_statuses(readme: Path = REPO / "hostd/README.md") -> dict[str, str]:
    """The error table of hostd/README.md ("## Errors"): code -> gRPC status name. A cell
    of codes joined by ", " shares one status; codes joined by " / " take the statuses
    joined the same way, in order."""
    section = readme.read_text().split("\n## Errors\n", 1)[1].split("\n## ", 1)[0]
    out: dict[str, str] = {}
    for row in section.splitlines():
        if not row.startswith("| `hyb."):
            continue
        codes_cell, status_cell = (c.strip() for c in row.strip().strip("|").split("|")[:2])
        groups = [re.findall(r"`(hyb\.[a-z0-9_.]+)`", part) for part in codes_cell.split(" / ")]
        statuses = [s.strip() for s in status_cell.split(" / ")]
        if len(statuses) == 1:
            statuses *= len(groups)
        assert len(statuses) == len(groups), f"hostd/README.md error table: cannot pair {row!r}"
        for codes, status in zip(groups, statuses):
            for code in codes:
                out[code] = status
    return out


def readme_bound(field: str, readme: Path = REPO / "hostd/README.md") -> tuple[int, int] | None:
    """The range hostd/README.md's table of bounds gives a numeric request field
    ("| `grace_seconds` (DeleteVM, StopVM) | 0-300 | ..."), or None where it gives none."""
    for row in readme.read_text().splitlines():
        if row.startswith(f"| `{field}`"):
            m = re.fullmatch(r"([\d,]+)-([\d,]+)", row.split("|")[2].strip())
            if m:
                return int(m.group(1).replace(",", "")), int(m.group(2).replace(",", ""))
    return None


def error_code(details: str) -> tuple[str, str | None] | None:
    """(code, field) from a status message, or None when it does not start with one."""
    m = ERROR_RE.match(details or "")
    return (m.group(1), m.group(2)) if m else None


# ------------------------------------------------------------------ calls and what they answered


@dataclass(frozen=True)
class Outcome:
    status: str  # "OK" or a grpc.StatusCode name
    details: str = ""
    response: Message | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "OK"


def method(rpc: str):  # type: ignore[no-untyped-def]
    return pb.DESCRIPTOR.services_by_name["Hostd"].methods_by_name[rpc]


def request_type(rpc: str) -> type[Message]:
    return getattr(pb, method(rpc).input_type.name)


def short(msg: Message | None, limit: int = 600) -> str:
    """A message as one line of text format, long strings cut (a 1 MiB label stays readable)."""
    if msg is None:
        return "-"
    text = text_format.MessageToString(msg, as_one_line=True)
    text = re.sub(r'"([^"\\]|\\.){120,}"', lambda m: m.group(0)[:60] + f'..."(+{len(m.group(0)) - 60} chars)', text)
    return text if len(text) <= limit else text[:limit] + f" ...(+{len(text) - limit} chars)"


# ------------------------------------------------------------------ what a refused call must not change


@dataclass(frozen=True)
class Observed:
    ledger: dict[str, list[str]]
    state: dict[str, bytes | str]
    tree: dict[str, bytes | str]
    vms: str
    inventory: str  # without its generation
    info: str

    def differences(self, other: Observed, *, ignore: tuple[str, ...] = ()) -> list[str]:
        """What differs, part by part (file names and tables named), ``ignore`` left out."""
        out = []
        for f in dataclasses.fields(self):
            if f.name in ignore:
                continue
            a, b = getattr(self, f.name), getattr(other, f.name)
            if a == b:
                continue
            if isinstance(a, dict):
                keys = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
                out.append(f"{f.name}: {', '.join(keys[:8])}{' ...' if len(keys) > 8 else ''}")
            else:
                out.append(f"{f.name}: {str(a)[:300]!r} -> {str(b)[:300]!r}")
        return out


def ledger_rows(path: Path) -> dict[str, list[str]]:
    """Every table's rows, sorted (the ledger's content, not its pages)."""
    if not path.exists():
        return {}
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        return {t: sorted(repr(r) for r in db.execute(f'SELECT * FROM "{t}"')) for t in tables}
    finally:
        db.close()


def state_files(state: Path) -> dict[str, bytes | str]:
    files = snapshot(state) if state.exists() else {}
    for name in LEDGER_FILES:
        files.pop(name, None)
    if LOCK_FILE in files:
        files[LOCK_FILE] = "<lock>"
    return files


# ------------------------------------------------------------------ the daemon


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class LiveHostd:
    """The hostd process and its host. ``ensure_up`` (re)starts it on a fresh host when
    it is not running or an earlier example left it suspect (killed for its memory, hung,
    or left with VMs a cleanup could not delete)."""

    def __init__(self, work: Path):
        self.work = work
        self.certs = dev_certs(work / "tls", (READER,))
        self.root, self.state = work / "host", work / "state"
        self.node = work / "hypervisor.xml"
        (work / "policy.toml").write_text(POLICY)
        self._images(work / "images")
        self.cfg = write_hostd_config(work / "hostd.toml", policy=work / "policy.toml", state=self.state,
                                      images=work / "images", certs=self.certs, libvirt_uri=f"test://{self.node}",
                                      root=self.root, io_health_interval_s=0, watchdog_s=60,
                                      release_file=work / "release-id")
        env = {k: v for k, v in os.environ.items() if not k.startswith("HOSTD_")}
        self.hostd = Hostd(self.cfg, env, work / "hostd.log")
        self.channels: dict[str, grpc.Channel] = {}
        self.rss_bound_kib = 0
        self.suspect = ""  # why the next example needs a fresh hostd
        self.baseline: Observed | None = None  # the host as every example starts on it
        self.starts = 0

    def _images(self, d: Path) -> None:
        from hostd.apply.images import ImageStore

        (self.work / "vmlinuz").write_bytes(b"the test driver boots nothing")
        with open(self.work / "disk.raw", "wb") as f:
            f.truncate(2**20)
        ImageStore(d).add("smoke", "1", "kernel", {"kernel": self.work / "vmlinuz"})
        ImageStore(d).add("disky", "1", "disk", {"disk": self.work / "disk.raw"})

    # ------------------------------------------------------------ start, stop

    @property
    def pid(self) -> int:
        assert self.hostd.proc is not None
        return self.hostd.proc.pid

    def alive(self) -> bool:
        return self.hostd.proc is not None and self.hostd.proc.poll() is None

    def start(self) -> LiveHostd:
        if self.root.exists():
            shutil.rmtree(self.root)
        shutil.rmtree(self.state, ignore_errors=True)
        host_tree(self.root)
        with open(self.root / "proc/mounts", "a") as f:
            f.write(HUGETLBFS)
        (self.root / "dev/hugepages").mkdir(parents=True, exist_ok=True)
        self.node.write_text("<node/>\n")
        self.hostd.start()
        self.starts += 1
        self.warm_up()
        self.rss_bound_kib = rss_kib(self.pid) + RSS_HEADROOM_KIB
        self.suspect = ""
        self.forget_leftovers()
        self.baseline = self.observe()
        return self

    def warm_up(self) -> None:
        """One of each kind of call, so the RSS bound is measured over a hostd that has
        loaded what its calls load (gRPC, the designer, the planner)."""
        for rpc in ("Health", "GetInventory", "GetHostInfo", "ListVMs", "GetHostStats"):
            self.must(rpc, request_type(rpc)(), who=READER)
        self.must("PlanCarve", pb.PlanCarveRequest(policy_toml=POLICY), who=READER)
        vm = self.must("CreateVM", pb.CreateVMRequest(request_id="warm-up", name="warm-up", vcpus=1, memory_mib=128,
                                                      image="disky"))
        self.must("DeleteVM", pb.DeleteVMRequest(vm_id=vm.vm_id))

    def stop(self) -> None:
        for ch in self.channels.values():
            ch.close()
        self.channels.clear()
        if self.suspect and self.alive():
            self.hostd.proc.kill()  # by its PID; a hung hostd would sit out SIGTERM's grace
            self.hostd.proc.wait()
        self.hostd.stop()

    def ensure_up(self) -> None:
        if self.alive() and not self.suspect:
            return
        log.warning("starting a fresh hostd: %s", self.suspect or "not running")
        self.stop()
        self.start()

    # ------------------------------------------------------------ calls

    def channel(self, who: str) -> grpc.Channel:
        if who not in self.channels:
            c = self.certs
            creds = grpc.ssl_channel_credentials((c / "ca.crt").read_bytes(), (c / f"{who}.key").read_bytes(),
                                                 (c / f"{who}.crt").read_bytes())
            self.channels[who] = grpc.secure_channel(f"localhost:{self.hostd.port}", creds)
        return self.channels[who]

    def call(self, rpc: str, request: Message, *, who: str = ADMIN, unknown: bytes = b"",
             timeout: float = CALL_TIMEOUT_S) -> Outcome:
        """One unary call; ``unknown``: bytes of fields the proto does not know, appended
        to the request's own (a newer client's)."""
        m = method(rpc)
        out_type = getattr(pb, m.output_type.name)
        fn = self.channel(who).unary_unary(f"/{m.containing_service.full_name}/{rpc}",
                                           request_serializer=lambda r: r.SerializeToString() + unknown,
                                           response_deserializer=out_type.FromString)
        t0 = time.monotonic()
        try:
            resp = fn(request, timeout=timeout)
        except grpc.RpcError as e:
            return Outcome(e.code().name, e.details() or "", None, time.monotonic() - t0)
        return Outcome("OK", "", resp, time.monotonic() - t0)

    def watch(self, request: pb.WatchEventsRequest, *, who: str, unknown: bytes = b"",
              for_s: float = 0.5) -> Outcome:
        """WatchEvents for ``for_s``: the stream ending at the caller's deadline is its
        normal end (reported OK); any other status is the server's."""
        m = method("WatchEvents")
        fn = self.channel(who).unary_stream(f"/{m.containing_service.full_name}/WatchEvents",
                                            request_serializer=lambda r: r.SerializeToString() + unknown,
                                            response_deserializer=pb.VMEvent.FromString)
        t0 = time.monotonic()
        try:
            for _ in fn(request, timeout=for_s):
                pass
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                return Outcome(e.code().name, e.details() or "", None, time.monotonic() - t0)
        return Outcome("OK", "", None, time.monotonic() - t0)

    def must(self, rpc: str, request: Message, *, who: str = ADMIN):  # type: ignore[no-untyped-def]
        out = self.call(rpc, request, who=who)
        if not out.ok:
            raise AssertionError(f"{rpc}({short(request)}) as {who}: {out.status} {out.details}")
        return out.response

    @contextmanager
    def rss_guard(self, every_s: float = 0.02) -> Iterator[list[int]]:
        """Watches hostd's RSS while the block runs; past the bound, hostd is SIGKILLed
        (by PID) before it takes the machine's memory. Yields [peak KiB, killed (0/1)]."""
        seen = [0, 0]
        done = threading.Event()
        pid = self.pid

        def watch() -> None:
            while not done.wait(every_s):
                try:
                    seen[0] = max(seen[0], rss_kib(pid))
                except OSError:
                    return
                if seen[0] > self.rss_bound_kib:
                    os.kill(pid, signal.SIGKILL)
                    seen[1] = 1
                    return
        t = threading.Thread(target=watch, daemon=True)
        t.start()
        try:
            yield seen
        finally:
            done.set()
            t.join()

    # ------------------------------------------------------------ what it holds

    def observe(self) -> Observed:
        inv = self.must("GetInventory", pb.GetInventoryRequest(), who=READER)
        inv.generation = 0
        info = self.must("GetHostInfo", pb.GetHostInfoRequest(), who=READER)
        vms = self.must("ListVMs", pb.ListVMsRequest(), who=READER)
        return Observed(ledger=ledger_rows(self.state / "ledger.db"), state=state_files(self.state),
                        tree=snapshot(self.root), vms=text_format.MessageToString(vms, as_one_line=True),
                        inventory=text_format.MessageToString(inv, as_one_line=True),
                        info=text_format.MessageToString(info, as_one_line=True))

    def domain_xml(self, vm_id: str, uuid: str | None = None) -> str:
        """A domain XML of the VM carrying hostd's metadata, as a target's PrepareMigration
        answers it (what MigrateVM checks before it calls libvirt); ``uuid``: another."""
        from hostd.carve.vmclaim import Claim
        from hostd.carve.vmspec import VmSpec
        from hostd.domain.metadata import VmMetadata

        db = sqlite3.connect(f"file:{self.state / 'ledger.db'}?mode=ro", uri=True, timeout=10)
        try:
            name, rid, claim, spec, created = db.execute(
                "SELECT name, request_id, claim_json, spec_json, created FROM vms WHERE vm_id = ?", (vm_id,)).fetchone()
        finally:
            db.close()
        md = VmMetadata(vm_id, rid, int(created), Claim.from_dict(json.loads(claim)), VmSpec.from_dict(json.loads(spec)))
        return (f"<domain type='kvm'><name>{name}</name><uuid>{uuid or vm_id}</uuid><metadata>{md.to_xml()}</metadata>"
                f"<memory unit='MiB'>{md.spec.memory_mib}</memory><vcpu>{md.spec.vcpus}</vcpu></domain>")

    def clean_up(self) -> None:
        """Back to the host every example starts from (``baseline``: no VM, not carved),
        so an example replayed while hypothesis shrinks meets the host its first run met.
        What the API cannot undo makes the next example start a fresh hostd on a fresh host."""
        if not self.alive():
            self.suspect = self.suspect or "not running"
            return
        try:
            for vm in self.must("ListVMs", pb.ListVMsRequest()).vms:
                if vm.state == pb.VM_STATE_INCOMING:  # a prepared migration: hostd refuses its delete
                    self.must("AbortMigration", pb.MigrationRef(name=vm.name))
                else:
                    self.must("DeleteVM", pb.DeleteVMRequest(vm_id=vm.vm_id))
            info = self.must("GetHostInfo", pb.GetHostInfoRequest())
            if info.carved_policy_digest or info.journal_steps:
                self.must("Uncarve", pb.UncarveRequest(drained=True, expected_digest=info.carved_policy_digest,
                                                       operation_id="fuzz/clean-up"))
            self.forget_leftovers()
            left = self.baseline.differences(self.observe())
        except AssertionError as e:
            left = [f"clean-up failed: {e}"]
        if left and not self.suspect:
            self.suspect = "; ".join(left)

    def forget_leftovers(self) -> None:
        """Directories under ``<state_dir>/vms`` of VMs the ledger no longer has: an
        example that left one was judged already; the next must not meet it."""
        vms = self.state / "vms"
        names = {v.name for v in self.must("ListVMs", pb.ListVMsRequest()).vms}
        for d in vms.iterdir() if vms.is_dir() else ():
            if d.name not in names:
                shutil.rmtree(d) if d.is_dir() and not d.is_symlink() else d.unlink()
