"""Closing a stuck migration's connections (hostd/apply/streams.py): the parsing on
recorded `ss` output and a /proc tree, and the close itself live on loopback: a child
process blocked sending into a peer that never reads (what a dead link does to QEMU's
NBD and migration streams) gets an error at once when its connection to one address is
closed, and its connection to another address is left alone."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hostd.apply import streams

# `ss -tnHe state connected`, recorded on this machine (loopback, a stream stuck on a dead
# link, a connect retrying its SYN, an IPv6 line)
SS = """\
ESTAB     0      0      127.0.0.1:41773    127.0.0.1:55174 ino:2286008 sk:1 cgroup:/ <->
ESTAB     0      2547000 10.79.0.2:49182   10.79.0.1:49305 timer:(on,12sec,7) ino:4411 sk:9 cgroup:/ <->
SYN-SENT  0      1      10.79.0.2:35222    10.79.0.1:49301 timer:(on,3.2sec,2) ino:4420 sk:b cgroup:/ <->
ESTAB     0      0          [::1]:5432         [::1]:40012 ino:77 sk:a cgroup:/ <->
"""


def test_parse_ss_reads_each_connection_and_its_inode() -> None:
    assert streams.parse_ss(SS) == [
        streams.Conn("127.0.0.1", 41773, "127.0.0.1", 55174, 2286008),
        streams.Conn("10.79.0.2", 49182, "10.79.0.1", 49305, 4411),
        streams.Conn("10.79.0.2", 35222, "10.79.0.1", 49301, 4420),
        streams.Conn("::1", 5432, "::1", 40012, 77)]
    assert streams.parse_ss("") == [] and streams.parse_ss("garbage line\n") == []


def test_uri_host() -> None:
    assert streams.uri_host("tcp://10.79.0.1") == "10.79.0.1"
    assert streams.uri_host("tcp://10.79.0.1:49152") == "10.79.0.1"
    assert streams.uri_host("tcp://[fd00::2]:49152") == "fd00::2"
    assert streams.uri_host("") is None and streams.uri_host("10.0.0.1") is None


def test_qemu_pids_are_found_by_the_domains_uuid_only(tmp_path: Path) -> None:
    uuid = "D65F28BE-a8ef-4c2f-8088-82a486be8efa"
    for pid, argv in {"10": [b"/usr/bin/qemu-system-x86_64", b"-name", b"guest=x", b"-uuid",
                             b"11111111-a8ef-4c2f-8088-82a486be8efa"],
                      "11": [b"/usr/bin/python3", b"-uuid", uuid.lower().encode()],
                      "12": [b"/usr/bin/qemu-system-x86_64", b"-uuid", uuid.lower().encode(), b"-S"],
                      # the target's incoming copy on the same machine (two libvirtd "hosts")
                      "9": [b"/usr/bin/qemu-system-x86_64", b"-uuid", uuid.upper().encode(), b"-incoming", b"defer"]
                      }.items():
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "cmdline").write_bytes(b"\0".join(argv) + b"\0")
    (tmp_path / "self").mkdir()
    assert streams.qemu_pids(uuid, tmp_path) == [9, 12]
    assert streams.qemu_pids("22222222-a8ef-4c2f-8088-82a486be8efa", tmp_path) == []


def test_the_target_address_comes_from_the_migrate_uri_else_the_libvirt_uri() -> None:
    assert streams.target_addresses("tcp://10.79.0.2:49152", "qemu+tls://10.79.0.9/system") == {"10.79.0.2"}
    # no migration_address on the target: libvirt sends the streams to its URI's host
    assert streams.target_addresses("", "qemu+tls://10.79.0.1/system") == {"10.79.0.1"}
    assert streams.target_addresses("", "qemu+tls://localhost/system") >= {"127.0.0.1"}
    # neither names a host: nothing may be closed (it could be the target's own copy)
    assert streams.target_addresses("", "qemu:///system") == set()
    assert streams.target_addresses("", "qemu+tls://no-such-host.invalid/system") == set()
    with pytest.raises(ValueError):
        streams.close_streams(os.getpid(), set())


SENDER = """
import socket, sys, time
a = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
b = socket.create_connection(("127.0.0.2", int(sys.argv[2])))
print("connected", flush=True)
try:
    a.sendall(b"x" * (64 << 20))  # the peer never reads: blocks once both buffers are full
except OSError as e:
    print("a failed", e.errno, flush=True)
b.sendall(b"still here")
print("b ok", flush=True)
"""


def test_close_streams_fails_the_blocked_send_and_spares_other_peers(tmp_path: Path) -> None:
    # root for SOCK_DESTROY, but no machine state touched: not in the machine group
    if os.geteuid() != 0:
        pytest.skip("closing another process's sockets needs CAP_NET_ADMIN")
    la, lb = socket.socket(), socket.socket()
    la.bind(("127.0.0.1", 0))
    lb.bind(("127.0.0.2", 0))
    la.listen()
    lb.listen()
    child = subprocess.Popen([sys.executable, "-c", SENDER, str(la.getsockname()[1]), str(lb.getsockname()[1])],
                             stdout=subprocess.PIPE, text=True)
    try:
        pa, _ = la.accept()
        pb_, _ = lb.accept()
        assert child.stdout.readline().strip() == "connected"
        deadline = time.monotonic() + 30
        while True:  # the child is blocked: its send queue stops growing
            out = subprocess.run(["ss", "-tnHe", "state", "established", "src", "127.0.0.1",
                                  "dst", "127.0.0.1", "dport", "=", f":{la.getsockname()[1]}"],
                                 capture_output=True, text=True, check=True).stdout
            if any(int(line.split()[1]) > 0 for line in out.splitlines()):
                break
            assert time.monotonic() < deadline, out
            time.sleep(0.1)
        closed = streams.close_streams(child.pid, {"127.0.0.1"})
        assert [(c.dst, c.dport) for c in closed] == [("127.0.0.1", la.getsockname()[1])]
        out, _ = child.communicate(timeout=30)
        assert "a failed" in out and "b ok" in out, out
        assert pb_.recv(100) == b"still here"
        pa.close()
        pb_.close()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        la.close()
        lb.close()
