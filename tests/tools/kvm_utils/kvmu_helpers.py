"""Helpers the kvm-utils live tests share (a module with a unique name: pytest
imports every conftest.py as `conftest`, so tests must not import from one)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def kvm_utils_popen(*args: str, sigint: int = signal.SIG_DFL) -> subprocess.Popen:
    """`kvm-utils *args`, started as from a terminal: SIGINT at its default, whatever this
    process inherited (a suite started as a background job runs with SIGINT ignored, and
    an ignored signal stays ignored across fork and exec). `sigint=signal.SIG_IGN` starts
    it as a shell starts a background job."""
    return subprocess.Popen([*with_sigint(sigint), sys.executable, "-m", "tools.kvm_utils", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def with_sigint(sigint: int) -> list[str]:
    """The argv prefix that starts a command with SIGINT ignored or at its default
    (coreutils' env execs it in place: the same PID). Not a ``preexec_fn``: that makes
    subprocess fork() this multi-threaded test process and run Python in the child,
    where gRPC's fork handlers (the worker has imported grpc) now and then abort it
    ("epoll_wait error: Bad file descriptor", SIGABRT) before the exec."""
    return ["env", "--ignore-signal=INT" if sigint == signal.SIG_IGN else "--default-signal=INT"]


def sigint_disposition(pid: int) -> str:
    """"ignored", "caught" or "default": SIGINT in /proc/PID/status."""
    fields = dict(ln.split(":\t", 1) for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ":\t" in ln)
    bit = 1 << (signal.SIGINT - 1)
    return ("ignored" if int(fields["SigIgn"], 16) & bit else
            "caught" if int(fields["SigCgt"], 16) & bit else "default")


def children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def task_state(pid: int) -> str:
    """State, signal masks and where a task waits in the kernel: for assertion messages."""
    try:
        status = [ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines()
                  if ln.startswith(("State", "PPid", "Sig", "ShdPnd"))]
        return "; ".join(status + [f"wchan: {Path(f'/proc/{pid}/wchan').read_text()}"])
    except OSError as e:
        return f"gone ({e})"


def alive(pid: int) -> bool:
    """Running (a zombie waiting for init to reap it has let go of its probes)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(predicate, timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def stderr_has(proc: subprocess.Popen, acc: list[str], text: str) -> bool:
    """Read one more stderr line of `proc` if there is one; has any line so far `text`?"""
    import select
    if proc.poll() is not None:
        raise AssertionError(f"{proc.args} exited early: {proc.stderr.read()}")
    if select.select([proc.stderr], [], [], 0.1)[0]:
        acc.append(proc.stderr.readline())
    return any(text in ln for ln in acc)


def instance_dirs(tracefs_root: Path, pid: int) -> list[Path]:
    return [p for p in (tracefs_root / "instances").iterdir() if p.name.startswith(f"kvm-utils-{pid}-")]


def instance_of(tracefs_root: Path, pid: int) -> Path | None:
    """The recording instance of ``pid`` once it records: a new instance starts with
    tracing_on=1 before any event is enabled, so tracing_on alone is not readiness;
    kvm-utils enables its events with tracing off and switches it on last."""
    for p in (tracefs_root / "instances").iterdir():
        if not p.name.startswith(f"kvm-utils-{pid}-"):
            continue
        try:
            ready = ((p / "tracing_on").read_text().strip() == "1"
                     and (p / "events/kvm/kvm_pio/enable").read_text().strip() == "1")
        except OSError:  # the instance is being made or removed
            ready = False
        if ready:
            return p
    return None


def only_pid(path: Path, pid: int) -> dict:
    """The JSON report of a record file, for the events of one process only."""
    from tools.kvm_utils.render.json import to_dict
    from tools.kvm_utils.report import summarize_lines
    lines = path.read_text().splitlines()
    mine = [lines[0]] + [ln for ln in lines[1:] if f"-{pid} " in ln]
    return to_dict(summarize_lines(mine))


def wait_counting(proc: subprocess.Popen, timeout: float = 120) -> str:
    """Read the tool's stderr until it says it counts ("Counting kvm exits ..."); what it
    read (for the caller's later checks). Fails if the tool ends first or takes longer,
    with where each of its threads waits in the kernel (once, in a full run beside a
    pip install, the system-wide counters took over 60 s to open; 0.5 s otherwise)."""
    import select
    import time
    got, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([proc.stderr], [], [], 0.2)[0]:
            line = proc.stderr.readline()
            if not line:
                break
            got.append(line)
            if line.startswith("Counting kvm exits"):
                return "".join(got)
    raise AssertionError(f"the tool never said it counts: exit {proc.poll()}, stderr {''.join(got)[-2000:]}\n"
                         f"{kernel_stacks(proc.pid)}")


def kernel_stacks(pid: int) -> str:
    """Each thread of ``pid``: its state, wait channel and kernel stack (the stack as root)."""
    out = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("*")):
        def read(name: str) -> str:
            try:
                return (task / name).read_text(errors="replace").strip()
            except OSError as e:
                return f"({e.strerror})"
        state = next((ln for ln in read("status").splitlines() if ln.startswith("State:")), "")
        out.append(f"thread {task.name} {state} wchan {read('wchan')}\n{read('stack')}")
    return "\n".join(out) or f"(no /proc/{pid}: the tool is gone)"


def stop(proc: subprocess.Popen, sig: int = 2, timeout: float = 30) -> tuple[str, str]:
    """Signal a process we started (by PID) and collect its output; SIGKILL if it hangs."""
    if proc.poll() is None:
        os.kill(proc.pid, sig)
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"pid {proc.pid} ignored signal {sig}: {err}")


def start_guest(argv: list[str]) -> subprocess.Popen:
    """Start the bench helper with --wait-stdin and wait for its "ready" line: the VM and its
    vCPU thread exist, nothing has run yet. It runs when `go()` writes a line to stdin."""
    g = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = g.stderr.readline()
    if not line.startswith("ready"):
        g.kill()
        _, err = g.communicate()  # reaps it and closes the pipes
        raise AssertionError(f"bench helper did not get ready: {line!r} {err}")
    return g


def go(g: subprocess.Popen) -> dict:
    """Let a --wait-stdin helper run; its result line. It stays alive until `finish(g)`."""
    import json
    g.stdin.write("go\n")
    g.stdin.flush()
    return json.loads(g.stdout.readline())


def finish(*procs: subprocess.Popen) -> None:
    """Close stdin of / kill the processes we started (by PID), whatever state they are in;
    their pipes are closed as they are reaped."""
    for p in procs:
        if p is None:
            continue
        try:
            p.communicate(timeout=10)
        except (subprocess.TimeoutExpired, OSError, ValueError):
            p.kill()
            p.communicate()


def wait_line(proc: subprocess.Popen, marker: str, stream: str = "stderr") -> list[str]:
    """Read `proc`'s stream until a line containing `marker` (readiness); the lines read."""
    seen = []
    for line in getattr(proc, stream):
        seen.append(line)
        if marker in line:
            return seen
    raise AssertionError(f"pid {proc.pid} ended before {marker!r}: {''.join(seen)}")


def attach_and_run(guest_argv: list[str], tool_args: list[str], ready: str,
                   timeout: float) -> tuple[subprocess.Popen, dict, subprocess.Popen, str, str]:
    """The live pattern: start the helper guest (waiting on stdin), start `kvm-utils
    *tool_args`, wait for its `ready` line on stderr, let the guest run, collect the tool's
    output. Both processes are finished (by PID) whatever happens. Returns (guest, guest
    result, tool, tool stdout, tool stderr)."""
    g = tool = None
    try:
        g = start_guest(guest_argv)
        tool = kvm_utils_popen(*tool_args)
        wait_line(tool, ready)
        res = go(g)
        out, err = tool.communicate(timeout=timeout)
    finally:
        finish(g, tool)
    return g, res, tool, out, err
