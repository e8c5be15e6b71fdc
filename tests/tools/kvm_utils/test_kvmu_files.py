"""Record-file header, QEMU argv parsing, /proc and /proc/mounts readers on trees built in tmp_path."""

from __future__ import annotations

import io
from pathlib import Path

from tools.kvm_utils.aggregate import ThreadInfo
from tools.kvm_utils.procs import guest_name, thread_map, vm_processes
from tools.kvm_utils.report import summarize_lines
from tools.kvm_utils.sources import recordfile
from tools.kvm_utils.sources.tracefs import find_tracefs, stale_instances

REPO = Path(__file__).resolve().parents[3]


def test_header_round_trip_and_report_uses_its_threads() -> None:
    h = recordfile.Header(kernel="6.1.0", vendor="intel", started=1.5, duration_s=2.0,
                          events=["kvm_exit"], threads={4101: ThreadInfo(0, "web-1")}, lost_events=3)
    buf = io.StringIO()
    recordfile.write_header(buf, h)
    back = recordfile.Header.from_line(buf.getvalue())
    assert back == h
    body = (REPO / "tests/data/traces/intel-5.15-trace.txt").read_text().splitlines()
    s = summarize_lines([buf.getvalue().rstrip("\n"), *body])
    assert s.source == "record"
    assert [(v.tid, v.vm, v.vcpu) for v in s.vcpus] == [(4101, "web-1", 0), (4102, None, 1)]
    from tools.kvm_utils.diagnose.run import evidence_from_lines
    ev = evidence_from_lines([buf.getvalue().rstrip("\n"), *body], "r.kvmu")
    assert ev.lost_events == 3 and ev.source == "record r.kvmu"   # diagnose says its counts are lower bounds


def test_header_version_mismatch_is_refused() -> None:
    try:
        recordfile.Header.from_line('# kvm-utils-record {"version": 99}')
    except ValueError as e:
        assert "99" in str(e)
    else:
        raise AssertionError("version 99 accepted")


def test_plain_text_has_no_header() -> None:
    header, body = recordfile.split(["# tracer: nop", "x"])
    assert header is None and list(body) == ["# tracer: nop", "x"]


def test_guest_name_forms() -> None:
    assert guest_name(["qemu-system-x86_64", "-name", "guest=web-1,debug-threads=on", "-S"]) == "web-1"
    assert guest_name(["qemu", "-name", "db,,primary,debug-threads=on"]) == "db,primary"
    assert guest_name(["qemu", "-name", "debug-threads=on,guest=x"]) == "x"
    assert guest_name(["qemu", "-m", "1G"]) is None
    assert guest_name(["qemu", "-name"]) is None


def _proc_tree(root: Path) -> Path:
    """A /proc tree as QEMU (libvirt) lays it out: main thread + two vCPU threads + an IO thread."""
    def task(pid: int, tid: int, comm: str) -> None:
        d = root / str(pid) / "task" / str(tid)
        d.mkdir(parents=True)
        (d / "comm").write_text(comm + "\n")
    (root / "900").mkdir(parents=True)
    (root / "900" / "cmdline").write_text("\0".join(["/usr/bin/qemu-system-x86_64", "-name",
                                                     "guest=web-1,debug-threads=on", "-smp", "2"]) + "\0")
    task(900, 900, "qemu-system-x86")
    task(900, 901, "CPU 0/KVM")
    task(900, 902, "CPU 1/KVM")
    task(900, 903, "IO iothread1")
    (root / "77" / "task" / "77").mkdir(parents=True)     # an unrelated process
    (root / "77" / "task" / "77" / "comm").write_text("bash\n")
    (root / "self").mkdir()
    return root


def test_vm_processes_and_thread_map(tmp_path: Path) -> None:
    procs = vm_processes(_proc_tree(tmp_path))
    assert [(p.pid, p.name, p.vcpu_tids) for p in procs] == [(900, "web-1", {901: 0, 902: 1})]
    assert thread_map(procs) == {901: ThreadInfo(0, "web-1"), 902: ThreadInfo(1, "web-1")}


def test_find_tracefs(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text("proc /proc proc rw 0 0\ntracefs /sys/kernel/tracing tracefs rw 0 0\n")
    assert find_tracefs(mounts) == Path("/sys/kernel/tracing")
    mounts.write_text("proc /proc proc rw 0 0\n")
    assert find_tracefs(mounts) is None


def test_stale_instances_are_those_of_dead_pids(tmp_path: Path) -> None:
    inst = tmp_path / "instances"
    for name in ("kvm-utils-1-aaaaaa", "kvm-utils-999999999-bbbbbb", "someone-else"):
        (inst / name).mkdir(parents=True)
    assert stale_instances(tmp_path) == [inst / "kvm-utils-999999999-bbbbbb"]   # pid 1 is alive


def test_kprobe_detection_on_a_tree(tmp_path: Path) -> None:
    """kprobe mode is detected from tracefs' kprobe_events (absent on this kernel)."""
    from tools.kvm_utils.doctor import kprobes_available
    assert kprobes_available(tmp_path).ok is False
    (tmp_path / "kprobe_events").write_text("")
    assert kprobes_available(tmp_path).ok is True
    assert kprobes_available(None).ok is False
