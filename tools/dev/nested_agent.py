"""The command agent inside the nested-SVM guest (tools/dev/nested_svm.py): PID 1's child.

Runs with the guest's carried Python (stdlib only). Reads one JSON request per line from
a serial port (raw mode, no echo): {"id", "cmd", "timeout"}; runs `cmd` with /bin/sh in
its own process group, kills the group when `timeout` passes (SIGINT first, as a user's
Ctrl-C, then SIGKILL 5 s later) and answers one JSON line: {"id", "rc", "out", "err",
"secs", "timed_out"}. Says "NESTED-AGENT-READY" once at start.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import termios
import time
import tty


def run(cmd: str, timeout: float) -> dict:
    t0 = time.monotonic()
    p = subprocess.Popen(["/bin/sh", "-c", cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         errors="replace", start_new_session=True, stdin=subprocess.DEVNULL)
    timed_out = False
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(p.pid, signal.SIGINT)
        try:
            out, err = p.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
    return {"rc": p.returncode, "out": out, "err": err, "secs": round(time.monotonic() - t0, 3),
            "timed_out": timed_out}


def main() -> int:
    port = sys.argv[1] if len(sys.argv) > 1 else "/dev/ttyS1"
    fd = os.open(port, os.O_RDWR | os.O_NOCTTY)
    tty.setraw(fd)
    attrs = termios.tcgetattr(fd)
    attrs[3] &= ~termios.ECHO
    termios.tcsetattr(fd, termios.TCSANOW, attrs)
    rf, wf = os.fdopen(fd, "rb", buffering=0), os.fdopen(os.dup(fd), "wb", buffering=0)

    def say(doc: dict | str) -> None:
        line = doc if isinstance(doc, str) else json.dumps(doc)
        wf.write(line.encode() + b"\n")

    say("NESTED-AGENT-READY")
    buf = b""
    while True:
        chunk = rf.read(4096)
        if not chunk:
            time.sleep(0.05)
            continue
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            line = line.strip()
            if not line.startswith(b"{"):
                continue
            try:
                req = json.loads(line)
                say({"id": req["id"], **run(req["cmd"], float(req.get("timeout", 60)))})
            except Exception as e:  # noqa: BLE001 - the host must get an answer, whatever failed
                say({"id": None, "rc": -1, "out": "", "err": f"agent: {type(e).__name__}: {e}", "secs": 0,
                     "timed_out": False})


if __name__ == "__main__":
    sys.exit(main())
