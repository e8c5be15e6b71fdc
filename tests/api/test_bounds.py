"""api/bounds.py: the limits on what callers send, and the two parsers they guard
(hostd's CPU lists and its TOML policies): each refused fast, in bounded memory, without
recursion. The RPC-level refusals: tests/hostd/rpc/test_hostile_defects.py."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from api import bounds
from hostd.carve.policy import PolicyError, loads_policy
from hostd.cpulist import CpuListError, parse_cpu_list

# ---------------------------------------------------------------- CPU lists (D1)


def test_cpu_lists_stop_at_the_kernel_s_limit() -> None:
    assert parse_cpu_list("0-3,8,10-11") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpu_list("0-10:3") == {0, 3, 6, 9} and parse_cpu_list("") == frozenset()
    assert parse_cpu_list(f"{bounds.MAX_CPUS - 1}") == {bounds.MAX_CPUS - 1}
    for bad in (f"{bounds.MAX_CPUS}", "0-20000000", "0-4294967296", "9" * 5000, "-1", "1_0", "+1", "\u0663"):
        with pytest.raises(CpuListError):
            parse_cpu_list(bad)


def test_a_cpu_range_from_outside_costs_bounded_memory_and_time() -> None:
    """parse_cpu_list("0-20000000") took 2.2 GB; a 64 KiB list of whole ranges took 9 s
    (a set update per CPU). Measured in a child process: its peak RSS, not this one's,
    and its CPU time, not the wall clock the machine's other work stretches."""
    code = ("import resource, time; from hostd.cpulist import parse_cpu_list\n"
            "r0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss; t0 = time.process_time()\n"
            "for text in ('0-20000000', ','.join(['0-8191'] * 8000)):\n"
            "    try: parse_cpu_list(text)\n"
            "    except ValueError: pass\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - r0, time.process_time() - t0)\n")
    limit = f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({2 << 30}, {2 << 30}))\n"
    out = subprocess.run([sys.executable, "-c", limit + code], capture_output=True, text=True, check=True).stdout
    grew_kb, took = out.split()
    assert int(grew_kb) < 32 * 1024 and float(took) < 1, out


# ---------------------------------------------------------------- policies (D2)


@pytest.mark.parametrize("text, words", [
    ("a=" + "[" * 5000 + "]" * 5000, "nests 5000 deep"),
    ("a={b={c={d={e={f={g={h={i={j=1}}}}}}}}}", "nests 9 deep"),
    ("a={b={c={d={e={f={g={h={i=1}}}}}}}}", "nests deeper than 8"),  # 8 braces: the table makes 9
    ("a." * 30000 + "b=1", "dotted key"),
    ('"a".' * 9 + "b=1", "dotted key"),
    ("[a.b.c.d]\ne.f.g.h.i = 1", "nests deeper than 8"),  # each part short, together too deep
    ("a=" + "9" * 5000, "not a policy"),
    ("a=9223372036854775808", "64 bits"),
    ("#" + "x" * bounds.POLICY_BYTES_MAX, "larger than"),
    ("# " + "\u00e9" * (bounds.POLICY_BYTES_MAX // 2), "larger than"),  # bytes, not characters
])
def test_a_policy_out_of_bounds_is_a_policy_error_found_fast(text: str, words: str) -> None:
    t0 = time.process_time()  # the parse's CPU: the machine's other work does not stretch it
    with pytest.raises(PolicyError) as e:
        loads_policy(text, source="policy_toml")
    assert words in str(e.value) and time.process_time() - t0 < 0.5


@pytest.mark.parametrize("text", [
    'x = "[[[[[[[[[[[[" ',  # brackets in strings and comments are not nesting
    "x = '[[[[[[[[[[[[[[[['",
    'x = """\n[[[[[[[[[[[[\n"""',
    "x = '''[[[[[[[[[[]]]]]]]]]]'''",
    'x = "\\"[[[[[[[[[[[[[["',
    "# [[[[[[[[[[[[[[[[[[[[\n",
    'x = "a.b.c.d.e.f.g.h.i.j"',
    "x = 1.5\ny = 1979-05-27T07:32:00.999\nz = [1.5, 2.5]",
])
def test_the_pre_check_reads_strings_and_comments_as_toml_does(text: str) -> None:
    assert bounds.check_policy_text(text) == text


def test_the_example_policy_is_within_bounds() -> None:
    text = (Path(__file__).resolve().parents[2] / "hostd/carve/policy.example.toml").read_text()
    assert loads_policy(text) is not None


# ---------------------------------------------------------------- request fields


@pytest.mark.parametrize("name", ["a", "vm-1.x_y", "n" * 64, ".x", "x.."])
def test_vm_names_that_are_names(name: str) -> None:
    assert bounds.check_vm_name(name) == name


@pytest.mark.parametrize("name", ["", ".", "..", "nl-x\n", "a/b", "a\x00b", "n" * 65, "é"])
def test_vm_names_that_are_not(name: str) -> None:
    with pytest.raises(ValueError):
        bounds.check_vm_name(name)


def test_what_the_scheduler_names_a_vm_is_a_hostd_vm_name() -> None:
    """The scheduler's longest VM name plus "-<8 hex of its id>" (scheduler/service/vms.py)."""
    from scheduler.schemas.vms import NAME
    longest = int(NAME.rsplit(",", 1)[1].split("}")[0])
    assert longest + bounds.SCHEDULER_NAME_SUFFIX <= bounds.VM_NAME_MAX
    assert bounds.check_vm_name("." + "-0123abcd") and bounds.check_vm_name("x" * longest + "-0123abcd")


def test_labels() -> None:
    ok = {f"k{i:02d}": "v" * 80 for i in range(48)}
    assert bounds.check_labels(ok) == ok
    for bad, words in (({**ok, "one-more": "v"}, "49 labels"), ({"k": "v" * 256}, "at most 255"),
                       ({"k k": "v"}, "label key"), ({"k": "a\tb"}, "printable"),
                       ({f"k{i}": "\u00e9" * 200 for i in range(11)}, "bytes")):
        with pytest.raises(ValueError, match=words):
            bounds.check_labels(bad)
    with pytest.raises(ValueError, match="33 labels"):
        bounds.check_labels({f"k{i}": "v" for i in range(33)}, most=bounds.USER_LABELS_MAX)


def test_the_scheduler_s_own_labels_fit_in_the_room_it_leaves() -> None:
    mine = {"hyb.vm": "0" * 36, "hyb.tenant": "t" * 48, "hyb.name": "n" * 48}
    assert sum(len(k) + len(v) for k, v in mine.items()) <= bounds.SCHEDULER_LABELS_BYTES
    user = {f"k{i:02d}": "v" * (bounds.USER_LABELS_BYTES_MAX // 32 - 3) for i in range(bounds.USER_LABELS_MAX)}
    bounds.check_labels(user, most=bounds.USER_LABELS_MAX, most_bytes=bounds.USER_LABELS_BYTES_MAX)
    assert bounds.check_labels(user | mine) == user | mine


@pytest.mark.parametrize("tune, field", [
    ({"total_bytes_sec": 10**15 + 1}, "total_bytes_sec"),
    ({"total_bytes_sec": 5, "read_bytes_sec": 1}, "total_bytes_sec"),
    ({"total_iops_sec_max": 10}, "total_iops_sec_max"),  # QEMU: a burst needs its base rate
    ({"total_bytes_sec": 10, "total_bytes_sec_max": 5}, "total_bytes_sec_max"),
    ({"total_bytes_sec_max_length": 3}, "total_bytes_sec_max_length"),
    ({"total_bytes_sec": 10**14, "total_bytes_sec_max": 10**14, "total_bytes_sec_max_length": 11},
     "total_bytes_sec_max_length"),
    ({"group_name": "g\n"}, "group_name"),
    ({"group_name": "g" * 65}, "group_name"),
])
def test_iotune_problems(tune: dict, field: str) -> None:
    bad = bounds.iotune_problem(tune)
    assert bad is not None and bad[0] == field, bad


def test_an_iotune_within_bounds() -> None:
    assert bounds.iotune_problem({"total_bytes_sec": 10**15, "total_bytes_sec_max": 10**15,
                                  "total_bytes_sec_max_length": 1, "read_iops_sec": 5,
                                  "group_name": "g-1"}) is None


def test_a_refusal_quotes_only_a_prefix() -> None:
    with pytest.raises(ValueError) as e:
        bounds.check_request_id("x" * 100_000)
    assert len(str(e.value)) < 200
