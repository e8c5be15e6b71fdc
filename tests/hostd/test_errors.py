"""Every hostd error class names the gRPC status it reaches a caller with, chosen for
that class (hostd/errors.py): a new error cannot fall through to INTERNAL by default,
nor inherit its parent's status without saying so."""

from __future__ import annotations

import re
from pathlib import Path

import grpc

from hostd import errors
from hostd.errors import HostdError


def error_classes(base: type = HostdError) -> list[type]:
    out = []
    for sub in base.__subclasses__():
        out += [sub, *error_classes(sub)]
    return out


def test_the_walk_finds_the_errors_of_every_part_of_hostd() -> None:
    found = set(error_classes())
    declared = {v for v in vars(errors).values() if isinstance(v, type) and issubclass(v, HostdError)}
    assert declared - {HostdError} <= found
    assert len(found) >= 33  # the 31 of issue 26, hyb.host.bad_state, hyb.carve.busy


def test_the_base_has_no_status_to_inherit() -> None:
    assert "grpc_status" not in vars(HostdError)
    assert not hasattr(HostdError, "grpc_status")


def test_every_error_class_chooses_its_own_status() -> None:
    missing = [c.__name__ for c in error_classes() if "grpc_status" not in vars(c)]
    assert missing == []
    bad = [(c.__name__, c.grpc_status) for c in error_classes() if c.grpc_status not in grpc.StatusCode.__members__]
    assert bad == []
    assert all(grpc.StatusCode[c.grpc_status] != grpc.StatusCode.OK for c in error_classes())


def test_the_codes_the_issue_found_answering_internal_have_their_status() -> None:
    by_code = {c.code: grpc.StatusCode[c.grpc_status] for c in error_classes()}
    assert by_code["hyb.host.not_carved"] == grpc.StatusCode.FAILED_PRECONDITION
    assert by_code["hyb.vm.create_failed"] == grpc.StatusCode.ABORTED
    assert by_code["hyb.vm.libvirt_error"] == grpc.StatusCode.ABORTED
    assert by_code["hyb.vm.bad_domain"] == grpc.StatusCode.FAILED_PRECONDITION
    assert by_code["hyb.guest_profile.unknown"] == grpc.StatusCode.INVALID_ARGUMENT
    assert by_code["hyb.host.bad_topology"] == grpc.StatusCode.INVALID_ARGUMENT
    assert by_code["hyb.carve.busy"] == grpc.StatusCode.UNAVAILABLE
    # INTERNAL only where chosen: hostd's own records unreadable
    assert {c for c, s in by_code.items() if s == grpc.StatusCode.INTERNAL} == \
        {"hyb.host.bad_state", "hyb.vm.bad_metadata"}


def test_codes_are_never_shared_but_by_a_subclass_that_says_it_is_its_parent() -> None:
    seen: dict[str, type] = {}
    for c in error_classes():
        if c.code in seen:
            assert issubclass(c, seen[c.code]) and "code" not in vars(c), (c, seen[c.code])
        else:
            seen[c.code] = c


def readme_error_table() -> dict[str, set[str]]:
    """hostd/README.md's error table: code -> the statuses its row names (a row such as
    "`a` / `b` | X / Y" pairs them in order; "`a`, `b` | X" gives both X)."""
    text = (Path(__file__).resolve().parents[2] / "hostd/README.md").read_text()
    table = text.split("## Errors", 1)[1].split("\n## ", 1)[0]
    out: dict[str, set[str]] = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`hyb."):
            continue
        groups = [re.findall(r"`(hyb\.[a-z_.]+)`", g) for g in cells[0].split(" / ")]
        statuses = [s.strip() for s in cells[1].split("/")]
        for codes, status in zip(groups, statuses if len(statuses) == len(groups) else statuses * len(groups)):
            for code in codes:
                out.setdefault(code, set()).add(status)
    return out


def test_the_readme_error_table_says_what_the_code_returns() -> None:
    table = readme_error_table()
    by_code = {c.code: c.grpc_status for c in error_classes()}
    assert {code: {status} for code, status in by_code.items() if code in table} == \
        {code: table[code] for code in by_code if code in table}
    assert sorted(set(by_code) - set(table)) == []  # every code has its row
