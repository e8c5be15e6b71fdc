"""`record`: raw kvm events from a private ftrace instance into a kvm-utils record file."""

from __future__ import annotations

import logging
import os
import platform
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tools.kvm_utils import procs
from tools.kvm_utils.sources import recordfile, tracefs
from tools.kvm_utils.sources.tracetext import KVM_EVENTS
from tools.kvm_utils.stopping import stop_requests

log = logging.getLogger(__name__)

_LOST = re.compile(r"\[LOST (\d+) EVENTS\]")
_TID = re.compile(r"-(\d+)\s+(?:\(\s*[\d-]+\)\s+)?\[\d+\]")


@dataclass(frozen=True)
class RecordResult:
    path: Path
    lines: int
    lost_events: int
    duration_s: float


def host_vendor(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """intel/amd from the CPU flags; None when neither vmx nor svm is exposed (e.g. PVM)."""
    try:
        flags = next((ln for ln in cpuinfo.read_text().splitlines() if ln.startswith("flags")), "").split()
    except OSError:
        return None
    return "intel" if "vmx" in flags else "amd" if "svm" in flags else None


def record(trace_root: Path, output: Path, duration: float | None, buffer_kb: int = 8192,
           proc: Path = Path("/proc"), should_stop=lambda: False, on_ready=lambda: None) -> RecordResult:
    """Record until `duration` seconds pass, `should_stop()`, Ctrl-C or SIGTERM; the file is complete either way.
    `on_ready()` is called once tracing is on (every event from then on is recorded)."""
    threads = procs.thread_map(procs.vm_processes(proc))
    header = recordfile.Header(kernel=platform.release(), vendor=host_vendor(), started=time.time(),
                               events=list(KVM_EVENTS))
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=".kvmu-", dir=output.parent)
    tmp = Path(tmp_name)
    lines = lost = 0
    seen: set[int] = set()
    t0 = time.monotonic()
    stop_asked: list[bool] = []
    try:
        # a stop signal only asks to stop: the reader switches tracing off and drains the
        # buffer, and no line is dropped half-handled (as KeyboardInterrupt could)
        with stop_requests(lambda: stop_asked.append(True)), os.fdopen(fd, "w") as body, \
                tracefs.instance(trace_root, list(KVM_EVENTS), buffer_kb) as inst:
            header.events = inst.events
            on_ready()
            stop_at = None if duration is None else t0 + duration
            for line in inst.pipe_lines(stop_at, lambda: bool(stop_asked) or should_stop()):
                m = _TID.search(line)
                if m and int(m.group(1)) not in seen:   # name a thread while it is alive
                    tid = int(m.group(1))
                    seen.add(tid)
                    info = procs.thread_info(proc, tid)
                    if info is not None:
                        threads.setdefault(tid, info)
                elif m is None and (m := _LOST.search(line)):
                    lost += int(m.group(1))
                body.write(line + "\n")
                lines += 1
            if stop_asked:
                log.info("event=record_stopped_by_signal lines=%d", lines)
        header.duration_s = round(time.monotonic() - t0, 3)
        header.lost_events = lost
        # threads seen at the start or the end: vCPUs created during the run are named too
        header.threads = {**threads, **procs.thread_map(procs.vm_processes(proc))}
        with open(output, "w") as out:
            recordfile.write_header(out, header)
            with open(tmp) as body_in:
                for chunk in iter(lambda: body_in.read(1 << 20), ""):
                    out.write(chunk)
    finally:
        tmp.unlink(missing_ok=True)
    log.info("event=recorded path=%s lines=%d lost=%d", output, lines, lost)
    return RecordResult(output, lines, lost, header.duration_s)
