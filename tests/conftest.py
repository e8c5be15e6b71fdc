"""Suite-wide pytest setup: tiers are described in tests/README.md.

Fixtures for integration tests start only what is not running and stop only
what they started (by PID), and remove what they created even when a test fails.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HUGE_2M = Path("/sys/devices/system/node/node0/hugepages/hugepages-2048kB/nr_hugepages")


# Fixtures that change this machine as a whole: a test using one runs in the "machine"
# group, one test at a time, as do the tests marked integration or root.
MACHINE_FIXTURES = frozenset({"libvirtd", "libvirtd_state", "hugetlbfs_2m", "hugepages_2m", "loop_disk"})
# Directories whose integration and root tests touch the machine only where no test outside
# them does: they form a group of their own, one test at a time, beside the machine group.
# kvm-utils' live tests drive the bench helper's tiny guests through /dev/kvm and read the
# host's KVM tracepoints; libvirt's guests in the tests run under TCG (virt_type "qemu")
# and fire none, and no other test makes a kvm-utils ftrace instance.
OWN_GROUPS = {"tests/tools/kvm_utils/": "kvm-host"}


def xdist_group_of(item: pytest.Item) -> str | None:
    """The pytest-xdist group a test runs in (``--dist loadgroup``): its module's own
    ``xdist_group`` mark if it has one (a test that is marked integration but touches
    nothing another test touches, such as a chroot or a QEMU started without libvirt),
    else "machine" for what touches the machine, else its module when it shares a
    module-scoped fixture (made once), else none: xdist hands it to any worker."""
    mark = item.get_closest_marker("xdist_group")
    if mark is not None:
        return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    names = getattr(item, "fixturenames", ())
    if MACHINE_FIXTURES.intersection(names):
        return "machine"
    if _on_postgres(item):
        return "postgres"
    if item.get_closest_marker("integration") or item.get_closest_marker("root"):
        return next((g for d, g in OWN_GROUPS.items() if item.nodeid.startswith(d)), "machine")
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    if any(d.scope in ("module", "class", "package") for ds in defs for d in ds):
        return item.nodeid.split("::")[0]
    return None


def _on_postgres(item: pytest.Item) -> bool:
    """A test on the throwaway PostgreSQL server (tests/scheduler/conftest.py) and nothing
    else of the machine's: they run in their own group, one server for all of them, beside
    the machine group instead of inside it."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    return "pg_server" in getattr(item, "fixturenames", ()) or any(
        str(v).startswith("postgresql") for k, v in params.items() if k in ("db_url", "db_and_lock"))


@pytest.hookimpl(tryfirst=True)  # before xdist reads the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Groups for xdist, long groups first, and the root skip."""
    groups = {}
    for item in items:
        g = groups[item] = xdist_group_of(item) or item.nodeid
        if g != item.nodeid and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(g))
    # The machine group is the longest chain, then the slow ones and OWN_GROUPS' (serial,
    # ~100 s: handed out last, kvm-host once ran after the machine group on the same
    # worker, at the run's end): with --no-loadscope-reorder xdist hands groups out in
    # this order, so the long ones start first and the short ones fill the other
    # worker's gaps.
    weight: dict[str, int] = {}
    for item in items:
        g = groups[item]
        w = 2 if g == "machine" else 1 if item.get_closest_marker("slow") or g == "postgres" or \
            g in OWN_GROUPS.values() else 0
        weight[g] = max(weight.get(g, 0), w)
    # Within a group, quiet tests last: by then the other workers run short tests, so a
    # quiet test waits little for theirs to end (first, it would wait for the longest).
    items.sort(key=lambda it: (-weight[groups[it]], it.get_closest_marker("quiet") is not None))
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="needs root (runs in CI, which is root)")
    for item in items:
        if "root" in item.keywords:
            item.add_marker(skip)


class _GroupsApplied:
    """Under ``--dist loadgroup`` xdist renames each grouped test ``<id>@<group>``; where
    it could not (pytest 9.2 keeps the id elsewhere), the machine tests would run side by
    side on every worker: stop rather than run that way. (A plugin object: the
    conftest's own collection hook runs first, this one last.)"""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        if not getattr(config.option, "loadgroup", False) or "PYTEST_XDIST_WORKER" not in os.environ:
            return
        lost = [it.nodeid for it in items if it.get_closest_marker("xdist_group") and "@" not in it.nodeid]
        if lost:
            raise pytest.UsageError(f"pytest-xdist did not apply the test groups ({len(lost)} tests, e.g. "
                                    f"{lost[0]}): this pytest and pytest-xdist do not work together; "
                                    "see the pins in setup.cfg")


_CPU: dict[str, object] = {}  # "cpu": this worker's WorkerCpu, while the timeline is on


def _interrupted(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def pytest_configure(config: pytest.Config) -> None:
    # A run stopped by SIGTERM (timeout(1) signals the controller and its workers, a CI
    # limit, an operator's kill) ends as Ctrl-C would: the fixtures' teardowns run and
    # stop what they started. Python's default for SIGTERM is to die on the spot, and a
    # killed run left the PostgreSQL group's server running for two hours.
    if threading.current_thread() is threading.main_thread():  # xdist's workers run tests there too
        signal.signal(signal.SIGTERM, _interrupted)
    config.pluginmanager.register(_GroupsApplied(), "hyb-groups-applied")
    controller = not hasattr(config, "workerinput") and getattr(config.option, "numprocesses", None)
    if os.environ.get("HYB_TEST_TIMELINE") and not controller:  # a worker, or a run without xdist
        from tools.dev.suite_cpu import WorkerCpu
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        _CPU["cpu"] = WorkerCpu(f"hyb-suite-{os.getppid() if worker != 'main' else os.getpid()}-{worker}")


def pytest_collection_finish(session: pytest.Session) -> None:
    if "cpu" in _CPU:  # the collection's CPU is no test's
        _CPU["cpu"].since_last()  # type: ignore[attr-defined]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """HYB_TEST_TIMELINE=FILE: one line per test phase, "worker start stop phase cpu nodeid"
    (wall clock; cpu: the CPU seconds of the worker and what it started, since its previous
    line, tools/dev/suite_cpu.py), appended by every worker: what ran beside what, and
    where the CPU went (tests/README.md)."""
    path = os.environ.get("HYB_TEST_TIMELINE")
    if path and getattr(report, "node", None) is None:  # xdist's controller gets a copy with .node
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        cpu = _CPU["cpu"].since_last() if "cpu" in _CPU else None  # type: ignore[attr-defined]
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{worker} {report.start:.3f} {report.stop:.3f} {report.when} "
                    f"{'-' if cpu is None else f'{cpu:.3f}'} {report.nodeid}\n")


def _libvirt_guests() -> list[int]:
    """PIDs of QEMU processes libvirt started for our domains (``-name guest=hyb-...``)."""
    from hostd.apply.streams import qemu_processes
    return [pid for pid, argv in qemu_processes().items() if any(a.startswith(b"guest=hyb-") for a in argv)]


# QEMU guests (PID -> command line) that appeared while one of this worker's machine
# tests ran: this run's, and the only ones a later test waits for.
_OURS: dict[int, bytes] = {}


def _cmdline(pid: int) -> bytes | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None


@pytest.fixture(autouse=True)
def _no_guest_still_exiting(request: pytest.FixtureRequest) -> Iterator[None]:
    """A machine test starts once the guests earlier tests destroyed are gone: QEMU gives
    its hugepages back only as it exits, which under load takes seconds after libvirt's
    destroy returned (a carve's pool write, or a count of pages in use, saw them). A guest
    still running after 30 s is no exit under way but one left behind: the test errors in
    its setup, naming it, rather than run on a machine that is not as it expects. Only
    this run's guests count, by PID: those that appeared while one of its machine tests
    ran (another user's guests on a shared machine are none of its business)."""
    mark = request.node.get_closest_marker("xdist_group")  # set at collection (xdist_group_of)
    if mark is None or mark.args[:1] != ("machine",):
        yield
        return

    def left() -> list[int]:
        for pid, argv in list(_OURS.items()):
            if _cmdline(pid) != argv:  # exited (or its PID reused)
                del _OURS[pid]
        return sorted(_OURS)

    deadline = time.monotonic() + 30
    while left() and time.monotonic() < deadline:
        time.sleep(0.2)
    if still := left():
        def guest(pid: int) -> str:
            argv = (_cmdline(pid) or b"").split(b"\0")
            name = next((a.split(b",")[0].decode() for a in argv if a.startswith(b"guest=")), "?")
            return f"{pid} ({name})"
        pytest.fail("QEMU guests still running 30 s after the tests before destroyed theirs: "
                    + ", ".join(guest(pid) for pid in still), pytrace=False)
    before = set(_libvirt_guests())
    yield
    for pid in set(_libvirt_guests()) - before:
        if (argv := _cmdline(pid)) is not None:
            _OURS[pid] = argv


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[object]:
    """Under pytest-xdist, a test marked ``quiet`` (it measures the machine: CPU time
    on a CPU, latency percentiles, or moves every task of the machine) runs while no
    other worker runs a test: every test holds a shared lock, a quiet one the exclusive
    lock. A turnstile taken before either keeps the other workers from slipping in
    their next test while a quiet one waits. The lock spans the whole protocol, not the
    test's own fixtures only: a module's or session's fixtures are set up in its first
    test's setup and torn down in its last one's teardown (a PostgreSQL server's initdb,
    a scheduler filled with hosts), and in CI those ran beside a quiet test (a process
    born mid-carve stayed on the IO CPU; a delayed sampler read 117 % for a 1-vCPU VM).
    Without xdist this does nothing."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return (yield)
    base = item.config._tmp_path_factory.getbasetemp().parent  # type: ignore[attr-defined]  # the run's, shared
    quiet = item.get_closest_marker("quiet") is not None
    with open(base / "quiet.turnstile", "a") as turn, open(base / "quiet.lock", "a") as lock:
        fcntl.flock(turn, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if quiet else fcntl.LOCK_SH)
        finally:
            if not quiet:
                fcntl.flock(turn, fcntl.LOCK_UN)
        try:
            return (yield)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            fcntl.flock(turn, fcntl.LOCK_UN)


_WARMER: dict[str, object] = {}


def pytest_sessionstart(session: pytest.Session) -> None:
    """``make test`` (HYB_WARM_CACHES=1, as root, on xdist workers): the controller starts
    tools/dev/caches.py, which builds the guest images, the bootstrap's tarball and
    wheels, Placement's venv and the kernel tree beside the tests (a fresh machine has
    none; a warm one finds each in a second). It inherits the quiet tests' lock, locked
    shared here before any worker can take it exclusive, so nothing that measures the
    machine runs beside a build. Without xdist there is no such lock: each test builds
    what it needs itself."""
    config = session.config
    if (os.environ.get("HYB_WARM_CACHES") != "1" or "PYTEST_XDIST_WORKER" in os.environ
            or os.geteuid() != 0 or not getattr(config.option, "numprocesses", None)):
        return
    base = config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]  # the workers' parent
    lock = os.open(base / "quiet.lock", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    fcntl.flock(lock, fcntl.LOCK_SH)
    log = base / "caches.log"
    try:
        with open(log, "w") as out:
            _WARMER["proc"] = subprocess.Popen(
                [str(REPO / ".venv/bin/python"), "-m", "tools.dev.caches", "--quiet-lock-fd", str(lock)],
                cwd=REPO, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, pass_fds=(lock,),
                start_new_session=True)
    finally:
        os.close(lock)  # the child's copy holds the lock now
    _WARMER["log"] = log


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The warmer has normally finished long before the tests; one still building (a run of
    a few tests) is given a minute (an interrupted run: none), then stopped with its
    process group. A worker leaves
    its CPU-accounting cgroup (the timeline's)."""
    if (cpu := _CPU.pop("cpu", None)) is not None:
        cpu.close()  # type: ignore[attr-defined]
    proc = _WARMER.get("proc")
    if not isinstance(proc, subprocess.Popen):
        return
    try:
        proc.wait(0 if session.exitstatus == pytest.ExitCode.INTERRUPTED else 60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    log = _WARMER.get("log")
    if isinstance(log, Path) and log.exists():
        lines = [ln for ln in log.read_text().splitlines() if ln.startswith("caches:")]
        if lines:
            terminalreporter.write_sep("-", "caches built beside the tests (tools/dev/caches.py)")
            for ln in lines:
                terminalreporter.write_line(ln)


@pytest.fixture(scope="session")
def smoke_guest() -> dict[str, Path]:
    """The smoke guest kernel + initramfs, built once (cached) by guestimages/smoke/build.sh
    (tools/dev/caches.py)."""
    from tools.dev.caches import smoke_image
    d = smoke_image()
    return {"kernel": d / "vmlinuz", "initrd": d / "initrd.img"}


@pytest.fixture(scope="session")
def hugetlbfs_2m(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A 2 MiB hugetlbfs mount, held for the session (tools/dev/hugetlbfs.py: made if the
    machine has none, unmounted by its last holder on this machine, whoever made it)."""
    from tools.dev.hugetlbfs import held_2m
    with held_2m() as mnt:
        yield mnt


@pytest.fixture(scope="session")
def libvirtd(hugetlbfs_2m: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """libvirtd + virtlogd for qemu:///system, started after hugetlbfs is mounted
    (libvirtd finds hugetlbfs mounts only at start); stopped at the end if we started them."""
    state = tmp_path_factory.mktemp("libvirtd")
    ctl = str(REPO / "tools/dev/libvirtd-ctl.sh")
    subprocess.run(["bash", ctl, "start", str(state)], check=True)
    _LIBVIRTD_STATE.append(state)  # for tests that restart the libvirtd we started
    why = _libvirtd_cannot_back_hugepages(state)
    if why:
        pytest.fail(why, pytrace=False)
    try:
        yield "qemu:///system"
    finally:
        _destroy_test_domains()
        subprocess.run(["bash", ctl, "stop", str(state)], check=False)


_LIBVIRTD_STATE: list[Path] = []

# A guest's command line built by libvirt without starting QEMU (virsh domxml-to-native):
# libvirt resolves the hugepage backing's path while building it.
_HUGE_PROBE_XML = """<domain type='qemu'><name>hyb-test-hugetlbfs-probe</name><memory unit='KiB'>4096</memory>
<memoryBacking><hugepages><page size='2048' unit='KiB'/></hugepages></memoryBacking><vcpu>1</vcpu>
<os><type arch='x86_64'>hvm</type></os></domain>"""


def _libvirtd_cannot_back_hugepages(state: Path) -> str:
    """Why the running libvirtd cannot back a guest with 2 MiB pages ("" if it can).
    libvirtd looks for hugetlbfs mounts only at start: one started before the mount (by
    hand, or left running by an earlier run that was killed before its teardown) refuses
    every hugepage guest with "hugetlbfs filesystem is not mounted", long after the cause.
    Found once per session here, it is named, and who started it: this run restarts only
    a daemon it started itself."""
    probe = state / "hugetlbfs-probe.xml"
    probe.write_text(_HUGE_PROBE_XML)
    r = subprocess.run(["virsh", "-c", "qemu:///system", "domxml-to-native", "qemu-argv", str(probe)],
                       capture_output=True, text=True, timeout=60, check=False)
    if "hugetlbfs" not in r.stderr:
        return ""
    pid = Path("/run/libvirtd.pid").read_text().strip() if Path("/run/libvirtd.pid").exists() else "?"
    ours = (state / "libvirtd.started").exists()
    return (f"the running libvirtd (PID {pid}, {'started by this run' if ours else 'not started by this run'}) "
            f"cannot back hugepage guests: {r.stderr.strip()}. It was started before a hugetlbfs was mounted "
            "(libvirtd looks for mounts only at start); restart it now that one is mounted")


@pytest.fixture
def libvirtd_state(libvirtd: str) -> Path:
    """tools/dev/libvirtd-ctl.sh's state dir of this session (which daemons it started)."""
    return _LIBVIRTD_STATE[-1]


def _destroy_test_domains() -> None:
    from tools.dev.domains import remove_domains_at

    remove_domains_at("qemu:///system", "hyb-test-")


@pytest.fixture
def hugepages_2m() -> Iterator[callable]:
    """Grow node 0's 2 MiB pool for a test; the old size is restored afterwards, once the
    test's guests have given their pages back (a pool cannot shrink under pages in use:
    written too early, the write is silently partial and the pool stays grown: CI saw a
    later test find 77 pages where the machine had 32)."""
    before = HUGE_2M.read_text().strip()

    def grow(pages: int) -> int:
        HUGE_2M.write_text(str(int(before) + pages))
        return int(HUGE_2M.read_text())

    from tools.dev.procstat import wait_hugepages_free
    try:
        yield grow
    finally:
        used = wait_hugepages_free()
        HUGE_2M.write_text(before)
        now = HUGE_2M.read_text().strip()
        assert now == before, f"node 0's 2 MiB pool left at {now} pages, not {before}: {used} still in use"


def _loop_device(img: Path, size: int) -> Iterator[Path]:
    """A loop device over a sparse file of ``size`` bytes, detached when the generator ends."""
    with open(img, "wb") as f:
        f.truncate(size)
    dev = subprocess.run(["losetup", "--find", "--show", str(img)], check=True,
                         capture_output=True, text=True).stdout.strip()
    try:
        yield Path(dev)
    finally:
        subprocess.run(["losetup", "-d", dev], check=False)


@pytest.fixture
def loop_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 MiB loop device backed by a sparse file; detached afterwards."""
    yield from _loop_device(tmp_path / "disk.img", 256 * 2**20)


@pytest.fixture
def second_loop(loop_disk: Path, tmp_path: Path) -> Iterator[Path]:
    """A second loop device the size of ``loop_disk`` (a live move's target disk)."""
    size = int(subprocess.run(["blockdev", "--getsize64", str(loop_disk)], check=True, capture_output=True,
                              text=True).stdout)
    yield from _loop_device(tmp_path / "disk-b.img", size)
