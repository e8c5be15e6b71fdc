"""Bounds on what a caller may send: one home for the limits on every field that reaches
hostd from outside, over gRPC or through the scheduler's REST API, so a value one side
accepts the other never refuses.

hostd checks a request against them before it looks anything up, claims, writes or
calls libvirt (``hostd/carve/vmspec.py`` for VM requests, ``hostd/carve/policy.py`` for
policies, ``hostd/cpulist.py`` for CPU lists); the scheduler's schemas call the same
functions (``scheduler/schemas/vms.py``). Each check raises ``ValueError`` saying what is
wrong, quoting at most a short prefix of the value (a refusal never echoes 4 MB back).
The table of bounds, with the reason for each: hostd/README.md, "Bounds on what callers
send".
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from api.states import VfMigration

# CPU ids: the kernel's NR_CPUS (CONFIG_NR_CPUS is at most 8192 on x86_64, Debian's
# value); a CPU list naming CPU 8192 or more cannot be a host's, and is refused before
# a range is expanded.
MAX_CPUS = 8192
# NUMA node ids: the kernel's MAX_NUMNODES (NODES_SHIFT 10 on x86_64).
MAX_NUMA_NODES = 1024

VM_NAME_MAX = 64
_VM_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
# The scheduler names a VM on its host "<its name>-<8 hex of its id>": its own VM names
# are shorter by that suffix, so every name it sends fits VM_NAME_MAX.
SCHEDULER_NAME_SUFFIX = 9
_REQUEST_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_VM_ID = re.compile(r"[A-Za-z0-9-]{1,64}")  # hostd's ids are libvirt UUIDs
_IMAGE = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")  # what `hostd image add` accepts
_PROFILE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_DISK_REF = re.compile(r"[\x21-\x7e]{1,128}")  # a kernel name or a /dev/disk/by-id name
_PF = re.compile(r"[A-Za-z0-9_.@-]{1,15}")  # a netdev name: IFNAMSIZ - 1 bytes
_VF_REF = re.compile(r"[A-Za-z0-9_.:@-]{1,32}")  # a VF's PCI address or "<pf>:<index>"
_GROUP_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
DISKS_MAX = 32
# The atomic-write unit a VM disk may ask for (issue #41): a power of two from one 512 B
# sector up to 1 MiB (more than any NVMe power-fail unit we know of; InnoDB pages are
# 4-64 KiB). 0 = no atomic writes asked for.
ATOMIC_WRITE_MIN_BYTES = 512
ATOMIC_WRITE_MAX_BYTES = 1 << 20
VFS_MAX = 16
VCPUS_MAX = MAX_CPUS  # one host CPU per vCPU
MEMORY_MIB_MAX = 2**32  # 4 PiB: the ledger's page counts stay 64-bit

# Labels: a VM carries them in every ListVMs/GetVM answer and in its domain's metadata,
# so their size is bounded per VM (a host answering ListVMs for its VMs stays far below
# gRPC's 4 MB message limit).
_LABEL_KEY = re.compile(r"[A-Za-z0-9_./-]{1,63}")
LABEL_VALUE_MAX = 255
LABELS_MAX = 48
LABELS_BYTES_MAX = 4096  # keys and values, UTF-8
# What the scheduler adds to every VM (hyb.vm, hyb.tenant, hyb.name: under 160 bytes);
# a user's labels leave this much room.
SCHEDULER_LABELS = 3
SCHEDULER_LABELS_BYTES = 256
USER_LABELS_MAX = 32
USER_LABELS_BYTES_MAX = LABELS_BYTES_MAX - SCHEDULER_LABELS_BYTES
LABEL_SELECTOR_MAX = 2 * LABELS_BYTES_MAX

# What a hostd registers with the scheduler, from its config (checked when hostd loads
# it, as the scheduler checks the registration): a host's name, rack and labels.
HOST_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
_HOST_NAME = re.compile(HOST_NAME)
RACK_MAX = 64
HOST_LABELS_MAX = 32

# Block throttles: QEMU's THROTTLE_VALUE_MAX bounds every rate and burst, and a burst
# (rate x seconds) too; libvirt refuses a burst without its base rate.
IOTUNE_VALUE_MAX = 10**15
IOTUNE_FAMILIES = (("total_bytes_sec", "total_bytes_sec_max", "total_bytes_sec_max_length"),
                   ("total_iops_sec", "total_iops_sec_max", "total_iops_sec_max_length"))

# Carve and Uncarve: what the change is called (recorded with the carve, compared on a
# retry) and the digest it replaces.
_OPERATION_ID = re.compile(r"[\x21-\x7e]{1,200}")  # printable ASCII, no spaces
OPERATION_ID_RULE = ("1-200 printable characters without spaces, naming the change "
                     "(e.g. rollout/<name>/<host>/carve)")
_DIGEST = re.compile(r"(|[0-9a-f]{64})")  # api/policy.py's sha256 hex, or "" (uncarved)

# A VM's ACPI shutdown waits at most this long before the domain is destroyed.
GRACE_SECONDS_MAX = 300

# A carve policy in a request: its size, and how deep tables, arrays and dotted keys
# nest (a real policy nests 5 deep: hugepages.pools[].nodes[]). Checked on the text
# before a parser recurses into it.
POLICY_BYTES_MAX = 64 * 1024
POLICY_DEPTH_MAX = 8
_INT64 = (-(2**63), 2**63 - 1)  # TOML's integers


def _quote(v: str) -> str:
    return repr(v[:40] + "...") if len(v) > 40 else repr(v)


def _fullmatch(rx: re.Pattern[str], v: str, what: str) -> str:
    if not isinstance(v, str) or not rx.fullmatch(v):
        raise ValueError(f"{_quote(str(v))} is not {what}")
    return v


def check_vm_name(v: str) -> str:
    """A libvirt domain name and a directory under ``<state_dir>/vms``."""
    _fullmatch(_VM_NAME, v, f"1-{VM_NAME_MAX} of letters, digits, '_', '.', '-'")
    if v in (".", ".."):
        raise ValueError(f"{v!r} names a directory, not a VM")
    return v


def check_request_id(v: str) -> str:
    return _fullmatch(_REQUEST_ID, v, "1-128 of letters, digits, '_', '.', ':', '-'")


def check_vm_id(v: str) -> str:
    return _fullmatch(_VM_ID, v, "a VM id (1-64 of letters, digits, '-')")


def check_image(v: str) -> str:
    return _fullmatch(_IMAGE, v, "an image name (1-64 of a-z, 0-9, '_', '.', '-', starting with a-z or 0-9)")


def check_profile(v: str) -> str:
    return v if v == "" else _fullmatch(_PROFILE, v, "a profile name (1-64 of letters, digits, '_', '.', '-')")


def check_disk_ref(v: str) -> str:
    return _fullmatch(_DISK_REF, v, "a disk's kernel name or stable id (1-128 printable characters)")


def check_pf(v: str) -> str:
    return v if v == "" else _fullmatch(_PF, v, "a PF netdev name (1-15 of letters, digits, '_', '.', '@', '-')")


def check_vf_migration(v: str) -> str:
    """A VF's live-move mode: one of ``api.states.VfMigration``."""
    if v not in set(VfMigration):
        raise ValueError(f"{v!r} is not one of {', '.join(VfMigration)}")
    return v


def check_vf_ref(v: str) -> str:
    return _fullmatch(_VF_REF, v, "a VF's PCI address or <pf>:<index>")


def check_group_name(v: str) -> str:
    return v if v == "" else _fullmatch(_GROUP_NAME, v,
                                        "a throttle group (1-64 of letters, digits, '_', '.', '-')")


def check_atomic_write_bytes(v: int) -> int:
    """0 (none asked for) or a power of two in [ATOMIC_WRITE_MIN_BYTES, ATOMIC_WRITE_MAX_BYTES]."""
    if v == 0:
        return v
    if not ATOMIC_WRITE_MIN_BYTES <= v <= ATOMIC_WRITE_MAX_BYTES or v & (v - 1):
        raise ValueError(f"{v} is not 0 or a power of two from {ATOMIC_WRITE_MIN_BYTES} to "
                         f"{ATOMIC_WRITE_MAX_BYTES} bytes")
    return v


def check_count(n: int, most: int, what: str) -> None:
    if n > most:
        raise ValueError(f"{n} {what}; at most {most}")


def check_range(n: int, least: int, most: int) -> int:
    if not least <= n <= most:
        raise ValueError(f"{n} is not {least} to {most}")
    return n


def check_labels(labels: Mapping[str, str], *, most: int = LABELS_MAX,
                 most_bytes: int = LABELS_BYTES_MAX) -> Mapping[str, str]:
    """``most``/``most_bytes``: hostd's (the defaults), or what the scheduler lets a user
    give (USER_LABELS_MAX, USER_LABELS_BYTES_MAX)."""
    check_count(len(labels), most, "labels")
    size = 0
    for k, v in labels.items():
        _fullmatch(_LABEL_KEY, k, "a label key (1-63 of letters, digits, '_', '.', '/', '-')")
        if not isinstance(v, str) or len(v) > LABEL_VALUE_MAX or not v.isprintable():
            raise ValueError(f"label {k}: the value must be at most {LABEL_VALUE_MAX} printable characters")
        size += len(k.encode()) + len(v.encode())
    if size > most_bytes:
        raise ValueError(f"the labels take {size} bytes; at most {most_bytes}")
    return labels


def check_host_name(v: str) -> str:
    return _fullmatch(_HOST_NAME, v, "a host name (1-64 of letters, digits, '_', '.', '-', starting with a "
                                     "letter or digit)")


def check_rack(v: str) -> str:
    if len(v) > RACK_MAX or not v.isprintable():
        raise ValueError(f"a rack is at most {RACK_MAX} printable characters")
    return v


def check_host_labels(labels: Mapping[str, str]) -> Mapping[str, str]:
    return check_labels(labels, most=HOST_LABELS_MAX)


def check_label_selector(v: str) -> str:
    if len(v) > LABEL_SELECTOR_MAX:
        raise ValueError(f"{len(v)} characters; at most {LABEL_SELECTOR_MAX}")
    return v


def check_cpu_id(cpu: int) -> int:
    if not 0 <= cpu < MAX_CPUS:
        raise ValueError(f"CPU {cpu} is not a CPU id (0-{MAX_CPUS - 1}, the kernel's NR_CPUS)")
    return cpu


def check_numa_node(node: int) -> int:
    if not 0 <= node < MAX_NUMA_NODES:
        raise ValueError(f"node {node} is not a NUMA node id (0-{MAX_NUMA_NODES - 1})")
    return node


def iotune_problem(t: Mapping[str, int | str]) -> tuple[str, str] | None:
    """(field, reason) when libvirt or QEMU would refuse this throttle, or it is out of
    bounds. ``t`` holds api/hostd.proto IoTune's fields (absent = 0)."""
    def g(k: str) -> int:
        return int(t.get(k, 0) or 0)
    for k, v in t.items():
        if k != "group_name" and not 0 <= int(v) <= IOTUNE_VALUE_MAX:
            return k, f"must be 0 to {IOTUNE_VALUE_MAX} (QEMU's limit)"
    for kind in ("bytes", "iops"):
        if g(f"total_{kind}_sec") and (g(f"read_{kind}_sec") or g(f"write_{kind}_sec")):
            return f"total_{kind}_sec", f"cannot be combined with read_/write_{kind}_sec"
    for base, burst, length in IOTUNE_FAMILIES:
        if g(burst) and not g(base):
            return burst, f"needs {base}"
        if g(burst) and g(burst) < g(base):
            return burst, f"is below {base}"
        if g(length) and not g(burst):
            return length, f"needs {burst}"
        if g(length) * g(burst) > IOTUNE_VALUE_MAX:
            return length, f"times {burst} must be at most {IOTUNE_VALUE_MAX} (QEMU's limit)"
    try:
        check_group_name(str(t.get("group_name", "")))
    except ValueError as e:
        return "group_name", str(e)
    return None


def check_operation_id(v: str) -> str:
    return _fullmatch(_OPERATION_ID, v, OPERATION_ID_RULE)


def check_digest(v: str) -> str:
    return _fullmatch(_DIGEST, v, 'a sha256 hex digest or "" (uncarved)')


def check_grace_seconds(v: int) -> int:
    if not 0 <= v <= GRACE_SECONDS_MAX:
        raise ValueError(f"must be 0 to {GRACE_SECONDS_MAX} seconds")
    return v


def check_policy_text(text: str) -> str:
    """Size and nesting of a TOML policy, read in one pass without recursion (tables,
    arrays, inline tables and dotted keys; strings and comments skipped), so a parser
    that recurses, or takes time quadratic in a dotted key's length (tomllib does
    both), never sees a text nested deeper than POLICY_DEPTH_MAX."""
    if len(text) > POLICY_BYTES_MAX or len(text.encode()) > POLICY_BYTES_MAX:
        raise ValueError(f"the policy is larger than {POLICY_BYTES_MAX} bytes")
    depth = deepest = dots = 0
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "#":
            j = text.find("\n", i)
            i = n if j < 0 else j - 1
        elif c in "\"'":
            i = _string_end(text, i)
        elif c in "[{":
            depth += 1
            deepest = max(deepest, depth)
            dots = 0
        elif c in "]}":
            depth = max(0, depth - 1)
        elif c == ".":
            dots += 1  # a dotted key's separators (a value has one at most: 1.5)
            if dots >= POLICY_DEPTH_MAX:
                raise ValueError(f"a dotted key nests deeper than {POLICY_DEPTH_MAX}")
        elif c in "=,\n":
            dots = 0
        i += 1
    if deepest > POLICY_DEPTH_MAX:
        raise ValueError(f"nests {deepest} deep; at most {POLICY_DEPTH_MAX}")
    return text


def _string_end(text: str, i: int) -> int:
    """The index of the closing quote of the TOML string opening at ``i`` (the end of
    the text when it does not close: the parser reports that)."""
    q = text[i]
    triple = text.startswith(q * 3, i)
    close = q * 3 if triple else q
    j = i + len(close)
    while j < len(text):
        if q == '"' and text[j] == "\\":
            j += 2
            continue
        if not triple and text[j] == "\n":
            return j - 1  # an unterminated one-line string: the parser's error
        if text.startswith(close, j):
            while triple and text.startswith(q, j + 3):  # a closing """" ends one later
                j += 1
            return j + len(close) - 1
        j += 1
    return len(text)


def check_policy_data(data: object) -> object:
    """The parsed policy: nesting (dotted keys nest too: ``a.b.c = 1``) and TOML's
    64-bit integers, walked without recursion."""
    stack: list[tuple[object, int]] = [(data, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            if d > POLICY_DEPTH_MAX:
                raise ValueError(f"nests deeper than {POLICY_DEPTH_MAX}")
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            if d > POLICY_DEPTH_MAX:
                raise ValueError(f"nests deeper than {POLICY_DEPTH_MAX}")
            stack.extend((x, d + 1) for x in v)
        elif isinstance(v, int) and not isinstance(v, bool) and not _INT64[0] <= v <= _INT64[1]:
            raise ValueError("an integer outside TOML's 64 bits")
    return data


# A client told to come back later (429/503 with ``Retry-After``: the scheduler shedding
# load, a beat too soon) waits that long and up to this share more, at random, so a
# fleet told the same thing at once does not come back at once (hostd's heartbeat
# client). The scheduler sizes a beat's Retry-After so that even the longest wait still
# beats before the heartbeat timeout (``scheduler.liveness_rule.beat_retry_after``).
RETRY_AFTER_JITTER = 0.5
