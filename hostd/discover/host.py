"""Host facts: kernel, CPU model and flags, cgroup version, /dev/kvm, libvirt/QEMU.

Probes that need the real machine (the KVM_GET_API_VERSION ioctl, running
``virsh``/``qemu-system-*``) run only when reading this host (root "/").
A recorded tree stands in for them with ``<root>/.hostd-probe.json``:
``{"kvm": {"present": true, "api_version": 12}, "libvirt_version": "9.0.0",
"qemu_version": "7.2.0"}``; without that file /dev/kvm counts as absent.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from hostd.discover.fs import HostFs
from hostd.discover.model import KvmInfo

log = logging.getLogger(__name__)

PROBE_FILE = ".hostd-probe.json"
KVM_GET_API_VERSION = 0xAE00  # _IO(KVMIO=0xAE, 0x00)
KVM_API_VERSION = 12  # the only version Linux has ever answered
VERSION_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class CpuModel:
    vendor: str
    model: str
    flags: frozenset[str]


def read_cpuinfo(fs: HostFs) -> CpuModel:
    """Vendor, model name and flags of the first processor in /proc/cpuinfo."""
    fields: dict[str, str] = {}
    for line in fs.lines("proc/cpuinfo"):
        if not line.strip():
            if fields:
                break  # end of the first processor's block
            continue
        k, _, v = line.partition(":")
        fields.setdefault(k.strip(), v.strip())
    if not fields:
        return CpuModel("unknown", "unknown", frozenset())
    return CpuModel(fields.get("vendor_id", "unknown"),
                    fields.get("model name") or fields.get("Model") or "unknown",
                    frozenset((fields.get("flags") or fields.get("Features") or "").split()))


def read_arch(fs: HostFs) -> str:
    arch = fs.text("proc/sys/kernel/arch", optional=True)  # Linux >= 5.x
    if arch:
        return arch
    if fs.live:
        return os.uname().machine
    fs.warn("/proc/sys/kernel/arch: missing; architecture unknown")
    return "unknown"


def cgroup_version(fs: HostFs) -> int:
    """1 when a cgroup v1 hierarchy has the cpuset controller (it then cannot be
    on v2), else 2 when the unified hierarchy offers cpuset."""
    v2_mounts = []
    for line in fs.lines("proc/mounts"):
        f = line.split()
        if len(f) < 4:
            continue
        if f[2] == "cgroup" and "cpuset" in f[3].split(","):
            return 1
        if f[2] == "cgroup2":
            v2_mounts.append(f[1])
    for mnt in v2_mounts:
        ctrl = fs.text(f"{mnt.lstrip('/')}/cgroup.controllers", optional=True) or ""
        if "cpuset" in ctrl.split():
            return 2
    fs.warn("no cpuset controller in any cgroup hierarchy (/proc/mounts); carve cannot pin CPUs")
    return 2


def probe_file(fs: HostFs) -> dict:
    text = fs.text(PROBE_FILE, optional=True)
    if text is None:
        return {}
    try:
        data = json.loads(text)
        return data if isinstance(data, dict) else {}
    except json.JSONDecodeError as e:
        fs.warn(f"{PROBE_FILE}: not JSON ({e})")
        return {}


def _kvm_api_version() -> tuple[bool, int | None, str]:
    """Open /dev/kvm and ask KVM_GET_API_VERSION: (present, version, why not)."""
    if not os.path.exists("/dev/kvm"):
        return False, None, "/dev/kvm does not exist (kvm module not loaded?)"
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    except OSError as e:
        return True, None, f"cannot open /dev/kvm: {e.strerror}"
    try:
        return True, fcntl.ioctl(fd, KVM_GET_API_VERSION), ""
    except OSError as e:
        return True, None, f"KVM_GET_API_VERSION failed: {e.strerror}"
    finally:
        os.close(fd)


def kvm_info(fs: HostFs, flags: frozenset[str]) -> KvmInfo:
    hw = "vmx" if "vmx" in flags else "svm" if "svm" in flags else None
    if fs.live:
        present, version, why = _kvm_api_version()
    else:
        rec = probe_file(fs).get("kvm") or {}
        present = bool(rec.get("present"))
        version = rec.get("api_version") if isinstance(rec.get("api_version"), int) else None
        why = "" if rec else f"recorded tree without {PROBE_FILE}: /dev/kvm not probed"
        if rec and present and version is None:
            why = "recorded: KVM_GET_API_VERSION failed"
        if rec and not present:
            why = "recorded: /dev/kvm does not exist"
    usable = present and version == KVM_API_VERSION
    if usable and version is not None and not why:
        why = f"/dev/kvm answers API version {version}"
    elif present and version is not None and version != KVM_API_VERSION:
        why = f"/dev/kvm answers API version {version}, expected {KVM_API_VERSION}"
    cpu = f"CPU has {hw.upper()}" if hw else "CPU has no VMX/SVM (a software hypervisor at best)"
    return KvmInfo(present=present, usable=usable, api_version=version, full_guest_ok=hw is not None,
                   detail=f"{why}; {cpu}")


def virt_warnings(kvm: KvmInfo, virt_type: str) -> list[str]:
    out = []
    if virt_type == "kvm" and not kvm.full_guest_ok:
        out.append("virt_type=kvm but this CPU has no VMX/SVM: KVM cannot run a full Linux guest "
                   "here; use virt_type=qemu")
    elif virt_type == "kvm" and not kvm.usable:
        out.append(f"virt_type=kvm but /dev/kvm is not usable ({kvm.detail}); use virt_type=qemu "
                   "or load kvm_intel/kvm_amd")
    if virt_type == "qemu":
        out.append("virt_type=qemu: guests run under TCG (slow)")
    return out


def _run_version(argv: list[str]) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=VERSION_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        log.warning("version probe argv=%s error=%s", argv[0], e)
        return None
    m = re.search(r"(\d+\.\d+(?:\.\d+)?)", r.stdout)
    return m.group(1) if r.returncode == 0 and m else None


def versions(fs: HostFs, arch: str, probe: bool) -> tuple[str | None, str | None]:
    """(libvirt, QEMU) versions: run the tools when ``probe``, else the recorded
    values of a tree's probe file (None for this host without ``probe``)."""
    if probe:
        return _run_version(["virsh", "--version"]), _run_version([f"qemu-system-{arch}", "--version"])
    if fs.live:
        return None, None
    rec = probe_file(fs)
    lv, qv = rec.get("libvirt_version"), rec.get("qemu_version")
    return (lv if isinstance(lv, str) else None), (qv if isinstance(qv, str) else None)
