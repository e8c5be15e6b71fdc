"""tracefs: find or mount it, and a private ftrace instance that is always removed.

Tracing is switched on inside a context manager that switches it off and removes the
instance in `finally` (also on Ctrl-C/SIGTERM: stopping.py),
so the host's own tracing (top-level buffer, other instances) is never touched.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tools.kvm_utils.errors import NotAvailable

log = logging.getLogger(__name__)

DEFAULT_MOUNT = Path("/sys/kernel/tracing")
INSTANCE_PREFIX = "kvm-utils-"


def find_tracefs(mounts: Path = Path("/proc/mounts")) -> Path | None:
    """The tracefs mount point (or debugfs/tracing), None if neither is mounted."""
    debugfs = None
    for line in mounts.read_text().splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        if fields[2] == "tracefs":
            return Path(fields[1])
        if fields[2] == "debugfs" and (Path(fields[1]) / "tracing/events").is_dir():
            debugfs = Path(fields[1]) / "tracing"
    return debugfs


@contextmanager
def tracefs_mounted(explicit: Path | None = None) -> Iterator[Path]:
    """Yield a usable tracefs; mount it at /sys/kernel/tracing when absent and unmount after."""
    if explicit is not None:
        if not (explicit / "events").is_dir():
            raise NotAvailable(f"--tracefs {explicit}: no events/ directory (not a tracefs mount?)")
        yield explicit
        return
    found = find_tracefs()
    if found is not None:
        yield found
        return
    r = subprocess.run(["mount", "-t", "tracefs", "nodev", str(DEFAULT_MOUNT)], capture_output=True, text=True)
    if r.returncode != 0:
        raise NotAvailable(f"tracefs is not mounted and mounting it failed ({r.stderr.strip()}); "
                           f"run as root: mount -t tracefs nodev {DEFAULT_MOUNT} "
                           "(kernel needs CONFIG_TRACING / CONFIG_FTRACE)")
    log.info("event=tracefs_mounted path=%s", DEFAULT_MOUNT)
    try:
        yield DEFAULT_MOUNT
    finally:
        subprocess.run(["umount", str(DEFAULT_MOUNT)], check=False)
        log.info("event=tracefs_unmounted path=%s", DEFAULT_MOUNT)


def available_kvm_events(tracefs: Path) -> list[str]:
    d = tracefs / "events/kvm"
    return sorted(p.name for p in d.iterdir() if (p / "enable").exists()) if d.is_dir() else []


def tracepoint_id(tracefs: Path, system: str, event: str) -> int:
    return int((tracefs / "events" / system / event / "id").read_text())


@dataclass
class Instance:
    path: Path
    events: list[str]

    def pipe_lines(self, stop_at: float | None, should_stop=lambda: False) -> Iterator[str]:
        """Lines from this instance's trace_pipe until `stop_at` (monotonic) or should_stop().

        Stopping (also by Ctrl-C while waiting) switches tracing off and drains the buffer,
        so events that happened before the stop are never lost.
        """
        fd = os.open(self.path / "trace_pipe", os.O_RDONLY | os.O_NONBLOCK)
        buf = b""
        try:
            while not should_stop() and (stop_at is None or time.monotonic() < stop_at):
                timeout = 0.2 if stop_at is None else max(0.0, min(0.2, stop_at - time.monotonic()))
                try:
                    ready, _, _ = select.select([fd], [], [], timeout)
                    chunk = _read(fd) if ready else b""
                except KeyboardInterrupt:   # Ctrl-C/SIGTERM: stop, but keep what is buffered
                    break
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    yield line.decode("utf-8", "replace")
            (self.path / "tracing_on").write_text("0")   # stop producing, then drain
            while chunk := _read(fd):
                buf += chunk
            for line in buf.split(b"\n"):
                if line:
                    yield line.decode("utf-8", "replace")
        finally:
            os.close(fd)


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 1 << 16)
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EINTR):
            return b""
        raise


@contextmanager
def instance(tracefs: Path, events: list[str], buffer_kb: int = 8192,
             pid_filter: list[int] | None = None) -> Iterator[Instance]:
    """A private instance with `events` (kvm:<name>) enabled; removed on exit, whatever happens."""
    available = set(available_kvm_events(tracefs))
    if not available:
        raise NotAvailable(f"no kvm tracepoints under {tracefs}/events/kvm: load the kvm module "
                           "(modprobe kvm_intel / kvm_amd) and check CONFIG_KVM")
    wanted = [e for e in events if e in available]
    missing = sorted(set(events) - available)
    if missing:
        log.warning("event=tracepoints_missing names=%s", ",".join(missing))
    root = tracefs / "instances"
    path = root / f"{INSTANCE_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:6]}"
    path.mkdir()
    log.info("event=instance_created path=%s", path)
    try:
        (path / "tracing_on").write_text("0")
        (path / "buffer_size_kb").write_text(str(buffer_kb))
        if pid_filter:
            (path / "set_event_pid").write_text(" ".join(map(str, pid_filter)))
        for ev in wanted:
            (path / "events/kvm" / ev / "enable").write_text("1")
        (path / "tracing_on").write_text("1")
        yield Instance(path, wanted)
    finally:
        remove_instance(path)


def remove_instance(path: Path) -> None:
    """Switch everything off and rmdir; retried because a just-closed trace_pipe may be busy."""
    for name, value in (("tracing_on", "0"), ("events/enable", "0")):
        try:
            (path / name).write_text(value)
        except OSError:
            pass
    for attempt in range(50):
        try:
            path.rmdir()
            log.info("event=instance_removed path=%s", path)
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != errno.EBUSY or attempt == 49:
                log.error("event=instance_remove_failed path=%s error=%s", path, e)
                raise
            time.sleep(0.1)


def stale_instances(tracefs: Path) -> list[Path]:
    """Instances left by a kvm-utils process that no longer exists (e.g. SIGKILLed)."""
    stale = []
    root = tracefs / "instances"
    if not root.is_dir():
        return stale
    for p in root.iterdir():
        if not p.name.startswith(INSTANCE_PREFIX):
            continue
        pid = p.name[len(INSTANCE_PREFIX):].split("-")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            stale.append(p)
    return stale
