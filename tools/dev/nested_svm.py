"""A real KVM with kprobes on a machine that has neither: nested SVM inside a TCG guest.

This machine's /dev/kvm is PVM and its kernel has no kprobes, so kvm-utils' kprobe engine,
its SVM exit tables and the rules fed by `kvm_exit` never ran live here. A QEMU guest under
TCG with ``-cpu max`` emulates an AMD CPU with SVM and NPT; Debian 12's 6.1 kernel (the
online guest image's own vmlinuz/initrd) loads kvm_amd there and has kprobes, fentry and BTF
(measured in ../shared/notes/nested-svm-in-tcg.md). :class:`NestedGuest` boots it:

- the online image's kernel and initrd (tools/dev/caches.online_image, which waits for a
  build already running), its root as a qcow2 overlay (the cached image is never written);
- single-threaded TCG (``-accel tcg,thread=single``): under multi-threaded TCG the guest
  froze in 2 of 4 runs when probes attached while a KVM guest looped (soft lockup at
  ``svm_handle_exit+0x0``), single-threaded passed 9 of 9;
- two read-only ext4 disks (the guest kernel has no 9p; ``mke2fs -d``, no loop mount): the
  *runtime* (this host's Python 3.11 and bpftrace 0.17 with the libraries they link, both
  Debian 12's like the guest; cached under the cache dir by content) and the *work* disk
  (kvm-utils' source, the agent, the static bench helper; built per boot, small);
- init is ``/bin/sh -c`` mounting both and exec'ing tools/dev/nested_agent.py on ttyS1,
  whose other end is a unix socket here: :meth:`NestedGuest.run` sends one command and
  reads its answer, each with a hard timeout; the kernel console goes to a file.

Everything is stopped by PID (QEMU in its own process group) and the temporary directory
removed, also when the boot fails. A boot whose console stays silent ``STALL_S`` seconds
(TCG now and then stalls early in boot) is killed and booted once more.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tools.dev import caches

REPO = caches.REPO
NESTED_CACHE = caches.CACHE / "nested"
# What the runtime disk carries from this host (Debian 12, like the guest image).
PYTHON = Path("/usr/bin/python3.11")
PYLIB = Path("/usr/lib/python3.11")
PYLIB_SKIP = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data", "unittest",
              "site-packages", "dist-packages"}
BPFTRACE = Path("/usr/bin/bpftrace")
# glibc: the guest's own (the same release) serves; a second copy beside it would only risk
# a loader/libc mismatch.
GLIBC = ("libc.so", "libm.so", "libpthread.so", "libdl.so", "librt.so", "ld-linux", "libresolv.so", "libutil.so")
STALL_S = 60
AGENT_PORT = "/dev/ttyS1"


class NestedError(RuntimeError):
    """The nested guest could not be built, booted or driven; the message says which step."""


@dataclass
class Result:
    rc: int | None
    out: str
    err: str
    secs: float
    timed_out: bool

    def json(self) -> dict:
        """The last line of stdout that parses as a JSON object."""
        for line in reversed(self.out.splitlines()):
            line = line.strip()
            if line.startswith("{"):
                try:
                    return json.loads(line)
                except ValueError:
                    continue
        raise NestedError(f"no JSON line in the output (rc {self.rc}):\n{self.out[-2000:]}\n{self.err[-2000:]}")


def _ldd(paths: list[Path]) -> set[Path]:
    libs: set[Path] = set()
    for p in paths:
        r = subprocess.run(["ldd", str(p)], capture_output=True, text=True)
        for line in r.stdout.splitlines():
            parts = line.split("=>")
            if len(parts) == 2 and parts[1].strip().startswith("/"):
                lib = Path(parts[1].split()[0])
                if not lib.name.startswith(GLIBC):
                    libs.add(lib)
    return libs


def _runtime_tree(dst: Path) -> None:
    (dst / "usr/bin").mkdir(parents=True)
    (dst / "lib").mkdir()
    shutil.copy2(PYTHON, dst / "usr/bin/python3")
    shutil.copy2(BPFTRACE, dst / "usr/bin/bpftrace")
    shutil.copytree(PYLIB, dst / "usr/lib" / PYLIB.name, symlinks=True,
                    ignore=lambda d, names: [n for n in names if Path(d) == PYLIB and n in PYLIB_SKIP])
    dynload = sorted((PYLIB / "lib-dynload").glob("*.so"))
    for lib in _ldd([PYTHON, BPFTRACE, *dynload]):
        shutil.copy2(lib, dst / "lib" / lib.name)


def _runtime_key() -> str:
    h = hashlib.sha256(b"nested-runtime-v1")
    for p in (PYTHON, BPFTRACE):
        st = p.stat()
        h.update(f"{p} {st.st_size} {st.st_mtime_ns}".encode())
    h.update(str(sorted(_ldd([PYTHON, BPFTRACE]))).encode())
    return h.hexdigest()[:16]


def _mkfs(src: Path, image: Path, label: str) -> None:
    used = int(subprocess.run(["du", "-sk", str(src)], capture_output=True, text=True, check=True).stdout.split()[0])
    size_k = int(used * 1.3) + 16 * 1024
    image.unlink(missing_ok=True)
    subprocess.run(["truncate", "-s", f"{size_k}K", str(image)], check=True)
    r = subprocess.run(["mke2fs", "-q", "-t", "ext4", "-L", label, "-E", "root_owner=0:0", "-d", str(src),
                        str(image)], capture_output=True, text=True)
    if r.returncode:
        raise NestedError(f"mke2fs -d {src} -> {image} failed: {r.stderr.strip()}")


def runtime_disk(cache: Path = NESTED_CACHE) -> Path:
    """The runtime disk (Python + bpftrace + their libraries), built once per content key."""
    for p in (PYTHON, PYLIB, BPFTRACE):
        if not p.exists():
            raise NestedError(f"{p} missing on this host: the nested guest carries it in (apt-get install "
                              "python3.11 bpftrace)")
    key = _runtime_key()
    image = cache / f"runtime-{key}.ext4"
    with caches.locked(cache / ".runtime.lock"):
        if image.exists():
            return image
        with tempfile.TemporaryDirectory(prefix="nested-runtime-", dir=cache) as d:
            _runtime_tree(Path(d) / "t")
            part = Path(d) / "runtime.ext4"
            _mkfs(Path(d) / "t", part, "nested-rt")
            part.rename(image)
        for old in cache.glob("runtime-*.ext4"):
            if old != image:
                old.unlink(missing_ok=True)
    return image


def static_helper(cache: Path = NESTED_CACHE) -> Path:
    """kvm-utils' bench helper linked statically (the guest has no compiler), by source hash."""
    src = REPO / "tools/kvm_utils/helper/kvm_exit_bench.c"
    exe = cache / f"kvm-exit-bench-static-{hashlib.sha256(src.read_bytes()).hexdigest()[:12]}"
    with caches.locked(cache / ".helper.lock"):
        if not exe.exists():
            part = exe.with_suffix(f".part{os.getpid()}")
            r = subprocess.run(["cc", "-static", "-O2", "-pthread", "-o", str(part), str(src)],
                               capture_output=True, text=True)
            if r.returncode:
                raise NestedError(f"cc -static {src} failed: {r.stderr.strip()[-2000:]}")
            part.rename(exe)
    return exe


def work_disk(image: Path) -> None:
    """kvm-utils' source, the agent and the static helper, as an ext4 image at `image`."""
    with tempfile.TemporaryDirectory(prefix="nested-work-") as d:
        t = Path(d) / "t"
        (t / "tools").mkdir(parents=True)
        shutil.copy2(REPO / "tools/__init__.py", t / "tools/__init__.py")
        shutil.copytree(REPO / "tools/kvm_utils", t / "tools/kvm_utils",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        shutil.copy2(REPO / "tools/dev/nested_agent.py", t / "agent.py")
        shutil.copy2(REPO / "tools/dev/nested_run.py", t / "run.py")
        shutil.copy2(static_helper(), t / "kvm-exit-bench")
        _mkfs(t, image, "nested-work")


def _init_cmd() -> str:
    """PID 1's shell line: no quotes inside (it is one quoted kernel argument)."""
    env = ("PATH=/mnt/usr/bin:/usr/sbin:/usr/bin:/sbin:/bin LD_LIBRARY_PATH=/mnt/lib PYTHONHOME=/mnt/usr "
           "PYTHONDONTWRITEBYTECODE=1 KVM_UTILS_HELPER=/srv/kvm-exit-bench HOME=/root")
    return ("mount -o ro /dev/vdb /mnt && mount -o ro /dev/vdc /srv && mount -t tmpfs tmpfs /tmp && "
            f"cd /srv && exec env {env} /mnt/usr/bin/python3 /srv/agent.py {AGENT_PORT}")


@dataclass
class NestedGuest:
    """One booted nested-SVM guest; :meth:`boot` starts it, :meth:`stop` ends it (by PID)."""
    workdir: Path
    image_dir: Path = field(default_factory=lambda: caches.ONLINE_DIR)
    cpus: int = 2
    mem_mb: int = 2048
    proc: subprocess.Popen | None = None
    sock: socket.socket | None = None
    boot_s: float = 0.0
    boots: int = 0
    _buf: bytes = b""
    _seq: int = 0
    broken: str = ""

    @property
    def console(self) -> Path:
        return self.workdir / "console.log"

    def console_tail(self, n: int = 3000) -> str:
        try:
            return self.console.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def boot(self, timeout: float = 180) -> None:
        """Boot and wait for the agent; once more if the console stalled. NestedError on failure
        (everything started is stopped)."""
        missing = [f for f in ("vmlinuz", "initrd.img", "online.raw") if not (self.image_dir / f).is_file()]
        if missing:
            raise NestedError(f"{self.image_dir}: no {', '.join(missing)} (guestimages/online/build.sh builds them; "
                              "tools/dev/caches.online_image waits for a build already running)")
        runtime = runtime_disk()
        self.workdir.mkdir(parents=True, exist_ok=True)
        work_disk(self.workdir / "work.ext4")
        for attempt in (1, 2):
            try:
                self._boot_once(runtime, timeout)
                return
            except NestedError as e:
                self.stop()
                if "stalled" not in str(e) or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _boot_once(self, runtime: Path, timeout: float) -> None:
        self.boots += 1
        overlay, sock_path = self.workdir / "root.qcow2", self.workdir / "agent.sock"
        overlay.unlink(missing_ok=True)
        sock_path.unlink(missing_ok=True)
        self.console.unlink(missing_ok=True)
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b",
                        str(self.image_dir / "online.raw"), str(overlay)], check=True, capture_output=True)
        cmdline = (f"root=/dev/vda rw console=ttyS0 panic=-1 mitigations=off init=/bin/sh "
                   f'-- -c "{_init_cmd()}"')
        argv = ["qemu-system-x86_64", "-accel", "tcg,thread=single", "-cpu", "max", "-smp", str(self.cpus),
                "-m", str(self.mem_mb), "-display", "none", "-no-reboot", "-nodefaults",
                "-kernel", str(self.image_dir / "vmlinuz"), "-initrd", str(self.image_dir / "initrd.img"),
                "-append", cmdline,
                "-drive", f"file={overlay},format=qcow2,if=virtio",
                "-drive", f"file={runtime},format=raw,if=virtio,readonly=on",
                "-drive", f"file={self.workdir / 'work.ext4'},format=raw,if=virtio,readonly=on",
                "-chardev", f"socket,id=agent,path={sock_path},server=on,wait=off",
                "-serial", f"file:{self.console}", "-serial", "chardev:agent"]
        t0 = time.monotonic()
        with open(self.workdir / "qemu.err", "w") as err:   # QEMU keeps its own descriptor
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                         start_new_session=True)
        deadline = t0 + timeout
        while not sock_path.exists():
            self._check_alive("starting QEMU")
            if time.monotonic() > t0 + 30:
                raise NestedError("QEMU made no agent socket in 30 s")
            time.sleep(0.1)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(sock_path))
        last_size, last_change = 0, time.monotonic()
        while True:
            line = self._readline(min(deadline, time.monotonic() + 1.0))
            if line == "NESTED-AGENT-READY":
                break
            self._check_alive("booting")
            size = self.console.stat().st_size if self.console.exists() else 0
            if size != last_size:
                last_size, last_change = size, time.monotonic()
            elif time.monotonic() - last_change > STALL_S:
                raise NestedError(f"boot stalled: console silent {STALL_S} s; its tail:\n{self.console_tail()}")
            if time.monotonic() > deadline:
                raise NestedError(f"no agent after {timeout:.0f} s; console tail:\n{self.console_tail()}")
        self.boot_s = time.monotonic() - t0

    def _check_alive(self, what: str) -> None:
        if self.proc is None or self.proc.poll() is not None:
            err = (self.workdir / "qemu.err").read_text(errors="replace")[-1500:]
            raise NestedError(f"QEMU exited while {what} (rc {self.proc and self.proc.returncode}): {err}\n"
                              f"console tail:\n{self.console_tail()}")

    def _readline(self, until: float) -> str | None:
        assert self.sock is not None
        while b"\n" not in self._buf:
            left = until - time.monotonic()
            if left <= 0:
                return None
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                return None
            if not chunk:
                raise NestedError(f"agent channel closed; console tail:\n{self.console_tail()}")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode(errors="replace").strip()

    def run(self, cmd: str, timeout: float = 60) -> Result:
        """`cmd` in the guest (sh -c), killed there after `timeout`; the host waits 30 s more,
        then declares the guest wedged (NestedError; later calls fail at once)."""
        if self.broken:
            raise NestedError(f"the nested guest is unusable: {self.broken}")
        if self.sock is None:
            raise NestedError("the nested guest is not booted")
        self._seq += 1
        req = {"id": self._seq, "cmd": cmd, "timeout": timeout}
        self.sock.sendall(json.dumps(req).encode() + b"\n")
        until = time.monotonic() + timeout + 30
        while True:
            line = self._readline(until)
            if line is None:
                self.broken = f"no answer to {cmd!r} in {timeout + 30:.0f} s"
                raise NestedError(f"{self.broken}; console tail:\n{self.console_tail()}")
            if not line.startswith("{"):
                continue
            doc = json.loads(line)
            if doc.get("id") == self._seq:
                return Result(doc["rc"], doc["out"], doc["err"], doc["secs"], doc["timed_out"])
            if doc.get("id") is None:
                raise NestedError(f"agent error: {doc.get('err')}")

    def stop(self) -> None:
        """QEMU's process group: SIGTERM, then SIGKILL after 5 s; the socket closed."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        p, self.proc = self.proc, None
        if p is None:
            return
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
