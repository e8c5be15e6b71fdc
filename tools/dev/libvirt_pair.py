"""Two libvirtd "hosts" on one machine, for live-migration tests and the migration bench.

Each host is a libvirtd in its own mount, network and UTS namespace
(tools/dev/libvirtd-ns.sh, under ``unshare -m -n -u --propagation private``) with its own
/etc, /run, /var/lib, /var/log and /var/cache/libvirt bound from a state dir under the
caller's tmp dir, its own ``host_uuid`` (this machine has no SMBIOS UUID: the same one on
both ends reads "Attempt to migrate guest to the same host"), its own hugetlbfs mount, and
its own migration address on a veth pair that links the two network namespaces (made inside
them: nothing is added to the machine's own network namespace). The machine's own libvirtd
(``qemu:///system``, which the rest of the suite uses) and these two never see each other's
sockets, domains, logs or caches.

    with LibvirtPair(tmp_path) as pair:
        pair.a.virsh("define", "dom.xml")
        pair.a.virsh("migrate", "--live", "--p2p", ..., "dom", pair.b.uri, pair.b.migrate_uri)

Clients reach a host through its socket, ``qemu+unix:///system?socket=<dir>/run/libvirt-sock``
(the same path works from inside the other host's mount namespace, so ``--p2p`` works too).
Everything started is tracked by PID: each libvirtd is the process unshare became; QEMU
(which outlives libvirtd) by the pidfiles libvirt writes in the host's run dir. Teardown,
always in ``finally``: destroy and undefine every domain on both hosts, stop each libvirtd
by its PID, kill any QEMU left by its pidfile; the namespaces, mounts and veth go with
their last process.

Used by tests/hostd/migrate/test_libvirt_pair.py and bench/migration.py (libvirt 9.0,
QEMU 7.2, TCG guests). The copy of the machine's QEMU capabilities cache saves each host a
probe of QEMU: both answer within a second of starting.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import time
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from tools.dev.domains import remove_domains

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
NS_SCRIPT = REPO / "tools/dev/libvirtd-ns.sh"
SYSTEM_CAPS_CACHE = Path("/var/cache/libvirt/qemu/capabilities")

LIBVIRTD_CONF = """\
host_uuid = "{host_uuid}"
auth_unix_rw = "none"
auth_unix_ro = "none"
unix_sock_rw_perms = "0700"
unix_sock_ro_perms = "0700"
unix_sock_admin_perms = "0700"
log_outputs = "3:file:/var/log/libvirt/libvirtd.log"
"""

# stdio_handler "file": no virtlogd runs behind the private /run/libvirt, and QEMU's
# output and file-backed serial consoles land under this host's own /var/log/libvirt.
# cgroup_controllers empty: both daemons would number their domains' cgroups from 1 in
# the one hierarchy of this machine; pinning is applied with sched_setaffinity anyway.
QEMU_CONF = """\
user = "root"
group = "root"
dynamic_ownership = 0
remember_owner = 0
security_driver = "none"
stdio_handler = "file"
cgroup_controllers = [ ]
hugetlbfs_mount = "{hugepages}"
migration_address = "{addr}"
migration_host = "{addr}"
migration_port_min = {port_min}
migration_port_max = {port_max}
"""

QEMU_TLS_CONF = """\
migrate_tls_x509_cert_dir = "{pki}"
migrate_tls_x509_verify = 1
"""

# With TLS, each libvirtd also listens for peers' control connections (qemu+tls, port
# 16514) on its veth address, with its host's certificate; a peer dials it presenting
# its own (libvirt's pkipath: hostd's migration_client_pki), checked against the CA.
LIBVIRTD_TLS_CONF = """\
listen_tls = 1
listen_tcp = 0
listen_addr = "{addr}"
key_file = "{pki}/serverkey.pem"
cert_file = "{pki}/servercert.pem"
ca_file = "{pki}/cacert.pem"
"""


@dataclass
class Host:
    """One libvirtd host: its state dir, address on the veth, and the libvirtd process."""

    name: str
    dir: Path
    addr: str
    port_min: int
    proc: subprocess.Popen | None = field(default=None, repr=False)
    pki: Path | None = None  # this host's certificate files (LibvirtPair(tls=True))

    @property
    def uri(self) -> str:
        return f"qemu+unix:///system?socket={self.dir}/run/libvirt-sock"

    @property
    def tls_uri(self) -> str:
        """Where a peer's libvirtd reaches this one over TLS (LibvirtPair(tls=True))."""
        return f"qemu+tls://{self.addr}/system"

    @property
    def migrate_uri(self) -> str:
        """Where QEMU's memory (and, with NBD, disk) stream reaches this host."""
        return f"tcp://{self.addr}"

    @property
    def hugepages(self) -> Path:
        """The hugetlbfs mount inside this host's namespace (an empty dir outside it)."""
        return self.dir / "hugepages"

    @property
    def log_dir(self) -> Path:
        """This host's /var/log/libvirt as seen from the machine."""
        return self.dir / "log"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def virsh(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
        r = subprocess.run(["virsh", "-c", self.uri, *args], capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError(f"virsh on {self.name} {' '.join(args)}: {r.stderr.strip() or r.stdout.strip()}")
        return r

    def in_ns(self, *argv: str) -> subprocess.CompletedProcess:
        """A command in this host's network and UTS namespaces."""
        return subprocess.run(["nsenter", "-t", str(self.pid), "-n", "-u", *argv], check=True,
                              capture_output=True, text=True)

    def qemu_pids(self) -> list[int]:
        """PIDs of the QEMU processes this host's libvirtd started (its pidfiles)."""
        pids = []
        for f in (self.dir / "run/qemu").glob("*.pid"):
            try:
                pid = int(f.read_text().strip())
                argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
            except (OSError, ValueError):
                continue
            if argv0.endswith(b"qemu-system-x86_64"):
                pids.append(pid)
        return pids

    def libvirtd_log(self) -> str:
        p = self.log_dir / "libvirtd.log"
        return p.read_text(errors="replace") if p.exists() else ""


class LibvirtPair:
    """Hosts ``a`` and ``b``, started by :meth:`start` (or ``with``), stopped by :meth:`stop`.

    ``tls``: QEMU's migration streams (memory and NBD) over TLS with certificates from a
    throwaway CA under ``tmp`` (``virsh migrate --tls``)."""

    def __init__(self, tmp: Path, *, subnet: str = "10.77.0", tls: bool = False,
                 start_timeout: float = 120):
        self.tmp = Path(tmp)
        self.tls = tls
        self.start_timeout = start_timeout
        self.a = Host("hyb-mig-a", self.tmp / "host-a", f"{subnet}.1", 49300)
        self.b = Host("hyb-mig-b", self.tmp / "host-b", f"{subnet}.2", 49400)

    @property
    def hosts(self) -> tuple[Host, Host]:
        return self.a, self.b

    def __enter__(self) -> "LibvirtPair":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        if os.geteuid() != 0:
            raise PermissionError("LibvirtPair needs root (namespaces, mounts, libvirtd)")
        pki = make_pki(self.tmp / "pki", self.hosts) if self.tls else None
        for h in self.hosts:
            self._prepare(h, pki)
            self._spawn(h)
        self._link()
        for h in self.hosts:
            self._wait_ready(h)

    def _prepare(self, h: Host, pki: Path | None) -> None:
        for sub in ("etc", "run", "lib", "log/qemu", "cache", "hugepages"):
            (h.dir / sub).mkdir(parents=True, exist_ok=True)
        conf = LIBVIRTD_CONF.format(host_uuid=uuid.uuid4())
        if pki is not None:
            conf += LIBVIRTD_TLS_CONF.format(addr=h.addr, pki=pki / h.name)
            h.pki = pki / h.name
        (h.dir / "etc/libvirtd.conf").write_text(conf)
        conf = QEMU_CONF.format(hugepages=h.hugepages, addr=h.addr, port_min=h.port_min, port_max=h.port_min + 49)
        if pki is not None:
            conf += QEMU_TLS_CONF.format(pki=pki / h.name)
        (h.dir / "etc/qemu.conf").write_text(conf)
        # The same QEMU binary as the machine's libvirtd probed: its capabilities cache
        # is valid here too, and saves a probe of QEMU per host (tens of seconds on a
        # loaded machine). libvirt re-probes if it finds the copy stale.
        if SYSTEM_CAPS_CACHE.is_dir():
            dst = h.dir / "cache/qemu/capabilities"
            dst.mkdir(parents=True, exist_ok=True)
            for f in SYSTEM_CAPS_CACHE.glob("*.xml"):
                shutil.copy2(f, dst / f.name)

    def _spawn(self, h: Host) -> None:
        with open(h.dir / "libvirtd.out", "ab") as out:
            h.proc = subprocess.Popen(
                ["unshare", "-m", "-n", "-u", "--propagation", "private", "--",
                 "bash", str(NS_SCRIPT), str(h.dir), h.name, *([h.addr] if self.tls else [])],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def _link(self) -> None:
        """A veth pair made inside A's network namespace with its peer moved into B's."""
        a, b = self.a, self.b
        deadline = time.monotonic() + 30
        # unshare has made the namespaces once the script runs: wait for its hostname.
        for h in self.hosts:
            while h.in_ns("hostname").stdout.strip() != h.name:
                self._alive(h)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{h.name}: namespace not set up")
                time.sleep(0.05)
        a.in_ns("ip", "link", "add", "mig0", "type", "veth", "peer", "name", "mig0", "netns", str(b.pid))
        for h in self.hosts:
            h.in_ns("ip", "addr", "add", f"{h.addr}/30", "dev", "mig0")
            h.in_ns("ip", "link", "set", "mig0", "up")

    def cut(self) -> None:
        """The link between the hosts cut as a failed switch cuts it: every packet on the
        veth dropped, in both namespaces (no reset, no error: TCP just stops hearing back).
        Each libvirtd's control socket is a file, not on the link: libvirt still talks."""
        for h in self.hosts:
            for chain, way in (("INPUT", "-i"), ("OUTPUT", "-o")):
                h.in_ns("iptables", "-w", "-I", chain, way, "mig0", "-j", "DROP")

    def mend(self) -> None:
        for h in self.hosts:
            for chain, way in (("INPUT", "-i"), ("OUTPUT", "-o")):
                h.in_ns("iptables", "-w", "-D", chain, way, "mig0", "-j", "DROP")

    def _alive(self, h: Host) -> None:
        if h.proc is not None and h.proc.poll() is not None:
            out = (h.dir / "libvirtd.out").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{h.name}: libvirtd exited {h.proc.returncode}:\n{out}\n{h.libvirtd_log()[-2000:]}")

    def _wait_ready(self, h: Host) -> None:
        deadline = time.monotonic() + self.start_timeout
        while True:
            self._alive(h)
            r = subprocess.run(["virsh", "-c", h.uri, "version"], capture_output=True, text=True, timeout=60)
            if r.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{h.name}: libvirtd not answering on {h.uri}: {r.stderr.strip()}")
            time.sleep(0.2)

    def stop(self) -> None:
        """Domains first (QEMU outlives libvirtd), then each libvirtd by its PID, then any
        QEMU still running by its pidfile. Every step runs whatever the one before did."""
        for h in self.hosts:
            try:
                _remove_domains(h)
            except Exception as e:  # keep tearing down
                log.warning("%s: removing domains: %s", h.name, e)
        for h in self.hosts:
            leftover = h.qemu_pids()
            _stop_pid(h.proc)
            for pid in leftover + h.qemu_pids():
                _kill_pid(pid)

    def __repr__(self) -> str:
        return f"LibvirtPair({self.a!r}, {self.b!r})"


def _remove_domains(h: Host) -> None:
    if h.proc is None or h.proc.poll() is not None:
        return
    import libvirt

    libvirt.registerErrorHandler(lambda *_: None, None)  # errors are raised; do not also print them
    conn = libvirt.open(h.uri)
    try:
        remove_domains(conn, abort_jobs=True, undefine_flags=libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)
    finally:
        conn.close()


def _stop_pid(proc: subprocess.Popen | None) -> None:
    """libvirtd by its PID, then whatever it left in its process group (it was started
    as the group's leader; QEMU leaves the group as it daemonizes, and goes by pidfile)."""
    if proc is None:
        return
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)


def make_pki(d: Path, hosts: tuple[Host, ...]) -> Path:
    """A throwaway CA and, per host, the files QEMU's migration TLS reads from its
    ``migrate_tls_x509_cert_dir``, laid out as the bootstrap role lays them out from a
    host's hostd certificate (deploy/ansible/roles/hostd/tasks/migration_tls.yml): one
    certificate per host (extendedKeyUsage serverAuth and clientAuth; SAN: the host's
    migration address, which the source checks) as server-cert.pem and client-cert.pem,
    its key as both keys, the CA as ca-cert.pem."""
    d.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "30",
            "-subj", "/CN=hyb migration test CA", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    for h in hosts:
        hd = d / h.name
        hd.mkdir(exist_ok=True)
        ext = d / f"{h.name}.ext"
        ext.write_text("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                       f"extendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=IP:{h.addr},DNS:{h.name}\n")
        openssl("req", *ec, "-keyout", f"{h.name}/hostd.key", "-out", f"{h.name}.csr", "-subj", f"/CN={h.name}")
        openssl("x509", "-req", "-in", f"{h.name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{h.name}/hostd.crt", "-days", "30", "-extfile", ext.name)
        # QEMU's names (migrate_tls_x509_cert_dir), then libvirtd's and its client's (pkipath)
        for dest, src in (("ca-cert.pem", d / "ca.crt"), ("server-cert.pem", hd / "hostd.crt"),
                          ("client-cert.pem", hd / "hostd.crt"), ("server-key.pem", hd / "hostd.key"),
                          ("client-key.pem", hd / "hostd.key"), ("cacert.pem", d / "ca.crt"),
                          ("servercert.pem", hd / "hostd.crt"), ("serverkey.pem", hd / "hostd.key"),
                          ("clientcert.pem", hd / "hostd.crt"), ("clientkey.pem", hd / "hostd.key")):
            shutil.copy(src, hd / dest)
    return d


# --- The guest the migration tests and bench move, and libvirt's own migration -------------

GUEST_XML = """\
<domain type="qemu">
  <name>{name}</name>
  <uuid>{uuid}</uuid>
  <memory unit="MiB">{memory_mib}</memory>
  <memoryBacking><hugepages><page size="2" unit="M"/></hugepages></memoryBacking>
  <vcpu placement="static">1</vcpu>
  <cputune><vcpupin vcpu="0" cpuset="{vcpu_pin}"/><emulatorpin cpuset="{emulator_pin}"/></cputune>
  <os>
    <type arch="x86_64" machine="q35">hvm</type>
    <kernel>{kernel}</kernel>
    <initrd>{initrd}</initrd>
    <cmdline>console=ttyS0 panic=-1 hyb.tick=1</cmdline>
  </os>
  <on_reboot>destroy</on_reboot>
  <devices>
    <disk type="block" device="disk">
      <driver name="qemu" type="raw" cache="none" io="native"/>
      <source dev="{disk}"/>
      <target dev="vda" bus="virtio"/>
      <iotune>{iotune}</iotune>
    </disk>
    <serial type="file">
      <source path="{serial}" append="on"/>
      <target port="0"/>
    </serial>
    <memballoon model="none"/>
  </devices>
</domain>
"""


def serial_path(name: str) -> str:
    """The guest's serial log as its host sees it: under /var/log/libvirt, which is each
    host's own dir (``Host.log_dir / "qemu" / ...`` from the machine), so one path in
    the XML is a separate file on each host."""
    return f"/var/log/libvirt/qemu/{name}.serial"


def host_serial(h: Host, name: str) -> Path:
    return h.log_dir / "qemu" / f"{name}.serial"


def guest_xml(*, name: str, kernel: Path, initrd: Path, disk: Path, memory_mib: int = 128,
              vcpu_pin: str = "0", emulator_pin: str = "0", iotune: dict[str, int] | None = None,
              guest_uuid: str | None = None) -> str:
    """The smoke guest with its ticker (``hyb.tick=1``), 2 MiB hugepage-backed memory, one
    pinned vCPU, a raw block disk with QEMU throttles, the serial console in a file. A
    reboot destroys it, so a guest that reset cannot pass for one that kept running."""
    tune = "".join(f"<{k}>{v}</{k}>" for k, v in (iotune or {}).items())
    return GUEST_XML.format(name=name, uuid=guest_uuid or uuid.uuid4(), memory_mib=memory_mib, vcpu_pin=vcpu_pin,
                            emulator_pin=emulator_pin, kernel=kernel, initrd=initrd, disk=disk, iotune=tune,
                            serial=serial_path(name))


def retarget_xml(migratable: str, *, disk: Path, vcpu_pin: str, emulator_pin: str,
                 iotune: dict[str, int]) -> str:
    """The source's ``dumpxml --migratable`` rewritten for the target: its own disk (the
    same size), its pinning and its throttles; everything else as the source runs it, so
    libvirt's ABI check passes."""
    root = ET.fromstring(migratable)
    d = root.find("./devices/disk[@device='disk']")
    assert d is not None, "no disk"
    d.find("source").set("dev", str(disk))  # type: ignore[union-attr]
    tune = d.find("iotune")
    if tune is None:
        tune = ET.SubElement(d, "iotune")
    for child in list(tune):
        tune.remove(child)
    for k, v in iotune.items():
        ET.SubElement(tune, k).text = str(v)
    ct = root.find("cputune")
    assert ct is not None, "no cputune"
    for pin in ct.findall("vcpupin"):
        pin.set("cpuset", vcpu_pin)
    ct.find("emulatorpin").set("cpuset", emulator_pin)  # type: ignore[union-attr]
    return ET.tostring(root, encoding="unicode")


def migrate_argv(name: str, target_xml: Path, dest: Host, *, bandwidth_mib: int | None, tls: bool,
                 timeout_s: int = 300) -> list[str]:
    """``virsh migrate`` arguments (after ``-c SOURCE``) for the live move the issue
    names: peer to peer, raw disk copied over NBD, the target's XML live and persistent,
    the source undefined, a bandwidth cap for memory and disk, auto-converge, and a
    bound on time (the guest is paused to finish after ``timeout_s``)."""
    argv = ["migrate", "--live", "--p2p", "--copy-storage-all", "--persistent", "--undefinesource",
            "--xml", str(target_xml), "--persistent-xml", str(target_xml), "--migrate-disks", "vda",
            "--auto-converge", "--timeout", str(timeout_s), "--timeout-suspend"]
    if bandwidth_mib:
        argv += ["--bandwidth", str(bandwidth_mib)]
    if tls:
        argv += ["--tls"]
    return argv + [name, dest.uri, dest.migrate_uri]


def job_stats(text: str) -> dict[str, str]:
    """``virsh domjobinfo`` output as {field: value text}."""
    out = {}
    for line in text.splitlines():
        k, sep, v = line.partition(":")
        if sep:
            out[k.strip()] = v.strip()
    return out


def job_ms(stats: dict[str, str], key: str) -> float:
    """A time field of :func:`job_stats` ("Time elapsed", "Total downtime") in ms."""
    value, unit = stats[key].split()
    assert unit == "ms", stats[key]
    return float(value)
