"""Inside the nested-SVM guest: one kvm-utils command around one known workload.

    python3 run.py --helper "MODE N [helper options]" [--background "MODE N"] -- KVM-UTILS-ARGS...

Starts the bench helper (its tiny KVM guest, created and waiting on stdin), then
`kvm-utils KVM-UTILS-ARGS` ("{pid}" replaced by the helper's PID) with no duration; once
kvm-utils says it traces ("Hit Ctrl-C"), lets the helper run its loop, reads its result,
stops kvm-utils with SIGINT (as Ctrl-C: it prints its summary) and prints one JSON line:
With --background, a second helper (named guest=busy) loops before kvm-utils starts and
until it has stopped: exits while the probes attach and detach.
{"helper": the helper's result, "rc", "stdout", "stderr", "attach_s", "stop_s"}.
Stdlib only (the guest's carried Python).
"""

from __future__ import annotations

import json
import os
import select
import shlex
import signal
import subprocess
import sys
import time

HELPER = os.environ.get("KVM_UTILS_HELPER", "/srv/kvm-exit-bench")


def _wait_line(stream, text: str, timeout: float, proc: subprocess.Popen, acc: list[str]) -> None:
    deadline = time.monotonic() + timeout
    while not any(text in ln for ln in acc):
        if proc.poll() is not None:
            acc.append(stream.read())
            raise SystemExit(json.dumps({"error": f"{proc.args[:4]} exited (rc {proc.returncode}) before "
                                                  f"{text!r}", "stderr": "".join(acc)[-4000:]}))
        left = deadline - time.monotonic()
        if left <= 0:
            raise SystemExit(json.dumps({"error": f"no {text!r} in {timeout} s", "stderr": "".join(acc)[-4000:]}))
        if select.select([stream], [], [], min(left, 0.5))[0]:
            acc.append(stream.readline())


def main(argv: list[str]) -> int:
    if "--" not in argv or argv[:1] != ["--helper"]:
        print("usage: run.py --helper 'MODE N [opts]' [--background 'MODE N'] -- KVM-UTILS-ARGS...", file=sys.stderr)
        return 2
    sep = argv.index("--")
    busy = None
    if argv[2:3] == ["--background"]:
        busy = subprocess.Popen([HELPER, "-name", "guest=busy", *shlex.split(argv[3])], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    try:
        return _main(argv, sep)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()


def _main(argv: list[str], sep: int) -> int:
    helper = subprocess.Popen([HELPER, "-name", "guest=quiet", "--wait-stdin", *shlex.split(argv[1])], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    herr: list[str] = []
    _wait_line(helper.stderr, "ready pid", 30, helper, herr)
    args = [a.replace("{pid}", str(helper.pid)) for a in argv[sep + 1:]]
    t0 = time.monotonic()
    ku = subprocess.Popen([sys.executable, "-m", "tools.kvm_utils", *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    kerr: list[str] = []
    try:
        _wait_line(ku.stderr, "Hit Ctrl-C", 120, ku, kerr)
        attach_s = time.monotonic() - t0
        helper.stdin.write("go\n")
        helper.stdin.flush()
        line = helper.stdout.readline()
        result = json.loads(line) if line.strip() else {"error": "helper printed nothing"}
        time.sleep(0.5)
        t1 = time.monotonic()
        ku.send_signal(signal.SIGINT)
        try:
            out, err = ku.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            ku.kill()
            out, err = ku.communicate()
            err += "\nrun.py: kvm-utils did not stop within 90 s of SIGINT; killed"
        stop_s = time.monotonic() - t1
    finally:
        if ku.poll() is None:
            ku.kill()
        helper.stdin.close()
        try:
            helper.wait(timeout=10)
        except subprocess.TimeoutExpired:
            helper.kill()
    print(json.dumps({"helper": result, "rc": ku.returncode, "stdout": out, "stderr": "".join(kerr) + err,
                      "attach_s": round(attach_s, 2), "stop_s": round(stop_s, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
