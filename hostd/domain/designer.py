"""The domain designer: the one place that decides what a VM's libvirt domain
looks like (nova's ``designer.py`` to ``elements.py``'s ``config.py``).

Inputs are what hostd already knows: the claim (``hostd/carve/vmclaim.py``: exact CPUs,
emulator CPUs, hugepage size and node, VFs, disks), the VM spec (``hostd/carve/vmspec.py``),
how to boot it, and facts about this host (``HostFacts``). ``design()`` is pure
and refuses, naming the field, anything it cannot turn into a domain libvirt
would run as asked; ``check_host()`` is the small IO part (are the disk sources
block devices, do the kernel files exist); ``design_domain(metadata, image,
facts)`` is what hostd calls before defining (both, plus the console log
directory in hostd's own state dir).

Policy, decision by decision (each one shows in the golden files):

- vCPU i is pinned to ``claim.vcpu_pins[i]``, 1:1, in order; the emulator thread
  and every IO thread are pinned to ``claim.emulator_cpus`` (shared host CPUs,
  the VM's own CPUs, or a dedicated core, per the claim's emulator policy), so
  QEMU's own work never lands on another VM's or the IO service's CPUs.
- Guest RAM: hugepages of the claimed size, ``<numatune>`` strict on the claimed
  host node (no silent fallback to a remote node), ``<nosharepages/>`` (no KSM
  scanning of guest RAM), and ``<locked/>`` when the host allows it: hugetlbfs
  pages are never swapped anyway, locking also keeps QEMU's own allocations
  resident under the IO service's memory pressure. libvirt implements it by
  raising QEMU's RLIMIT_MEMLOCK to unlimited, which a container or a libvirtd
  without CAP_SYS_RESOURCE refuses (this development machine: "cannot limit
  locked memory"), so it is a host fact (``lock_memory``), on by default.
- Guest NUMA cells: a VM spanning host nodes (``claim.cells``) gets one guest
  cell per host node, in claim order: cell i holds the next vCPUs of the claim
  (pinned on that node) and that node's pages, and ``<memnode cellid=i>`` binds
  its memory strictly to that node. Always, not only with ``guest_numa``: with
  one ``<memory nodeset='0-1'>`` and no cells the kernel would take the pages
  from either node in any proportion, and the per-node page counts of the claim
  (and the scheduler's) would be wrong. A one-node VM gets one cell with every
  vCPU and all RAM when ``spec.guest_numa`` asks for it. With cells the hugepage
  ``nodeset`` names the guest cells; without, ``<page>`` carries no nodeset
  (libvirt reads it as guest cells and would refuse).
- CPU model: ``kvm`` -> ``host-passthrough`` with ``migratable='off'`` (pinned,
  never migrated VMs: the guest sees invariant TSC, a reliable clocksource) and
  no vPMU (monitoring is vPMU-free; PMU MSR exits cost latency). ``qemu`` (TCG)
  cannot pass a host CPU through (libvirt refuses host-passthrough there), so
  ``maximum`` (QEMU's ``-cpu max``: everything TCG can emulate).
  Topology: one socket; SMT threads per core mirror the host when the pins are
  whole sibling groups in order, so the guest scheduler sees the real pairs.
- Disks: the claimed raw block device, ``cache='none' io='native'`` (no host
  page cache or journal between guest and device), one IO thread each, serial =
  the host disk name, or the name the guest knew it by on the host it migrated from (the
  guest finds ``/dev/disk/by-id/virtio-<name>``), and
  the spec's ``<iotune>`` (throttle groups included).
- VFs: ``<interface type='hostdev' managed='yes'>`` with the spec's MAC and VLAN
  (the tx rate is set on the PF through netlink, not in XML). A VF that may move live
  (``migration``, api/states.py ``VfMigration``) carries a user alias ``ua-vf<i>``, by
  which a move finds it to unplug and plug. ``failover``: QEMU's virtio-net failover
  pair, the standby first: ``<interface type='bridge'>`` on the host's
  ``failover_bridge``, virtio, the VF's MAC, ``<teaming type='persistent'/>``, alias
  ``ua-vf<i>-standby``; the VF as primary with ``<teaming type='transient'
  persistent='ua-vf<i>-standby'/>``. A host without a failover bridge refuses it
  (``vfs[i].migration``).
- Serial console on a pty (``virsh console`` works) logged to
  ``<console_dir>/<name>/console.log`` (``console_dir`` is ``<state_dir>/vms``);
  no USB, no balloon (hugepage RAM is not given back by ballooning), a virtio
  RNG; ACPI/APIC on.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

from hostd.carve.vmclaim import Claim, ClaimCell
from hostd.carve.vmspec import IoTune as SpecIoTune
from hostd.carve.vmspec import VmSpec
from api.states import VfMigration
from hostd.cpulist import format_cpu_list
from hostd.domain.elements import (
    Chardev,
    Clock,
    Controller,
    Cpu,
    CpuTopology,
    CpuTune,
    Devices,
    Disk,
    DiskDriver,
    Domain,
    ElementError,
    Features,
    BridgeInterface,
    HostdevInterface,
    HugePage,
    Interface,
    IoThreadPin,
    IoTune,
    MemBalloon,
    MemNode,
    MemoryBacking,
    NumaCell,
    NumaTune,
    Os,
    PciAddress,
    Rng,
    Teaming,
    Timer,
    VcpuPin,
)
from hostd.domain.image import Image
from hostd.domain.metadata import VmMetadata
from hostd.errors import DomainDesignError

VIRT_TYPES = ("kvm", "qemu")
_DISK_NAME_RE = re.compile(r"[A-Za-z0-9_.:+-]{1,20}")  # virtio-blk serial: 20 bytes
_MAC_RE = re.compile(r"([0-9a-f]{2}:){5}[0-9a-f]{2}")


@dataclass(frozen=True)
class HostFacts:
    """What the designer needs to know about this host (from config + discovery)."""

    virt_type: str  # "kvm" on real hosts, "qemu" (TCG) where /dev/kvm cannot boot Linux
    console_dir: Path  # <state_dir>/vms: a VM's serial log is <console_dir>/<name>/console.log
    lock_memory: bool = True  # <locked/>; False where RLIMIT_MEMLOCK cannot be raised
    machine: str = "q35"
    arch: str = "x86_64"
    emulator: str | None = None  # QEMU binary; None: libvirt's default for the virt type
    dev_dir: str = "/dev"  # claimed disks are kernel names under this directory
    siblings: Mapping[int, tuple[int, ...]] = field(default_factory=dict)  # SMT siblings per CPU
    vf_pci: Mapping[tuple[str, int], str] = field(default_factory=dict)  # (pf, vf index) -> PCI
    root: Path = Path("/")  # prefix for /dev reads in check_host (a recorded host tree in tests)
    failover_bridge: str = ""  # the bridge a failover VF's virtio-net standby joins; "" = none here


@dataclass(frozen=True)
class Boot:
    """How the guest boots: a kernel (+initrd, cmdline), a root disk image with its
    own bootloader, or both (direct kernel boot of a root filesystem image, as the
    guestimages/ online image does). The root disk is a per-VM file: the caller
    makes the copy or overlay (hostd: a qcow2 overlay per VM)."""

    kernel: str | None = None
    initrd: str | None = None
    cmdline: str | None = None
    disk: str | None = None
    disk_format: str = "raw"

    @classmethod
    def from_image(cls, image: Image) -> "Boot":
        kernel = dict(kernel=image.files.get("kernel"), initrd=image.files.get("initrd"),
                      cmdline=(image.cmdline or None) if "kernel" in image.files else None)
        if image.kind == "kernel":
            return cls(**kernel)
        return cls(disk=image.files["disk"], disk_format=image.format, **kernel)


def _refuse(field_: str, reason: str) -> DomainDesignError:
    return DomainDesignError(reason, field=field_)


# -- the design ---------------------------------------------------------------

def design(*, vm_id: str, spec: VmSpec, claim: Claim, boot: Boot, host: HostFacts,
           metadata: tuple[str, ...] = ()) -> Domain:
    """The domain for ``spec`` on the resources of ``claim``; pure."""
    _check_inputs(spec, claim, boot, host)
    cells = claim.numa_cells if spec.guest_numa or claim.spans else ()
    host_nodes = format_cpu_list(sorted(c.node for c in claim.numa_cells))
    memory_kib = spec.memory_mib * 1024
    iothreads = len(claim.disks)
    emu = format_cpu_list(claim.emulator_cpus)
    return Domain(
        type=host.virt_type, name=spec.name, uuid=vm_id, memory_kib=memory_kib, vcpus=spec.vcpus,
        metadata=metadata,
        memory_backing=MemoryBacking(
            hugepages=(HugePage(claim.size_kb, format_cpu_list(range(len(cells))) if cells else None),),
            nosharepages=True, locked=host.lock_memory),
        iothreads=iothreads,
        cputune=CpuTune(vcpupins=tuple(VcpuPin(i, str(c)) for i, c in enumerate(claim.vcpu_pins)),
                        emulatorpin=emu,
                        iothreadpins=tuple(IoThreadPin(i + 1, emu) for i in range(iothreads))),
        numatune=NumaTune("strict", host_nodes,
                          tuple(MemNode(i, "strict", str(c.node)) for i, c in enumerate(cells))),
        os=Os(type="hvm", arch=host.arch, machine=host.machine, kernel=boot.kernel,
              initrd=boot.initrd, cmdline=boot.cmdline, boot=("hd",) if boot.disk else ()),
        features=Features(acpi=True, apic=True, pmu=False if host.virt_type == "kvm" else None),
        cpu=_cpu(spec, claim, host, cells),
        clock=Clock("utc", (Timer("rtc", tickpolicy="catchup"), Timer("pit", tickpolicy="delay"),
                            Timer("hpet", present=False))),
        on_poweroff="destroy", on_reboot="restart", on_crash="destroy",
        devices=Devices(
            emulator=host.emulator,
            disks=_disks(spec, claim, boot, host),
            controllers=(Controller("usb", model="none"),),
            interfaces=_interfaces(spec, claim, host),
            serials=(Chardev("serial", "pty", log_file=str(console_log(host, spec.name)),
                             log_append=True, target_port=0),),
            consoles=(Chardev("console", "pty", target_type="serial", target_port=0),),
            memballoon=MemBalloon("none"),
            rngs=(Rng("virtio", "random", "/dev/urandom"),)))


def console_log(host: HostFacts, name: str) -> Path:
    return host.console_dir / name / "console.log"


def _cpu(spec: VmSpec, claim: Claim, host: HostFacts, cells: tuple[ClaimCell, ...]) -> Cpu:
    threads = _threads_per_core(claim.vcpu_pins, host.siblings)
    topo = CpuTopology(sockets=1, cores=spec.vcpus // threads, threads=threads)
    numa, first = [], 0
    for i, c in enumerate(cells):  # cell i: the next c.vcpus vCPUs
        numa.append(NumaCell(i, format_cpu_list(range(first, first + c.vcpus)), c.pages * claim.size_kb))
        first += c.vcpus
    if host.virt_type == "kvm":
        return Cpu(mode="host-passthrough", check="none", migratable=False, topology=topo, cells=tuple(numa))
    return Cpu(mode="maximum", check="none", migratable=False, topology=topo, cells=tuple(numa))


def _threads_per_core(pins: tuple[int, ...], siblings: Mapping[int, tuple[int, ...]]) -> int:
    """SMT width to show the guest: the host's, when the pins are whole sibling
    groups of that width in order (claims picks whole cores first); else 1."""
    if not pins or not siblings:
        return 1
    width = len(set(siblings.get(pins[0], (pins[0],))) | {pins[0]})
    if width < 2 or len(pins) % width:
        return 1
    for i in range(0, len(pins), width):
        group = pins[i:i + width]
        if set(group) != set(siblings.get(group[0], (group[0],))) | {group[0]}:
            return 1
    return width


def _disks(spec: VmSpec, claim: Claim, boot: Boot, host: HostFacts) -> tuple[Disk, ...]:
    out: list[Disk] = []
    if boot.disk:
        out.append(Disk(boot.disk, "vda", type="file",
                        driver=DiskDriver("qemu", boot.disk_format, cache="none", io="native")))
    for i, (cd, ds) in enumerate(zip(claim.disks, spec.disks)):
        iotune = _iotune(ds.iotune)
        out.append(Disk(f"{host.dev_dir.rstrip('/')}/{cd.name}", _target(len(out)), "virtio",
                        type="block", device="disk",
                        driver=DiskDriver("qemu", "raw", cache="none", io="native", iothread=i + 1),
                        serial=ds.serial or cd.name, iotune=iotune))
    return tuple(out)


def _target(index: int) -> str:
    """vda, vdb, ... vdz, vdaa (as libvirt names them)."""
    name = ""
    index += 1
    while index:
        index, r = divmod(index - 1, 26)
        name = chr(ord("a") + r) + name
    return "vd" + name


def _iotune(t: SpecIoTune) -> IoTune | None:
    known = {f.name for f in fields(IoTune)}
    values = {f.name: getattr(t, f.name) for f in fields(t) if f.name in known}
    return IoTune(**values) if any(values.values()) else None


def _interfaces(spec: VmSpec, claim: Claim, host: HostFacts) -> tuple[Interface, ...]:
    out: list[Interface] = []
    for i, v in enumerate(claim.vfs):
        primary = vf_interface(spec, claim, host.vf_pci, i)
        if primary.teaming is not None and not host.failover_bridge:
            raise _refuse(f"vfs[{i}].migration", "failover needs a standby network on this host, and it has none: "
                          "set failover_bridge in hostd's config (the bridge the virtio-net standby joins), "
                          "or ask for interrupt (the VF is unplugged for a move)")
        if primary.teaming is not None:
            out.append(BridgeInterface(host.failover_bridge, v.mac, "virtio", Teaming("persistent"),
                                       standby_alias(i)))
        out.append(primary)
    return tuple(out)


def vf_alias(i: int) -> str:
    """The user alias of VF i of a VM whose VF may move (libvirt: ``ua-`` and a name)."""
    return f"ua-vf{i}"


def standby_alias(i: int) -> str:
    return f"ua-vf{i}-standby"


def vf_interface(spec: VmSpec, claim: Claim, vf_pci: Mapping[tuple[str, int], str], i: int) -> HostdevInterface:
    """VF i of the claim as its ``<interface type='hostdev'>``: what the domain holds,
    and what a move that interrupts the VF unplugs on the source and plugs on the target."""
    v = claim.vfs[i]
    mode = spec.vfs[i].migration if i < len(spec.vfs) else VfMigration.NONE
    teaming = Teaming("transient", standby_alias(i)) if mode == VfMigration.FAILOVER else None
    return HostdevInterface(PciAddress.parse(vf_pci[(v.pf, v.index)]), mac=v.mac,
                            vlan_tags=(v.vlan,) if v.vlan else (), managed=True, teaming=teaming,
                            alias=vf_alias(i) if mode != VfMigration.NONE else None)


# -- refusals -----------------------------------------------------------------

def _check_inputs(spec: VmSpec, claim: Claim, boot: Boot, host: HostFacts) -> None:
    if host.virt_type not in VIRT_TYPES:
        raise _refuse("virt_type", f"{host.virt_type!r} is not one of {', '.join(VIRT_TYPES)}")
    if not host.console_dir.is_absolute():
        raise _refuse("console_dir", f"{host.console_dir} is not an absolute path")
    if len(claim.vcpu_pins) != spec.vcpus:
        raise _refuse("claim.vcpu_pins", f"{len(claim.vcpu_pins)} CPUs claimed for {spec.vcpus} vCPUs")
    if len(set(claim.vcpu_pins)) != len(claim.vcpu_pins):
        raise _refuse("claim.vcpu_pins", "a host CPU is pinned to two vCPUs")
    if not claim.emulator_cpus:
        raise _refuse("claim.emulator_cpus", "no CPU for the emulator and IO threads")
    if claim.emulator_dedicated and set(claim.emulator_cpus) & set(claim.vcpu_pins):
        raise _refuse("claim.emulator_cpus", "a dedicated emulator CPU is also a vCPU's CPU")
    if claim.pages * claim.size_kb != spec.memory_mib * 1024:
        raise _refuse("claim.pages", f"{claim.pages} x {claim.size_kb} KiB pages do not make "
                                     f"memory_mib={spec.memory_mib}")
    if claim.node < 0:
        raise _refuse("claim.node", f"{claim.node} is not a NUMA node")
    if claim.cells:
        nodes = [c.node for c in claim.cells]
        if len(set(nodes)) != len(nodes) or min(nodes) < 0:
            raise _refuse("claim.cells", f"host nodes {nodes}: each cell needs its own node")
        if any(c.vcpus < 1 or c.pages < 1 for c in claim.cells):
            raise _refuse("claim.cells", "every guest NUMA cell needs a vCPU and memory")
        if sum(c.vcpus for c in claim.cells) != len(claim.vcpu_pins):
            raise _refuse("claim.cells", f"the cells hold {sum(c.vcpus for c in claim.cells)} vCPUs, "
                                         f"{len(claim.vcpu_pins)} are pinned")
        if sum(c.pages for c in claim.cells) != claim.pages:
            raise _refuse("claim.cells", f"the cells hold {sum(c.pages for c in claim.cells)} pages, "
                                         f"the claim {claim.pages}")
    _check_boot(boot)
    if len(claim.disks) != len(spec.disks):
        raise _refuse("disks", f"{len(spec.disks)} disks asked, {len(claim.disks)} claimed")
    for i, (cd, ds) in enumerate(zip(claim.disks, spec.disks)):
        serial = ds.serial or cd.name
        if not _DISK_NAME_RE.fullmatch(serial) or serial in (".", ".."):
            raise _refuse(f"disks[{i}].{'serial' if ds.serial else 'disk'}",
                          f"{serial!r} is not {'' if ds.serial else 'a kernel disk name '}usable as a "
                          "virtio serial (1-20 of A-Z a-z 0-9 _ . : + -)")
        bad = ds.iotune.check(f"disks[{i}].iotune")  # the group name's bound included
        if bad:
            raise _refuse(*bad)
    for i, v in enumerate(claim.vfs):
        if (v.pf, v.index) not in host.vf_pci:
            raise _refuse(f"vfs[{i}]", f"no PCI address known for {v.pf} VF {v.index}")
        try:
            PciAddress.parse(host.vf_pci[(v.pf, v.index)])
        except ElementError as e:
            raise _refuse(f"vfs[{i}]", str(e)) from None
        if not _MAC_RE.fullmatch(v.mac):
            raise _refuse(f"vfs[{i}].mac", f"{v.mac!r} is not a lower-case MAC address (a VF needs a "
                                           "fixed MAC, or it changes on every define)")
        if not 0 <= v.vlan <= 4094:
            raise _refuse(f"vfs[{i}].vlan", "must be 0 (untagged) to 4094")
    for i, sv in enumerate(spec.vfs):
        if sv.migration not in set(VfMigration):
            raise _refuse(f"vfs[{i}].migration", f"{sv.migration!r} is not one of {', '.join(VfMigration)}")


def _check_boot(boot: Boot) -> None:
    if not boot.kernel and not boot.disk:
        raise _refuse("image", "needs a kernel, a root disk, or both")
    if (boot.initrd or boot.cmdline) and not boot.kernel:
        raise _refuse("image.kernel", "an initrd or cmdline needs a kernel")
    for name in ("kernel", "initrd", "disk"):
        p = getattr(boot, name)
        if p is not None and not os.path.isabs(p):
            raise _refuse(f"image.{name}", f"{p!r} is not an absolute path")
    if boot.disk and boot.disk_format not in ("raw", "qcow2"):
        raise _refuse("image.format", f"{boot.disk_format!r} is not raw or qcow2")


def check_host(domain: Domain, *, root: Path = Path("/")) -> None:
    """The IO half of validation, on the designed domain: block disk sources are
    block devices (read under ``root``, like every /dev and /sys read of hostd:
    a recorded host tree in tests); image files and kernels, hostd's own files,
    are regular files."""
    for d in domain.devices.disks:
        where = f"disk {d.target_dev} ({d.source})"
        path = root / d.source.lstrip("/") if d.type == "block" else Path(d.source)
        field_ = f"disks.{d.serial or d.target_dev}" if d.type == "block" else "image.disk"
        try:
            mode = path.stat().st_mode
        except OSError as e:
            raise _refuse(field_, f"{where}: {e.strerror}") from None
        if d.type == "block" and not stat.S_ISBLK(mode):
            raise _refuse(field_, f"{where} is not a block device (raw block devices only)")
        if d.type == "file" and not stat.S_ISREG(mode):
            raise _refuse(field_, f"{where} is not a regular file")
    for name in ("kernel", "initrd"):
        p = getattr(domain.os, name)
        if p is not None and not Path(p).is_file():
            raise _refuse(f"image.{name}", f"{p} is not a file")


# -- what hostd calls ---------------------------------------------------------

def design_domain(md: VmMetadata, image: Image, host: HostFacts) -> Domain:
    """VmManager's ``render`` step: the domain for ``md`` (claim + spec, with its
    metadata element), checked against the host's files, with the console log
    directory made. ``design_domain(...).to_xml()`` is what libvirt defines."""
    dom = design(vm_id=md.vm_id, spec=md.spec, claim=md.claim, boot=Boot.from_image(image),
                 host=host, metadata=(md.to_xml(),))
    check_host(dom, root=host.root)
    log_dir = console_log(host, md.spec.name).parent
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _refuse("console_dir", f"cannot make {log_dir}: {e.strerror}") from None
    return dom
