"""stopping.py: how SIGINT/SIGTERM reach a command, in a child Python process (a stop
signal this process took by mistake would end the test run)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

from kvmu_helpers import REPO, with_sigint


def run_child(body: str, sigint=signal.SIG_IGN) -> list[str]:
    """`body` in a fresh interpreter started as a background job (SIGINT ignored); its
    stdout lines."""
    code = "import os, signal\nfrom tools.kvm_utils import stopping\n" + textwrap.dedent(body)
    r = subprocess.run([*with_sigint(sigint), sys.executable, "-c", code], cwd=REPO, capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_both_signals_interrupt_even_when_sigint_was_ignored_at_start() -> None:
    out = run_child("""
        for sig in (signal.SIGINT, signal.SIGTERM):
            with stopping.stop_signals_interrupt():
                try:
                    os.kill(os.getpid(), sig)
                    signal.sigtimedwait([], 0.5)      # a wait the signal interrupts
                    print("not-interrupted")
                except KeyboardInterrupt as e:
                    print(type(e).__name__)
        print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)   # restored after
    """)
    assert out == ["KeyboardInterrupt", "Terminated", "True"]


def test_deferred_holds_the_signal_until_the_block_ends() -> None:
    out = run_child("""
        import threading
        with stopping.stop_signals_interrupt():
            t = threading.Thread(target=lambda: (stopping.block_in_this_thread(), threading.Event().wait(2)))
            t.start()                                  # a thread of ours must not take it either
            try:
                with stopping.deferred():
                    os.kill(os.getpid(), signal.SIGTERM)
                    sum(range(10 ** 6))                # time to deliver it if it were not blocked
                    print("block-done")
                print("not-raised")
            except stopping.Terminated:
                print("raised-after")
            t.join()
    """)
    assert out == ["block-done", "raised-after"]


def test_stop_requests_only_records_the_request() -> None:
    out = run_child("""
        asked = []
        with stopping.stop_signals_interrupt():
            with stopping.stop_requests(lambda: asked.append(1)):
                os.kill(os.getpid(), signal.SIGTERM)
                os.kill(os.getpid(), signal.SIGINT)
                sum(range(10 ** 6))
                print(len(asked))
            print(signal.getsignal(signal.SIGTERM) is stopping._interrupt)   # the outer handler again
    """)
    assert out == ["2", "True"]


# A stand-in for a bpftrace that missed a SIGINT (bpftrace 0.17 does when the signal lands
# outside its epoll_wait): it acts only on the second one, and says so in its exit status.
# (Not a shell script: a non-interactive bash defers a SIGINT trap while it waits for a
# foreground command, and runs it only if that command died of SIGINT too.)
SECOND_SIGINT = """
import signal, sys, time
seen = []
def on_sigint(signum, frame):
    seen.append(signum)
    if len(seen) >= 2:
        sys.exit(7)
signal.signal(signal.SIGINT, on_sigint)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""
NEVER_STOPS = """
import signal, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def test_bpf_stop_sends_sigint_again_until_the_child_exits() -> None:
    from tools.kvm_utils.sources.bpf import stop
    with subprocess.Popen([sys.executable, "-c", SECOND_SIGINT], stdout=subprocess.PIPE, text=True) as p:  # closes the pipe
        try:
            assert p.stdout.readline() == "ready\n"
            stop(p, every=0.3, give_up=10).join(timeout=20)
            assert p.returncode == 7                        # stopped by the second SIGINT, not killed
        finally:
            if p.poll() is None:
                p.kill()


def test_bpf_stop_kills_a_child_that_never_stops() -> None:
    from tools.kvm_utils.sources.bpf import stop
    with subprocess.Popen([sys.executable, "-c", NEVER_STOPS], stdout=subprocess.PIPE, text=True) as p:  # closes the pipe
        try:
            assert p.stdout.readline() == "ready\n"
            stop(p, every=0.2, give_up=1).join(timeout=20)
            assert p.wait(timeout=5) == -signal.SIGKILL
        finally:
            if p.poll() is None:
                p.kill()
