"""hostd under hostile input: every RPC of api/hostd.proto, driven with generated requests,
valid and hostile (fuzzcases.py), against one real `hostd serve` process on a simulated
host (fuzzhost.py: a recorded host tree, libvirt's test driver, mTLS from the dev CA).

Each example is one call, made on a host with no VM and no carve (plus the VM or carve
the case needs first), and after it:

- hostd is alive, answers GetHostInfo, answered within the call timeout, and its RSS
  stayed within RSS_HEADROOM_KIB of its warmed-up size (watched during the call: past
  the bound it is SIGKILLed before it takes the machine's memory);
- a failed call has a status other than INTERNAL or UNKNOWN, its message starts with a
  `hyb.*` code, and that code's status is the one hostd/README.md's error table gives
  (the table is parsed here: the doc is the oracle), within the message length README
  promises if it names one;
- a case that breaks one rule of its request gets the status that rule calls for, and
  the code where README names one;
- a refused call, and a call that asks for no change, changed nothing: the ledger's rows,
  the state dir's files (carve journal and state included), the host tree, and what
  ListVMs, GetInventory and GetHostInfo answer;
- a call that succeeded did what it says: a created VM runs, and deleting it leaves the
  ledger and the state dir as they were before it; a carve then an uncarve leave the
  host tree byte for byte as it was; and after every CreateVM case a VM of the same name
  can be created (no domain of the call stayed behind in libvirt, which only hostd sees).

Every failure is its own exception class per (RPC, fault, property), so hypothesis
reports each distinct defect with its own shrunk example. The default run is bounded
(EXAMPLES per RPC, derandomized, no example database: the same examples every run);
HYB_FUZZ_EXAMPLES=N runs N per RPC with fresh randomness (tests/README.md). The defects
found so far (issue #37's list, and those found beside it) also run as plain cases,
test_known_defect, every time.

Not reachable here: a VM with a raw disk (the host tree has no device node for hostd to
hold), so UpdateIOLimits of a VM's own disk; a migration that succeeds (one hostd, and
libvirt's test driver does not migrate)."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from fuzzcases import (
    INVALID,
    MOVED_ID,
    REFUSED,
    NAME_RE,
    U32,
    VM_IDS,
    Case,
    carve_cases,
    create_vm_cases,
    delete_cases,
    fail,
    get_vm_cases,
    list_vms_cases,
    migrate_cases,
    migration_ref_cases,
    plan_cases,
    policy,
    prepare_cases,
    prior_request,
    reader_or,
    sha,
    start_cases,
    stop_cases,
    uncarve_cases,
    unknown_fields,
    update_io_cases,
    with_unknown,
)
from fuzzhost import (
    ADMIN,
    CALL_TIMEOUT_S,
    POLICY,
    READER,
    REPO,
    LiveHostd,
    Observed,
    Outcome,
    error_code,
    readme_statuses,
    request_type,
    rss_kib,
    short,
)
from google.protobuf.message import Message
from hypothesis import HealthCheck, Phase, currently_in_test_context, event, given, settings
from hypothesis import strategies as st

from api import hostd_pb2 as pb
from hostd.domain.metadata import NS

DEEP = int(os.environ.get("HYB_FUZZ_EXAMPLES", "0") or 0)
EXAMPLES = DEEP or 25  # per RPC with request fields
FEW = max(DEEP // 3, 5) if DEEP else 5  # per RPC with none to speak of
# Simulated hosts on their own trees: not the machine group (tests/README.md). A deep run
# takes its time: about a second per example, more while hypothesis shrinks a failure.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("rpc-fuzz"), pytest.mark.timeout(max(600, 12 * DEEP))]
STATUSES = readme_statuses()
# "a status message is at most 1,024 characters", where hostd/README.md promises one
_LIMIT = re.search(r"status message is at most ([\d,]+) characters", (REPO / "hostd/README.md").read_text())
MESSAGE_LIMIT = int(_LIMIT.group(1).replace(",", "")) if _LIMIT else None
NO_VM = "00000000-0000-4000-8000-000000000000"  # a well-formed VM id no VM has


def fuzz(examples: int):  # type: ignore[no-untyped-def]
    # No "explain" phase: it replays a shrunk failure hundreds of times against the daemon
    # to say which parts of it matter, which a Case's fault already says.
    return settings(max_examples=examples, deadline=None, database=None, derandomize=not DEEP,
                    suppress_health_check=list(HealthCheck), phases=[p for p in Phase if p is not Phase.explain])


# ------------------------------------------------------------------ running a case


@pytest.fixture(scope="module")
def live() -> Iterator[LiveHostd]:
    # QEMU's user must traverse the state dir (hostd checks it for root overlays): not
    # under pytest's 0700 tmp dirs.
    work = Path(tempfile.mkdtemp(prefix="hyb-fuzz-", dir="/var/tmp"))
    work.chmod(0o755)
    h = LiveHostd(work)
    try:
        yield h.start()
    finally:
        h.stop()
        shutil.rmtree(work, ignore_errors=True)


def set_up(live: LiveHostd, setup: str) -> dict[str, str]:
    """What the case's placeholders stand for, after making what the case needs: a VM
    ("vm", "stopped", "prior"), a VM incoming by migration, or a carve."""
    inv = live.must("GetInventory", pb.GetInventoryRequest(), who=READER)
    values = {f"<disk{i}>": d.name for i, d in enumerate(inv.disks)} | \
             {f"<disk{i}:id>": d.id for i, d in enumerate(inv.disks)} | \
             {"<carved>": "", "<vm>": NO_VM, "<name>": "fz-none", "<xml>": "", "<xml-other>": "", "<ns>": NS}
    vm = None
    if setup in ("vm", "stopped"):
        vm = live.must("CreateVM", pb.CreateVMRequest(request_id="req-fz-target", name="fz-target", vcpus=1,
                                                      memory_mib=128, image="disky", labels={"tenant": "fz"}))
        if setup == "stopped":
            live.must("StopVM", pb.StopVMRequest(vm_id=vm.vm_id))
    elif setup == "prior":
        vm = live.must("CreateVM", prior_request())
    elif setup == "incoming":
        vm = live.must("PrepareMigration", pb.PrepareMigrationRequest(
            request_id="mig-fz-in", vm_id=MOVED_ID, source_host="fz-source",
            vm=pb.CreateVMRequest(request_id="req-fz-in", name="fz-incoming", vcpus=1, memory_mib=128,
                                  image="disky"))).vm
    elif setup == "carved":
        text = policy(2, 512)
        live.must("Carve", pb.CarveRequest(policy_toml=text, policy_digest=sha(text), expected_digest="",
                                           operation_id="fuzz/set-up"))
        values["<carved>"] = sha(text)
    if vm is not None:
        values |= {"<vm>": vm.vm_id, "<name>": vm.name, "<xml>": live.domain_xml(vm.vm_id),
                   "<xml-other>": live.domain_xml(vm.vm_id, uuid=NO_VM)}
    return values


def bind(msg: Message, values: dict[str, str]) -> Message:
    """A copy of ``msg`` with the placeholders in its string fields filled in (in one
    pass: a value filled in is not scanned again)."""
    out = type(msg)()
    out.CopyFrom(msg)
    holes = re.compile("|".join(re.escape(k) for k in values))

    def fill(m: Message) -> None:
        for f, v in m.ListFields():
            if f.message_type is not None:
                if f.message_type.GetOptions().map_entry:
                    continue
                for sub in (v if f.is_repeated else [v]):
                    fill(sub)
            elif isinstance(v, str):
                setattr(m, f.name, holes.sub(lambda h: values[h.group(0)], v))
    fill(out)
    return out


def run(live: LiveHostd, case: Case) -> None:
    """One example: set up, call, judge, and the host back as every example starts on it.
    (`pytest --hypothesis-show-statistics` shows which faults met which answers.)"""
    live.ensure_up()
    try:
        values = set_up(live, case.setup)
        req = bind(case.request, values)
        before = live.observe()
        with live.rss_guard() as seen:
            out = live.watch(req, who=case.who, unknown=case.unknown) if case.rpc == "WatchEvents" \
                else live.call(case.rpc, req, who=case.who, unknown=case.unknown)
        if currently_in_test_context():  # not in test_known_defect's plain cases
            event(f"{case.fault} -> {out.status}")
        judge(live, case, req, out, seen, before)
        if out.ok:
            done(live, case, req, out, values)
    finally:
        live.clean_up()
    if case.rpc == "CreateVM" and NAME_RE.fullmatch(case.request.name) and case.request.name not in (".", ".."):
        canary(live, case)


def judge(live: LiveHostd, case: Case, req: Message, out: Outcome, seen: list[int], before: Observed) -> None:
    """The properties every call has: alive, bounded, answered as documented, and a
    refused call (or one that asks for nothing) changed nothing."""
    said = f"answered {out.status} {out.details[:300]!r} in {out.seconds:.1f} s"
    if seen[1]:
        live.suspect = "killed for its memory"
        raise fail(case, "memory", f"hostd's RSS passed {live.rss_bound_kib // 1024} MiB during the call "
                                   f"(SIGKILLed); {said}")
    if not live.alive():
        live.suspect = "died"
        raise fail(case, "alive", f"hostd exited {live.hostd.proc.returncode} during the call; {said}")
    if out.status == "DEADLINE_EXCEEDED" or out.seconds >= CALL_TIMEOUT_S:
        live.suspect = "hung"
        raise fail(case, "hang", f"no answer within {CALL_TIMEOUT_S:.0f} s")
    try:
        after = live.observe()
    except AssertionError as e:
        live.suspect = "does not answer"
        raise fail(case, "answers", f"hostd does not answer after the call ({e}); {said}") from None
    if rss_kib(live.pid) > live.rss_bound_kib:
        live.suspect = "grew"
        raise fail(case, "memory", f"hostd's RSS is {rss_kib(live.pid) // 1024} MiB after the call, over "
                                   f"{live.rss_bound_kib // 1024} MiB; {said}")
    if not out.ok:
        if out.status in ("INTERNAL", "UNKNOWN"):
            raise fail(case, "internal", said)
        if "metadata size exceeds" in out.details:  # the client's gRPC refused hostd's status message
            raise fail(case, "message_length", f"hostd's status message is too long to deliver; {said}")
        parsed = error_code(out.details)
        if parsed is None:
            raise fail(case, "no_code", f"the message carries no hyb.* code; {said}")
        code = parsed[0]
        if MESSAGE_LIMIT and len(out.details) > MESSAGE_LIMIT:
            raise fail(case, "message_length", f"{len(out.details)} characters, over hostd/README.md's "
                                               f"{MESSAGE_LIMIT}; {said}")
        if code not in STATUSES:
            raise fail(case, "undocumented", f"{code} is not in hostd/README.md's error table; {said}")
        if STATUSES[code] != out.status:
            raise fail(case, "status_vs_readme", f"hostd/README.md gives {code} {STATUSES[code]}; {said}")
    if out.status not in case.expect:
        raise fail(case, "status", f"expected {'/'.join(sorted(case.expect))}; {said}")
    if case.code and not out.ok and error_code(out.details)[0] != case.code:
        raise fail(case, "code", f"expected {case.code}; {said}")
    if not out.ok or case.no_op:
        changed = before.differences(after)
        if changed:
            raise fail(case, "changed", f"{'refused' if not out.ok else 'a no-op'}, yet changed: "
                                        f"{'; '.join(changed)}; {said}")


def done(live: LiveHostd, case: Case, req: Message, out: Outcome, values: dict[str, str]) -> None:
    """What a call that succeeded promises, and that undoing it leaves no trace: the host
    as every example starts on it (``live.baseline``, which clean-up holds it to)."""
    start = live.baseline
    if case.rpc == "CreateVM" and case.fault == "retry":
        if out.response.vm_id != values["<vm>"]:
            raise fail(case, "idempotent", f"a retry made VM {out.response.vm_id}, not {values['<vm>']}")
    elif case.rpc == "CreateVM":
        vm = out.response
        if (vm.state, vm.name, dict(vm.labels)) != (pb.VM_STATE_RUNNING, req.name, dict(req.labels)):
            raise fail(case, "created", f"got {short(vm)}")
        live.must("DeleteVM", pb.DeleteVMRequest(vm_id=vm.vm_id))
        left = start.differences(live.observe())
        if left:
            raise fail(case, "deleted", f"create then delete left: {'; '.join(left)}")
    elif case.rpc == "DeleteVM":
        left = start.differences(live.observe())
        if left:
            raise fail(case, "deleted", f"the delete left: {'; '.join(left)}")
    elif case.rpc in ("StopVM", "StartVM"):
        want = pb.VM_STATE_STOPPED if case.rpc == "StopVM" else pb.VM_STATE_RUNNING
        if out.response.state != want:
            raise fail(case, "state", f"got {short(out.response)}")
    elif case.rpc == "Carve":
        live.must("Uncarve", pb.UncarveRequest(expected_digest=req.policy_digest, operation_id="fuzz/undo"))
        left = start.differences(live.observe())
        if left:
            raise fail(case, "uncarved", f"carve then uncarve left: {'; '.join(left)}")
    elif case.rpc == "Uncarve" and case.setup == "carved":
        left = start.differences(live.observe())
        if left:
            raise fail(case, "uncarved", f"carve then uncarve left: {'; '.join(left)}")
    elif case.rpc == "PrepareMigration":
        if out.response.vm.state != pb.VM_STATE_INCOMING or not out.response.domain_xml:
            raise fail(case, "prepared", f"got {short(out.response)}")
        live.must("AbortMigration", pb.MigrationRef(name=req.vm.name))
        left = start.differences(live.observe())
        if left:
            raise fail(case, "aborted", f"prepare then abort left: {'; '.join(left)}")
    elif case.rpc == "AbortMigration" and case.setup == "incoming" and case.fault == "valid":
        left = start.differences(live.observe())
        if left:
            raise fail(case, "aborted", f"prepare then abort left: {'; '.join(left)}")


def canary(live: LiveHostd, case: Case) -> None:
    """A VM of the case's name can be created now: no domain of the call stayed in libvirt."""
    live.ensure_up()
    name = case.request.name
    out = live.call("CreateVM", pb.CreateVMRequest(request_id="req-canary", name=name, vcpus=1, memory_mib=2,
                                                   image="smoke"))
    live.clean_up()
    if not out.ok:
        raise fail(case, "domain_left", f"a VM named {name!r} cannot be created after the case: "
                                        f"{out.status} {out.details[:300]!r}")


# ------------------------------------------------------------------ the properties, one test per RPC


def test_readme_error_table_parses() -> None:
    """The oracle itself: every row of hostd/README.md's error table read, every status a
    gRPC status name."""
    assert len(STATUSES) >= 25 and STATUSES["hyb.spec.invalid"] == "INVALID_ARGUMENT"
    assert STATUSES["hyb.image.bad"] == "FAILED_PRECONDITION" and STATUSES["hyb.image.unknown"] == "INVALID_ARGUMENT"
    assert set(STATUSES.values()) <= set(grpc.StatusCode.__members__)


# ------------------------------------------------------------------ defects found, run every time


def _create(**kw: object) -> pb.CreateVMRequest:
    return pb.CreateVMRequest(**({"request_id": "req-fz-known", "name": "fz-known", "vcpus": 1, "memory_mib": 2,
                                  "image": "smoke"} | kw))


def _policy_case(rpc: str, text: str, fault: str) -> Case:
    if rpc == "PlanCarve":
        return Case(rpc, pb.PlanCarveRequest(policy_toml=text), fault, frozenset({"OK", "INVALID_ARGUMENT"}),
                    who=READER, no_op=True)
    return Case(rpc, pb.CarveRequest(policy_toml=text, policy_digest=sha(text), expected_digest="",
                                     operation_id="fuzz/known"), fault, REFUSED | {"OK"})


def _migrate(**kw: object) -> pb.MigrateVMRequest:
    return pb.MigrateVMRequest(**({"name": "<name>", "target_uri": "test:///default", "domain_xml": "<xml>"} | kw))


_TUNE = pb.IoTune(total_bytes_sec=10**6, total_iops_sec=100)
_HUGE_RANGE = POLICY.replace("cpus_per_node = 2", 'cpus = "0-4294967296"')
_NESTED = "x = " + "[" * 5000 + "]" * 5000
# (test id, case): the defects issue #37 names (D1-D8 and the rest of its list), then those
# this test found beside them. The generated cases find them too, but a bounded run need
# not draw each one.
KNOWN = [
    ("D1-plan-cpus-range", _policy_case("PlanCarve", _HUGE_RANGE, "policy:cpus_range")),
    ("D1-carve-cpus-range", _policy_case("Carve", _HUGE_RANGE, "policy:cpus_range")),
    ("D2-plan-nested-toml", _policy_case("PlanCarve", _NESTED, "policy:nesting")),
    ("D2-carve-nested-toml", _policy_case("Carve", _NESTED, "policy:nesting")),
    ("D3-name-newline", Case("CreateVM", _create(name="fz-a\n"), "name:control", INVALID, "hyb.spec.invalid")),
    ("D4-name-dotdot", Case("CreateVM", _create(name=".."), "name:dot", INVALID, "hyb.spec.invalid")),
    ("D4-name-dot", Case("CreateVM", _create(name="."), "name:dot", INVALID, "hyb.spec.invalid")),
    ("D5-request-id-nul", Case("CreateVM", _create(request_id="r\0"), "request_id:control", INVALID,
                               "hyb.spec.invalid")),
    ("D6-disk-twice", Case("CreateVM", _create(disks=[pb.DiskRequest(disk="<disk0>", iotune=_TUNE),
                                                       pb.DiskRequest(disk="<disk0:id>", iotune=_TUNE)]),
                           "disk_twice", REFUSED)),
    ("D7-labels-many", Case("CreateVM", _create(labels={f"k{i}": "v" for i in range(20000)}), "labels:many",
                            INVALID, "hyb.spec.invalid")),
    ("D7-label-huge", Case("CreateVM", _create(labels={"k": "v" * 2**20}), "labels:huge", INVALID,
                           "hyb.spec.invalid")),
    ("D8-empty-update", Case("UpdateIOLimits", pb.UpdateIOLimitsRequest(vm_id="<vm>"), setup="vm", no_op=True)),
    ("delete-leaves-no-directory", Case("DeleteVM", pb.DeleteVMRequest(vm_id="<vm>"), setup="vm")),
    ("profile-unknown", Case("CreateVM", _create(profile="no-such-profile"), "profile:unknown", INVALID,
                             "hyb.guest_profile.unknown")),
    ("migrate-malformed-metadata", Case("MigrateVM", _migrate(
        domain_xml="<domain><uuid><vm></uuid><metadata><hyb:vm xmlns:hyb='<ns>'/></metadata></domain>"),
        "domain_xml", INVALID, "hyb.spec.invalid", setup="vm")),
    # api/hostd.proto: "On failure the VM still runs here, unchanged in the ledger."
    ("migrate-failed-leaves-ledger", Case("MigrateVM", _migrate(), "valid", frozenset({"ABORTED"}),
                                          "hyb.migration.failed", setup="vm")),
    ("prepare-request-id-nul", Case("PrepareMigration", pb.PrepareMigrationRequest(
        request_id="m\0", vm_id=MOVED_ID, vm=_create(name="fz-moved")), "request_id:control", INVALID)),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=i) for i, c in KNOWN])
def test_known_defect(live: LiveHostd, case: Case) -> None:
    run(live, case)


@fuzz(EXAMPLES)
@given(case=with_unknown(reader_or(create_vm_cases())))
def test_create_vm(live: LiveHostd, case: Case) -> None:
    run(live, case)


@fuzz(EXAMPLES)
@given(case=with_unknown(reader_or(delete_cases())))
def test_delete_vm(live: LiveHostd, case: Case) -> None:
    run(live, case)


@fuzz(EXAMPLES)
@given(case=with_unknown(reader_or(stop_cases())))
def test_stop_vm(live: LiveHostd, case: Case) -> None:
    run(live, case)


@fuzz(EXAMPLES)
@given(case=with_unknown(reader_or(start_cases())))
def test_start_vm(live: LiveHostd, case: Case) -> None:
    run(live, case)


@fuzz(EXAMPLES)
@given(case=with_unknown(get_vm_cases()))
def test_get_vm(live: LiveHostd, case: Case) -> None:
    run(live, case)


@fuzz(EXAMPLES)
@given(case=with_unknown(list_vms_cases()))
def test_list_vms(live: LiveHostd, case: Case) -> None:
    run(live, case)


@fuzz(EXAMPLES)
@given(case=with_unknown(reader_or(update_io_cases())))
def test_update_io_limits(live: LiveHostd, case: Case) -> None:
    run(live, case)


@fuzz(EXAMPLES)
@given(case=with_unknown(plan_cases()))
def test_plan_carve(live: LiveHostd, case: Case) -> None:
    run(live, case)


@fuzz(EXAMPLES)
@given(case=with_unknown(reader_or(carve_cases())))
def test_carve(live: LiveHostd, case: Case) -> None:
    run(live, case)


@fuzz(EXAMPLES)
@given(case=with_unknown(reader_or(uncarve_cases())))
def test_uncarve(live: LiveHostd, case: Case) -> None:
    run(live, case)


@fuzz(FEW)
@given(rpc=st.sampled_from(["GetInventory", "Health", "GetHostInfo"]), who=st.sampled_from([READER, ADMIN]),
       unknown=unknown_fields())
def test_reads_without_fields(live: LiveHostd, rpc: str, who: str, unknown: bytes) -> None:
    run(live, Case(rpc, request_type(rpc)(), who=who, no_op=True, unknown=unknown))


@fuzz(FEW)
@given(last=st.one_of(st.sampled_from([0, 1, 900, 901, U32]), st.integers(0, U32)), unknown=unknown_fields())
def test_get_host_stats(live: LiveHostd, last: int, unknown: bytes) -> None:
    run(live, Case("GetHostStats", pb.GetHostStatsRequest(last=last), who=READER, no_op=True, unknown=unknown))


@fuzz(FEW)
@given(vm_id=VM_IDS, setup=st.sampled_from(["", "vm"]), unknown=unknown_fields())
def test_watch_events(live: LiveHostd, vm_id: str, setup: str, unknown: bytes) -> None:
    """A stream that ends at the caller's deadline answered rightly; any other end is checked."""
    run(live, Case("WatchEvents", pb.WatchEventsRequest(vm_id=vm_id), who=READER, setup=setup, no_op=True,
                   expect=frozenset({"OK", "INVALID_ARGUMENT"}), unknown=unknown))


@fuzz(EXAMPLES)
@given(case=with_unknown(reader_or(prepare_cases())))
def test_prepare_migration(live: LiveHostd, case: Case) -> None:
    run(live, case)


@fuzz(EXAMPLES)
@given(case=with_unknown(reader_or(migrate_cases())))
def test_migrate_vm(live: LiveHostd, case: Case) -> None:
    run(live, case)


@fuzz(EXAMPLES)
@given(case=with_unknown(reader_or(migration_ref_cases("CompleteMigration"))))
def test_complete_migration(live: LiveHostd, case: Case) -> None:
    run(live, case)


@fuzz(EXAMPLES)
@given(case=with_unknown(reader_or(migration_ref_cases("AbortMigration"))))
def test_abort_migration(live: LiveHostd, case: Case) -> None:
    run(live, case)


@fuzz(FEW)
@given(case=with_unknown(migration_ref_cases("GetMigration")))
def test_get_migration(live: LiveHostd, case: Case) -> None:
    run(live, case)
