"""kvm-utils' own record file: one JSON header line, then the raw ftrace text lines.

    # kvm-utils-record {"version": 1, "kernel": "...", "vendor": "intel", "threads": {...}}
    CPU 0/KVM-4101 [001] d..1. 1000.000100: kvm_exit: vcpu 0 reason ...

The body is what the kernel printed, byte for byte, so any ftrace tool can read it too;
the header adds what ftrace text cannot carry: thread -> (VM, vCPU), vendor, duration.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from tools.kvm_utils.aggregate import ThreadInfo

MAGIC = "# kvm-utils-record "
VERSION = 1


@dataclass
class Header:
    version: int = VERSION
    kernel: str = ""
    vendor: str | None = None
    started: float = 0.0
    duration_s: float | None = None
    events: list[str] = field(default_factory=list)
    threads: dict[int, ThreadInfo] = field(default_factory=dict)
    lost_events: int = 0

    def to_line(self) -> str:
        d: dict[str, Any] = {k: v for k, v in self.__dict__.items() if k != "threads"}
        d["threads"] = {str(t): {"vcpu": i.vcpu, "vm": i.vm} for t, i in sorted(self.threads.items())}
        return MAGIC + json.dumps(d, sort_keys=True) + "\n"

    @classmethod
    def from_line(cls, line: str) -> Header:
        d = json.loads(line[len(MAGIC):])
        if d.get("version") != VERSION:
            raise ValueError(f"record file version {d.get('version')!r} is not supported (want {VERSION})")
        threads = {int(t): ThreadInfo(i.get("vcpu"), i.get("vm")) for t, i in d.pop("threads", {}).items()}
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        return cls(**known, threads=threads)


def write_header(out: IO[str], header: Header) -> None:
    out.write(header.to_line())


def split(lines: Iterable[str]) -> tuple[Header | None, Iterator[str]]:
    """(header or None for plain ftrace text, iterator over the trace lines)."""
    it = iter(lines)
    first = next(it, None)
    if first is None:
        return None, iter(())
    if first.startswith(MAGIC):
        return Header.from_line(first), it

    def chain() -> Iterator[str]:
        yield first
        yield from it
    return None, chain()
