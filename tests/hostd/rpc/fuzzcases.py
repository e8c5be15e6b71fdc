"""The cases test_rpc_fuzz.py runs: hypothesis strategies per RPC of api/hostd.proto,
each a request with at most one broken rule ("fault") and what answers it rightly.

Valid requests are built from the simulated host of fuzzhost.py (its VM CPUs 2-7, its
256 pages of 2 MiB, its images and the profiles of guestimages/profiles/); hostile ones
break one rule: names, ids and labels with NUL, newlines, `..`, `/`, XML metacharacters
or megabytes of text, oversized lists, numbers at their type's ends, one disk under two
names, requests from a certificate that may only read, fields the proto does not know,
policies with huge CPU ranges, deep nesting or a megabyte of text. Which status answers a
fault is hostd/README.md's rule: INVALID_ARGUMENT (hyb.spec.invalid and the codes of the
carve's own checks) for what the caller got wrong; where README leaves the order of checks
open (a request this host refuses anyway), either that or FAILED_PRECONDITION.

Requests carry placeholders, filled in when the case runs: "<vm>" (the VM made for the
case), "<name>" (its name), "<xml>" (a hostd domain XML of it, as PrepareMigration
answers), "<xml-other>" (the same with another UUID), "<ns>" (hostd's metadata namespace),
"<diskN>" and "<diskN:id>" (the host's assignable disks by kernel name and stable id),
"<carved>" (the digest the host carries)."""

from __future__ import annotations

import functools
import hashlib
import re
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

from fuzzhost import ADMIN, POLICY, READER, readme_bound, short
from google.protobuf.message import Message
from hypothesis import strategies as st

from api import hostd_pb2 as pb

PROFILES = sorted(p.stem for p in (Path(__file__).resolve().parents[3] / "guestimages/profiles").glob("*.toml"))
NAME_RE = re.compile(r"[a-zA-Z0-9_.-]{1,64}")  # api/hostd.proto's CreateVMRequest.name
U32, U64 = 2**32 - 1, 2**64 - 1
GRACE = readme_bound("grace_seconds")  # (least, most) where hostd/README.md bounds it
MESSAGE_MAX = 3_500_000  # a request stays below gRPC's 4 MiB: past it the transport refuses, not hostd

# ------------------------------------------------------------------ the case


@dataclass(frozen=True)
class Case:
    rpc: str
    request: Message
    fault: str = "valid"  # the one rule of the request it breaks ("valid": none)
    expect: frozenset[str] = frozenset({"OK"})  # statuses that answer it rightly
    code: str | None = None  # the hyb code the fault calls for, where README names one
    who: str = ADMIN
    setup: str = ""  # made first: "vm", "stopped", "prior" (a VM named fz-prior), "incoming", "carved"
    no_op: bool = False  # success must change nothing either
    unknown: bytes = b""  # fields the proto does not know, appended (a newer client's)

    def __repr__(self) -> str:
        extra = f", setup={self.setup}" if self.setup else ""
        extra += f", unknown fields={len(self.unknown)} bytes" if self.unknown else ""
        return f"Case({self.rpc} as {self.who}, fault={self.fault}{extra}: {short(self.request)})"


@functools.cache
def failure(rpc: str, fault: str, prop: str) -> type[AssertionError]:
    """One exception class per (RPC, fault, property): hypothesis tells failures apart by
    their type, and so reports each with its own minimal example."""
    return type(re.sub(r"\W", "_", f"{rpc}__{fault}__{prop}"), (AssertionError,), {})


def fail(case: Case, prop: str, why: str) -> AssertionError:
    return failure(case.rpc, case.fault, prop)(f"{prop}: {why}\n  {case!r}")


# ------------------------------------------------------------------ hostile values

NASTY = ["", ".", "..", "../etc", "a/b", "/", "fz-a\n", "\nfz-a", "fz-a\r", "fz\0a", "\0", "fz\ta", " fz-a",
         "fz-a ", "<x/>", "fz&a", "fz'a", 'fz"a', "]: x", "%s%n", "$(id)", "fz-é", "\u202efz", "\ufeff",
         "fz-a=b", "fz,a", "*", "-", "hyb.vm.refused: x", "\x1b[31m"]
HUGE = st.builds(lambda ch, n: ch * n, st.sampled_from(["a", "é", "\n", "<"]),
                 st.sampled_from([65, 201, 4096, 65536, 2**20]))
NASTY_TEXT = st.one_of(st.sampled_from(NASTY), HUGE,
                       st.text(st.characters(codec="utf-8", categories=["L", "N", "P", "S", "Z", "Cc"]), max_size=40))


def nasty(n: int) -> st.SearchStrategy[str]:
    """Hostile text for one of ``n`` list entries: megabytes only where there are few."""
    return NASTY_TEXT if n <= 2 else st.one_of(st.sampled_from(NASTY), st.text(max_size=20))


NAMES = st.from_regex(r"fz-[a-z0-9][a-z0-9_.-]{0,16}", fullmatch=True)


def text_kind(s: str) -> str:
    """Which rule a hostile string breaks, for telling failures apart."""
    if s in ("", ".", ".."):
        return {"": "empty", ".": "dot", "..": "dot"}[s]
    if any(ord(c) < 32 or ord(c) == 127 for c in s):
        return "control"
    if len(s) > 64:
        return "long"
    if "/" in s:
        return "slash"
    if any(c in s for c in "<>&'\""):
        return "xml"
    return "other"


def unknown_fields() -> st.SearchStrategy[bytes]:
    """Nothing, mostly; else a varint or a length-delimited field the proto lacks."""
    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
            n >>= 7
            if not n:
                return bytes(out)
    field_ = st.builds(lambda no, v: varint(no << 3) + varint(v), st.integers(100, 2**29 - 1), st.integers(0, U64))
    blob = st.builds(lambda no, b: varint(no << 3 | 2) + varint(len(b)) + b, st.integers(100, 2**29 - 1),
                     st.binary(max_size=64))
    return st.integers(0, 3).flatmap(lambda i: {2: field_, 3: blob}.get(i, st.just(b"")))


INVALID = frozenset({"INVALID_ARGUMENT"})
REFUSED = frozenset({"INVALID_ARGUMENT", "FAILED_PRECONDITION"})  # the caller's fault, or this host's
MISSING = frozenset({"NOT_FOUND", "INVALID_ARGUMENT"})  # no such VM, or not an id at all
FORBIDDEN = ("PERMISSION_DENIED", "hyb.rpc.forbidden")


def reader_or(cases: st.SearchStrategy[Case]) -> st.SearchStrategy[Case]:
    """Mostly the cases as drawn; one in six the same request from a certificate that may
    only read, which a mutating RPC must refuse with nothing changed. (The rarer choice is
    the larger number here and below: hypothesis draws small numbers more often.)"""
    def who(c: Case, n: int) -> Case:
        return c if n < 5 else replace(c, who=READER, fault="reader", expect=frozenset({FORBIDDEN[0]}),
                                   code=FORBIDDEN[1], no_op=False)
    return st.builds(who, cases, st.integers(0, 5))


def with_unknown(cases: st.SearchStrategy[Case]) -> st.SearchStrategy[Case]:
    """The cases, some with unknown fields appended; none past gRPC's message size."""
    return st.builds(lambda c, u: replace(c, unknown=u), cases, unknown_fields()).filter(
        lambda c: c.request.ByteSize() + len(c.unknown) < MESSAGE_MAX)


# ------------------------------------------------------------------ CreateVM


@st.composite
def create_vm_cases(draw) -> Case:  # type: ignore[no-untyped-def]
    name = draw(NAMES)
    r = pb.CreateVMRequest(request_id="req-" + name, name=name, vcpus=draw(st.integers(1, 3)),
                           memory_mib=2 * draw(st.integers(1, 128)), image=draw(st.sampled_from(["smoke", "disky"])),
                           hugepage_size_kb=draw(st.sampled_from([0, 2048])),
                           profile=draw(st.sampled_from(["", *PROFILES])), guest_numa=draw(st.booleans()),
                           labels=draw(st.dictionaries(st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True),
                                                       st.from_regex(r"[a-z0-9-]{0,12}", fullmatch=True), max_size=3)))
    if draw(st.booleans()):
        r.placement.numa_node = 0
        r.placement.cpus.extend(draw(st.lists(st.integers(2, 7), max_size=r.vcpus, unique=True)))
    fault = draw(st.sampled_from(["valid", "valid", "valid", "retry", "name", "request_id", "labels", "image",
                                  "profile", "numbers", "placement", "disks", "disk_twice", "vfs", "reused_id",
                                  "reused_name"]))
    case = Case("CreateVM", r, fault)
    if fault == "retry":  # the same request again: the same VM, nothing new
        return replace(case, setup="prior", no_op=True, request=prior_request())
    if fault == "name":
        r.name = draw(NASTY_TEXT.filter(lambda s: not NAME_RE.fullmatch(s) or s in (".", "..")))
        return replace(case, fault=f"name:{text_kind(r.name)}", expect=INVALID, code="hyb.spec.invalid")
    if fault == "request_id":
        r.request_id = draw(st.one_of(st.sampled_from(["", "\0", "r\0", "r\n", "\nr", "r\x1b"]), HUGE.filter(
            lambda s: len(s) > 256)))
        return replace(case, fault=f"request_id:{text_kind(r.request_id)}", expect=INVALID, code="hyb.spec.invalid")
    if fault == "labels":
        kind, labels = draw(st.one_of(
            st.tuples(st.just("control"), st.dictionaries(st.sampled_from(["a\n", "\0", "t\x1b"]), st.just("v"),
                                                          min_size=1)),
            st.tuples(st.just("control"), st.fixed_dictionaries({"tenant": st.sampled_from(["a\n", "\0b"])})),
            st.tuples(st.just("huge"), st.fixed_dictionaries({"k": HUGE.filter(lambda s: len(s) > 4000)})),
            st.tuples(st.just("huge"), HUGE.filter(lambda s: len(s) > 4000).map(lambda s: {s: "v"})),
            st.tuples(st.just("many"), st.sampled_from([1000, 20000]).map(lambda n: {f"k{i}": "v" for i in range(n)})),
            st.tuples(st.just("empty_key"), st.just({"": "v"}))))
        r.labels.clear()
        r.labels.update(labels)
        return replace(case, fault=f"labels:{kind}", expect=INVALID, code="hyb.spec.invalid")
    if fault == "image":
        r.image = draw(st.one_of(st.sampled_from(["nope", "SMOKE", "smoke/..", "../images/smoke"]), NASTY_TEXT))
        return replace(case, expect=INVALID) if r.image else replace(case, expect=INVALID, code="hyb.spec.invalid")
    if fault == "profile":
        r.profile = draw(st.one_of(st.just("no-such-profile"), NASTY_TEXT.filter(lambda s: s != "")))
        if NAME_RE.fullmatch(r.profile):
            return replace(case, fault="profile:unknown", expect=INVALID, code="hyb.guest_profile.unknown")
        return replace(case, fault="profile:malformed", expect=INVALID)
    if fault == "numbers":
        which = draw(st.sampled_from(["vcpus", "memory_mib", "hugepage_size_kb"]))
        bound = U64 if which == "memory_mib" else U32
        setattr(r, which, draw(st.one_of(st.sampled_from([0, 1, 3, 4096, bound, bound - 1]), st.integers(0, bound))))
        if 1 <= r.vcpus <= 3 and r.hugepage_size_kb in (0, 2048) and 2 <= r.memory_mib <= 256 and \
                r.memory_mib % 2 == 0:
            return replace(case, fault="valid")  # drew a valid value after all
        return replace(case, fault=f"numbers:{which}", expect=REFUSED)
    if fault == "placement":  # the scheduler's choice: a node and CPUs (a preference) or NUMA cells
        kind = draw(st.sampled_from(["node", "cpu_ids", "many", "preference", "cells"]))
        del r.placement.cpus[:]
        r.placement.numa_node = 0
        if kind == "node":  # no such node here, or no node id at all
            r.placement.numa_node = draw(st.sampled_from([1, -1, 2**31 - 1, -(2**31)]))
        elif kind == "cpu_ids":  # past any kernel's CPU ids
            r.placement.cpus.extend(draw(st.lists(st.sampled_from([8192, 2**31, U32]), min_size=1, max_size=3)))
        elif kind == "many":
            r.placement.cpus.extend([2] * draw(st.sampled_from([8193, 100000])))
        elif kind == "preference":  # CPUs that are not the VM's to have: hostd may take others, or refuse
            r.placement.cpus.extend(draw(st.lists(st.sampled_from([0, 1, 8, 64]), min_size=1, max_size=4)))
            return replace(case, fault="placement:preference", expect=REFUSED | {"OK"})
        else:  # cells that do not add up to the VM, or name no node
            r.placement.cells.add(numa_node=draw(st.sampled_from([0, 1, -1])), cpus=[2] * draw(st.integers(0, 4)),
                                  memory_mib=draw(st.sampled_from([0, 2, 3, U64])))
            if (len(r.placement.cells[0].cpus), r.placement.cells[0].memory_mib, r.placement.cells[0].numa_node) \
                    == (r.vcpus, r.memory_mib, 0):
                return replace(case, fault="valid")
        return replace(case, fault=f"placement:{kind}", expect=REFUSED)
    if fault == "disks":
        n = draw(st.sampled_from([1, 2, 33, 1000]))
        for _ in range(n):
            d = r.disks.add(disk=draw(st.one_of(st.sampled_from(["<disk0>", "<disk0:id>", "nvme0n1", "nvme2n1",
                                                                  "sda"]), nasty(n))))
            d.iotune.total_bytes_sec = draw(st.sampled_from([0, 10**6, U64]))
            d.iotune.total_iops_sec = draw(st.sampled_from([0, 100, U64]))
            d.iotune.read_bytes_sec = draw(st.sampled_from([0, 0, 10**6]))
            d.iotune.total_bytes_sec_max_length = draw(st.sampled_from([0, 0, U64]))
            d.iotune.group_name = draw(st.one_of(st.just(""), st.just(""), nasty(n)))
        # A disk VM cannot start on the tree (no device node to hold, hostd's designer
        # refuses), so even a well-formed disk request is refused, with nothing changed.
        return replace(case, expect=REFUSED)
    if fault == "disk_twice":  # one disk by its name and by its stable id: one VM may not claim it twice
        for ref in draw(st.permutations(["<disk0>", "<disk0:id>"])):
            r.disks.add(disk=ref, iotune=pb.IoTune(total_bytes_sec=10**6, total_iops_sec=100))
        return replace(case, expect=REFUSED)
    if fault == "vfs":
        n = draw(st.sampled_from([1, 2, 17, 64]))
        for _ in range(n):
            r.vfs.add(pf=draw(st.one_of(st.sampled_from(["", "enp1s0f0np0"]), nasty(n))),
                      mac=draw(st.one_of(st.sampled_from(["", "52:54:00:00:00:01", "ZZ:ZZ", "FF:FF:FF:FF:FF:FF"]),
                                         nasty(n))),
                      vlan=draw(st.sampled_from([0, 4094, 4095, U32])),
                      max_tx_rate_mbps=draw(st.sampled_from([0, 100, U32])),
                      min_tx_rate_mbps=draw(st.sampled_from([0, 10, U32])))
        return replace(case, expect=REFUSED)  # VF rates need netlink, which a host tree has not got
    if fault == "reused_id":  # fz-prior's request id, another spec
        r.request_id = "req-fz-prior"
        return replace(case, setup="prior", expect=frozenset({"ALREADY_EXISTS"}), code="hyb.vm.conflict")
    if fault == "reused_name":
        r.name = "fz-prior"
        return replace(case, setup="prior", expect=frozenset({"ALREADY_EXISTS"}), code="hyb.vm.conflict")
    return case


def prior_request() -> pb.CreateVMRequest:
    return pb.CreateVMRequest(request_id="req-fz-prior", name="fz-prior", vcpus=1, memory_mib=128, image="disky",
                              labels={"tenant": "fz"})


# ------------------------------------------------------------------ the VM RPCs

OTHER_IDS = st.one_of(st.sampled_from(["00000000-0000-0000-0000-000000000000", "<vm>\n", "<vm>\0"]), NASTY_TEXT)
VM_IDS = st.integers(0, 3).flatmap(lambda i: OTHER_IDS if i == 3 else st.just("<vm>"))  # the case's VM, mostly


def vm_ref_case(rpc: str, make, setup: st.SearchStrategy[str]) -> st.SearchStrategy[Case]:  # type: ignore[no-untyped-def]
    """A case of an RPC that names a VM: the case's own VM ("<vm>") or an id of none,
    and a grace period (DeleteVM, StopVM) within its bound or past it."""
    def build(vm_id: str, s: str, grace: int) -> Case:
        req = make(vm_id, grace)
        if vm_id != "<vm>":
            return Case(rpc, req, fault=f"vm_id:{text_kind(vm_id)}", expect=MISSING, setup=s)
        if GRACE and grace > GRACE[1] and "grace_seconds" in req.DESCRIPTOR.fields_by_name:
            return Case(rpc, req, fault="grace_seconds", expect=INVALID, code="hyb.spec.invalid", setup=s)
        return Case(rpc, req, setup=s)
    ends = [GRACE[1], GRACE[1] + 1] if GRACE else []
    return st.builds(build, VM_IDS, setup, st.sampled_from([0, 1, 5, *ends, U32]))


def delete_cases() -> st.SearchStrategy[Case]:
    return vm_ref_case("DeleteVM", lambda v, g: pb.DeleteVMRequest(vm_id=v, grace_seconds=g), st.just("vm"))


def stop_cases() -> st.SearchStrategy[Case]:
    return vm_ref_case("StopVM", lambda v, g: pb.StopVMRequest(vm_id=v, grace_seconds=g), st.just("vm"))


def start_cases() -> st.SearchStrategy[Case]:
    # Starting a running VM is a no-op: nothing may change.
    return vm_ref_case("StartVM", lambda v, g: pb.VMRef(vm_id=v), st.sampled_from(["vm", "stopped"])).map(
        lambda c: replace(c, no_op=c.setup == "vm"))


def get_vm_cases() -> st.SearchStrategy[Case]:
    def read(c: Case) -> Case:
        c = replace(c, who=READER, no_op=True)
        if c.fault == "valid" and not c.setup:  # "<vm>" is a well-formed id of no VM then
            return replace(c, fault="vm_id:none_here", expect=frozenset({"NOT_FOUND"}), code="hyb.vm.not_found")
        return c
    return vm_ref_case("GetVM", lambda v, g: pb.GetVMRequest(vm_id=v), st.sampled_from(["", "vm"])).map(read)


@st.composite
def update_io_cases(draw) -> Case:  # type: ignore[no-untyped-def]
    r = pb.UpdateIOLimitsRequest(vm_id="<vm>")
    fault = draw(st.sampled_from(["empty", "disks", "group_name", "vfs", "vm_id"]))
    if fault == "empty":  # asks for no change: the ledger must not be rewritten
        return Case("UpdateIOLimits", r, setup="vm", no_op=True)
    if fault == "vm_id":
        r.vm_id = draw(OTHER_IDS)
        return Case("UpdateIOLimits", r, fault=f"vm_id:{text_kind(r.vm_id)}", setup="vm", expect=MISSING)
    if fault in ("disks", "group_name"):
        n = draw(st.sampled_from([1, 2, 33, 1000]))
        for _ in range(n):
            d = r.disks.add(disk=draw(st.one_of(st.sampled_from(["<disk0>", "<disk0:id>", "<disk1>"]), nasty(n))))
            d.iotune.total_bytes_sec = draw(st.sampled_from([0, 10**6, U64]))
            d.iotune.total_iops_sec = draw(st.sampled_from([0, 100, U64]))
            d.iotune.total_iops_sec_max = draw(st.sampled_from([0, 50, U64]))
            if fault == "group_name":
                d.iotune.group_name = draw(nasty(n).filter(lambda s: not NAME_RE.fullmatch(s)))
        # The case's VM has no disk (a disk VM cannot start on the tree): every disk change is refused.
        return Case("UpdateIOLimits", r, fault=fault, setup="vm", expect=REFUSED)
    n = draw(st.sampled_from([1, 3, 17, 1000]))
    for _ in range(n):
        r.vfs.add(vf_pci=draw(st.one_of(st.sampled_from(["0000:01:02.0", "enp1s0f0np0:0"]), nasty(n))),
                  max_tx_rate_mbps=draw(st.sampled_from([0, 100, U32])), min_tx_rate_mbps=draw(st.sampled_from([0, U32])))
    return Case("UpdateIOLimits", r, fault="vfs", setup="vm", expect=REFUSED)


@st.composite
def list_vms_cases(draw) -> Case:  # type: ignore[no-untyped-def]
    sel = draw(st.one_of(st.sampled_from(["", "tenant=fz", "tenant=", "=", "a=b=c", ",,,", "tenant"]), NASTY_TEXT))
    # A selector is "k=v[,k=v]": one that is not may be refused; one that is must answer.
    ok = all(re.fullmatch(r"[a-z0-9-]+=[a-z0-9-]*", kv) for kv in sel.split(",")) if sel else True
    return Case("ListVMs", pb.ListVMsRequest(label_selector=sel), fault="valid" if ok else f"selector:{text_kind(sel)}",
                expect=frozenset({"OK"}) if ok else frozenset({"OK", "INVALID_ARGUMENT"}), who=READER,
                setup=draw(st.sampled_from(["", "prior"])), no_op=True)


# ------------------------------------------------------------------ live migration

MOVED_ID = "6f1c0a5e-7e57-4f00-8000-000000000001"  # the source's id of the VM PrepareMigration takes in
NAMES_OF_NONE = st.one_of(st.just("fz-none"), NASTY_TEXT)
# Hostile domain XML for MigrateVM: no XML, entity expansion, no metadata, hostd's
# metadata element without its fields, another VM's UUID.
BAD_XML = st.one_of(
    st.sampled_from(["", "<domain", "<domain/>", "<domain><metadata/></domain>",
                     '<!DOCTYPE d [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">'
                     '<!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;"><!ENTITY d "&c;&c;&c;&c;&c;&c;&c;&c;&c;&c;">'
                     '<!ENTITY e "&d;&d;&d;&d;&d;&d;&d;&d;&d;&d;"><!ENTITY f "&e;&e;&e;&e;&e;&e;&e;&e;&e;&e;">]>'
                     "<domain>&f;&f;&f;&f;&f;&f;&f;&f;&f;&f;</domain>",
                     "<domain><uuid><vm>-x</uuid><metadata><hyb:vm xmlns:hyb='<ns>'/></metadata></domain>",
                     "<domain><uuid><vm></uuid><metadata><hyb:vm xmlns:hyb='<ns>'><hyb:vm-id><vm></hyb:vm-id>"
                     "<hyb:request-id>r</hyb:request-id><hyb:claim>{}</hyb:claim><hyb:spec>[]</hyb:spec>"
                     "</hyb:vm></metadata></domain>",
                     "<xml-other>"]),
    NASTY_TEXT)


def _is_uuid(v: str) -> bool:
    try:
        uuid.UUID(v)
    except ValueError:
        return False
    return True


@st.composite
def prepare_cases(draw) -> Case:  # type: ignore[no-untyped-def]
    r = pb.PrepareMigrationRequest(request_id="mig-fz-1", vm_id=MOVED_ID, source_host="fz-source", vm=pb.CreateVMRequest(
        request_id="req-fz-moved", name="fz-moved", vcpus=1, memory_mib=128,
        image=draw(st.sampled_from(["smoke", "disky"])), labels={"tenant": "fz"}))
    vm = r.vm  # a reference: a message given to a constructor is copied
    fault = draw(st.sampled_from(["valid", "valid", "vm_id", "source_disks", "vm_name", "vm_labels", "vm_here",
                                  "disks", "request_id", "source_host"]))
    case = Case("PrepareMigration", r, fault)
    if fault == "vm_id":
        r.vm_id = draw(OTHER_IDS.filter(lambda v: not _is_uuid(v)))
        return replace(case, fault=f"vm_id:{text_kind(r.vm_id)}", expect=INVALID, code="hyb.spec.invalid")
    if fault == "source_disks":  # one per VM disk, and this VM has none
        r.source_disks.add(disk="nvme9n1", size_bytes=2**30)
        return replace(case, expect=INVALID, code="hyb.spec.invalid")
    if fault == "vm_name":
        vm.name = draw(NASTY_TEXT.filter(lambda s: not NAME_RE.fullmatch(s) or s in (".", "..")))
        return replace(case, fault=f"vm_name:{text_kind(vm.name)}", expect=INVALID, code="hyb.spec.invalid")
    if fault == "vm_labels":
        vm.labels.update(draw(st.sampled_from([{"t": "a\n"}, {"k": "v" * 4096}, {f"k{i}": "v" for i in range(100)}])))
        return replace(case, expect=INVALID, code="hyb.spec.invalid")
    if fault == "vm_here":  # the id of a VM this host runs
        r.vm_id = "<vm>"
        return replace(case, setup="vm", expect=frozenset({"ALREADY_EXISTS"}), code="hyb.vm.conflict")
    if fault == "disks":  # a disk VM cannot start on the tree: refused, whichever disk it picks
        vm.disks.add(disk="nvme9n1", iotune=pb.IoTune(total_bytes_sec=10**6, total_iops_sec=100))
        r.source_disks.add(disk="nvme9n1", size_bytes=draw(st.sampled_from([1000204886016, 1, 2**30, U64])),
                           serial=draw(st.sampled_from(["", "serial-1"])))
        return replace(case, expect=REFUSED)
    if fault == "request_id":  # the migration's idempotency key: a request_id as CreateVM's
        r.request_id = draw(st.one_of(st.sampled_from(["", "m\0", "m\n"]), HUGE.filter(lambda t: len(t) > 128)))
        return replace(case, fault=f"request_id:{text_kind(r.request_id)}", expect=INVALID)
    if fault == "source_host":  # recorded as the VM's reason: no bound of its own in hostd/README.md
        r.source_host = draw(NASTY_TEXT)
        return replace(case, fault=f"source_host:{text_kind(r.source_host)}", expect=INVALID | {"OK"})
    return case


@st.composite
def migrate_cases(draw) -> Case:  # type: ignore[no-untyped-def]
    """The source's MigrateVM of the case's VM to this test driver, which cannot migrate:
    every attempt fails, and "the VM still runs here, unchanged in the ledger" (api/hostd.proto)."""
    r = pb.MigrateVMRequest(name="<name>", target_uri="test:///default", domain_xml="<xml>")
    fault = draw(st.sampled_from(["valid", "name", "target_uri", "domain_xml", "postcopy", "on_timeout", "numbers",
                                  "migrate_disks", "stopped"]))
    case = Case("MigrateVM", r, fault, frozenset({"ABORTED"}), "hyb.migration.failed", setup="vm")
    if fault == "name":
        r.name = draw(NAMES_OF_NONE)
        return replace(case, fault=f"name:{text_kind(r.name)}", expect=MISSING, code=None)
    if fault == "target_uri":
        r.target_uri = ""
        return replace(case, expect=INVALID, code="hyb.spec.invalid")
    if fault == "domain_xml":
        r.domain_xml = draw(BAD_XML)
        return replace(case, expect=INVALID, code="hyb.spec.invalid")
    if fault == "postcopy":
        r.on_timeout = pb.ON_TIMEOUT_POSTCOPY
        return replace(case, expect=frozenset({"UNIMPLEMENTED"}), code="hyb.migration.postcopy_unsupported")
    if fault == "on_timeout":  # a value the enum does not have (a newer client's)
        r.on_timeout = draw(st.sampled_from([2, 7, 2**31 - 1, -1]))
        return replace(case, expect=frozenset({"ABORTED", "INVALID_ARGUMENT"}), code=None)
    if fault == "numbers":
        r.bandwidth_mib_s, r.max_downtime_ms, r.timeout_s = (draw(st.sampled_from([0, 1, U32])) for _ in range(3))
        return replace(case, expect=frozenset({"ABORTED", "INVALID_ARGUMENT"}), code=None)
    if fault == "migrate_disks":
        r.migrate_disks.extend(draw(st.lists(nasty(3), min_size=1, max_size=40)))
        return replace(case, expect=frozenset({"ABORTED", "INVALID_ARGUMENT"}), code=None)
    if fault == "stopped":
        return replace(case, setup="stopped", expect=frozenset({"FAILED_PRECONDITION"}),
                       code="hyb.migration.not_running")
    return case


def migration_ref_cases(rpc: str) -> st.SearchStrategy[Case]:
    """CompleteMigration, AbortMigration, GetMigration: by VM name, for a VM incoming here
    (prepared), one running here, or none."""
    answers = {  # (rpc, setup) -> (expect, code, no_op)
        ("CompleteMigration", "incoming"): ({"FAILED_PRECONDITION"}, "hyb.migration.not_arrived", False),
        ("CompleteMigration", "vm"): ({"OK"}, None, True),  # a running VM: answered as a retry
        ("AbortMigration", "incoming"): ({"OK"}, None, False),
        ("AbortMigration", "vm"): ({"FAILED_PRECONDITION"}, "hyb.migration.not_incoming", False),
        ("GetMigration", "incoming"): ({"OK"}, None, True),
        ("GetMigration", "vm"): ({"OK"}, None, True),
    }

    def build(name: str, setup: str) -> Case:
        who = READER if rpc == "GetMigration" else ADMIN
        if name == "<name>":
            expect, code, no_op = answers[(rpc, setup)]
            return Case(rpc, pb.MigrationRef(name=name), expect=frozenset(expect), code=code, setup=setup,
                        no_op=no_op, who=who)
        # AbortMigration: "an unknown name answers success" (a malformed one may be refused)
        expect = frozenset({"OK", "INVALID_ARGUMENT"}) if rpc == "AbortMigration" else MISSING
        return Case(rpc, pb.MigrationRef(name=name), fault=f"name:{text_kind(name)}", expect=expect, setup=setup,
                    no_op=True, who=who)
    return st.builds(build, st.one_of(st.just("<name>"), st.just("<name>"), NAMES_OF_NONE),
                     st.sampled_from(["incoming", "vm"]))


# ------------------------------------------------------------------ policies: PlanCarve, Carve, Uncarve


def policy(io: int = 2, pages: int = 256) -> str:
    return POLICY.replace("cpus_per_node = 2", f"cpus_per_node = {io}").replace(
        "count_per_node = 256", f"count_per_node = {pages}")


VALID_POLICIES = st.one_of(st.just(POLICY), st.builds(policy, st.integers(0, 3), st.sampled_from([0, 64, 512])))
HOSTILE_POLICIES = st.one_of(
    st.tuples(st.just("cpus_range"), st.sampled_from(["0-4294967296", "0-4294967295", "0-99999999999999999999",
                                                      "0-2147483648", "4294967290-4294967296", "0-1000000",
                                                      "0-1,0-1,0-1", "1-0", "-1", "0--5", "0-"]).map(
        lambda c: POLICY.replace("cpus_per_node = 2", f'cpus = "{c}"'))),
    st.tuples(st.just("nesting"), st.builds(lambda kind, n: {
        "array": "x = " + "[" * n + "]" * n, "inline": "x = " + "{a = " * n + "1" + "}" * n,
        "dotted": "x" + ".a" * n + " = 1", "header": "[" + ".".join(["a"] * n) + "]",
        "array_open": "x = " + "[" * n}[kind], st.sampled_from(["array", "inline", "dotted", "header", "array_open"]),
        st.sampled_from([100, 1000, 10000, 100000]))),
    st.tuples(st.just("huge"), st.sampled_from([10**5, 10**6]).map(
        lambda n: POLICY + "".join(f"# {'x' * 60}\n" for _ in range(n // 63)))),
    st.tuples(st.just("huge"), st.sampled_from([10**4, 10**5]).map(
        lambda n: POLICY + "[disks.budget]\n" + "".join(f'd{i} = {{ bytes_sec = 1 }}\n' for i in range(n)))),
    st.tuples(st.just("values"), st.sampled_from([
        "cpus_per_node = -1", "cpus_per_node = 1e309", "cpus_per_node = 99999999999999999999999",
        'cpus_per_node = "2"', "cpus_per_node = nan", "cpus_per_node = 2\ncpus_per_node = 3"]).map(
        lambda v: POLICY.replace("cpus_per_node = 2", v))),
    st.tuples(st.just("values"), st.sampled_from(["count_per_node = -1", "count_per_node = 18446744073709551616",
                                                  'size = "3M"', 'size = "0"', "count_per_node = 1e30"]).map(
        lambda v: POLICY.replace("count_per_node = 256", v) if "count" in v else POLICY.replace('size = "2M"', v))),
    st.tuples(st.just("syntax"), st.one_of(st.sampled_from(["[", "x = ", "\0", "[io_service", "a = 'b", "= 1",
                                                            "[io_service]\n[io_service]"]), NASTY_TEXT)),
)


@st.composite
def plan_cases(draw) -> Case:  # type: ignore[no-untyped-def]
    who = draw(st.sampled_from([READER, READER, ADMIN]))
    if draw(st.booleans()):
        return Case("PlanCarve", pb.PlanCarveRequest(policy_toml=draw(st.one_of(st.just(""), VALID_POLICIES))),
                    who=who, no_op=True)
    kind, text = draw(HOSTILE_POLICIES)
    # A policy that parses may still not fit (answered, not refused): OK or hyb.policy.invalid.
    return Case("PlanCarve", pb.PlanCarveRequest(policy_toml=text), fault=f"policy:{kind}",
                expect=frozenset({"OK", "INVALID_ARGUMENT"}), who=who, no_op=True)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


OPERATION_FAULTS = st.one_of(st.sampled_from(["", "a b", "op\n", "op\0", "\x7f", "é"]), HUGE.filter(lambda s: len(s) > 200))


@st.composite
def carve_cases(draw) -> Case:  # type: ignore[no-untyped-def]
    text = draw(st.sampled_from([POLICY, policy(2, 512)]))
    r = pb.CarveRequest(policy_toml=text, policy_digest=sha(text), expected_digest="", operation_id="fuzz/carve-1")
    fault = draw(st.sampled_from(["valid", "valid", "policy", "nofit", "digest", "digest_malformed", "expected_unset",
                                  "expected_wrong", "expected_malformed", "operation_id"]))
    case = Case("Carve", r, fault)
    if fault == "policy":
        kind, r.policy_toml = draw(HOSTILE_POLICIES)
        r.policy_digest = sha(r.policy_toml)
        # Some hostile texts are policies after all (and fit): carved, then undone.
        return replace(case, fault=f"policy:{kind}", expect=REFUSED | {"OK"})
    if fault == "nofit":  # 9 IO CPUs of 8
        r.policy_toml = policy(9)
        r.policy_digest = sha(r.policy_toml)
        return replace(case, expect=frozenset({"FAILED_PRECONDITION"}), code="hyb.carve.nofit")
    if fault == "digest":  # a digest, of another text
        r.policy_digest = sha(text + " ")
        return replace(case, expect=INVALID, code="hyb.policy.digest_mismatch")
    if fault == "digest_malformed":
        r.policy_digest = draw(st.one_of(st.just(""), st.just(sha(text).upper()), NASTY_TEXT))
        return replace(case, expect=INVALID)
    if fault == "expected_unset":
        r.ClearField("expected_digest")
        return replace(case, expect=INVALID, code="hyb.carve.request_invalid")
    if fault == "expected_wrong":  # well formed, not what the host carries ("": uncarved)
        r.expected_digest = sha("another policy")
        return replace(case, expect=frozenset({"ABORTED"}), code="hyb.carve.conflict")
    if fault == "expected_malformed":
        r.expected_digest = draw(NASTY_TEXT.filter(lambda s: s != ""))
        return replace(case, expect=INVALID, code="hyb.carve.request_invalid")
    if fault == "operation_id":
        r.operation_id = draw(OPERATION_FAULTS)
        return replace(case, fault=f"operation_id:{text_kind(r.operation_id)}", expect=INVALID,
                       code="hyb.carve.request_invalid")
    return case


@st.composite
def uncarve_cases(draw) -> Case:  # type: ignore[no-untyped-def]
    setup = draw(st.sampled_from(["", "carved", "vm"]))
    r = pb.UncarveRequest(drained=draw(st.booleans()), expected_digest="<carved>", operation_id="fuzz/uncarve-1")
    fault = "valid" if setup == "vm" else draw(st.sampled_from(
        ["valid", "valid", "expected_unset", "expected_wrong", "expected_malformed", "operation_id"]))
    # Uncarving an uncarved host changes nothing; a running VM refuses the uncarve (nothing changed either).
    case = Case("Uncarve", r, fault, no_op=setup != "carved", setup=setup,
                expect=frozenset({"OK", "FAILED_PRECONDITION"}) if setup == "vm" else frozenset({"OK"}))
    if fault == "expected_unset":
        r.ClearField("expected_digest")
        return replace(case, expect=INVALID, code="hyb.carve.request_invalid")
    if fault == "expected_wrong":  # an uncarved host "changes nothing either way" (hostd/README.md)
        r.expected_digest = sha("another policy")
        if setup == "carved":
            return replace(case, expect=frozenset({"ABORTED"}), code="hyb.carve.conflict")
        return replace(case, expect=frozenset({"OK", "ABORTED"}), code="hyb.carve.conflict")
    if fault == "expected_malformed":
        r.expected_digest = draw(NASTY_TEXT.filter(lambda s: s != ""))
        return replace(case, expect=INVALID, code="hyb.carve.request_invalid")
    if fault == "operation_id":
        r.operation_id = draw(OPERATION_FAULTS)
        return replace(case, fault=f"operation_id:{text_kind(r.operation_id)}", expect=INVALID,
                       code="hyb.carve.request_invalid")
    return case
