"""`report`: a record file or any ftrace text -> Summary. Pure apart from reading the file."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tools.kvm_utils.aggregate import Pairer, Summary, ThreadInfo, summarize
from tools.kvm_utils.arch import Vendor
from tools.kvm_utils.sources import recordfile
from tools.kvm_utils.sources.tracetext import detect_vendor, parse_lines, vcpu_of_task


def summarize_lines(lines: Iterable[str], vendor: Vendor | None = None,
                    threads: dict[int, ThreadInfo] | None = None, source: str = "trace") -> Summary:
    """Lines of ftrace text (optionally with a kvm-utils record header) -> Summary."""
    header, body = recordfile.split(lines)
    body_lines = list(body)
    if header is not None:
        source = "record"
        vendor = vendor or (Vendor(header.vendor) if header.vendor else None)
        threads = {**header.threads, **(threads or {})}
    vendor = vendor or detect_vendor(body_lines)
    known: dict[int, ThreadInfo] = dict(threads or {})
    pairer = Pairer()
    for line in parse_lines(body_lines, vendor):
        if line.tid not in known:
            known[line.tid] = ThreadInfo(vcpu_of_task(line.task), None)
        pairer.feed(line.event)
    return summarize(pairer.finish(), known, source)


def summarize_file(path: Path, vendor: Vendor | None = None) -> Summary:
    with open(path, encoding="utf-8", errors="replace") as f:
        return summarize_lines(f, vendor)
