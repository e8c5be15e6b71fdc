"""libvirt domain XML element classes: objects <-> XML, nothing else.

One small frozen dataclass per element (virt-manager's ``virtinst/devices/*.py`` is
the model), each with ``to_element()``/``from_element()`` (the ElementTree form)
and ``to_xml()``/``from_xml()`` (text). Reading takes back exactly what writing
produces, and ignores what libvirt adds that we do not model (aliases, PCI
addresses of our devices, seclabels, ...).
No defaults are invented here and nothing is decided: every value is what the
caller set, and an unset (``None``/empty) value writes no XML. Policy lives in
``hostd/domain/designer.py``.

Sizes are in KiB everywhere (``unit='KiB'`` is written explicitly); on reading,
other units are converted so a libvirt-formatted domain parses too.
"""

from __future__ import annotations

import io
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass

from hostd.domain.devices import (  # noqa: F401
    BridgeInterface,
    Chardev,
    Controller,
    Devices,
    Disk,
    DiskDriver,
    HostdevInterface,
    Interface,
    IoTune,
    MemBalloon,
    PciAddress,
    Rng,
    Teaming,
)
from hostd.domain.xmlutil import ElementError, XmlElement, need, opt_int, req_int, sub, to_kib, yes

# -- <os> ---------------------------------------------------------------------

@dataclass(frozen=True)
class Os(XmlElement):
    type: str = "hvm"
    arch: str | None = None
    machine: str | None = None
    kernel: str | None = None  # direct kernel boot
    initrd: str | None = None
    cmdline: str | None = None
    boot: tuple[str, ...] = ()  # <boot dev='hd'/> ...

    def to_element(self) -> ET.Element:
        el = ET.Element("os")
        sub(el, "type", self.type, arch=self.arch, machine=self.machine)
        for tag in ("kernel", "initrd", "cmdline"):
            if getattr(self, tag) is not None:
                sub(el, tag, getattr(self, tag))
        for dev in self.boot:
            sub(el, "boot", dev=dev)
        return el

    @classmethod
    def from_element(cls, el: ET.Element) -> "Os":
        t = need(el.find("type"), "os/type")
        return cls(type=t.text or "", arch=t.get("arch"), machine=t.get("machine"),
                   kernel=el.findtext("kernel"), initrd=el.findtext("initrd"),
                   cmdline=el.findtext("cmdline"),
                   boot=tuple(b.get("dev", "") for b in el.findall("boot")))


# -- <features> ---------------------------------------------------------------

@dataclass(frozen=True)
class Features(XmlElement):
    acpi: bool = False
    apic: bool = False
    pmu: bool | None = None  # <pmu state='on|off'/>; None = not written

    def to_element(self) -> ET.Element:
        el = ET.Element("features")
        if self.acpi:
            sub(el, "acpi")
        if self.apic:
            sub(el, "apic")
        if self.pmu is not None:
            sub(el, "pmu", state="on" if self.pmu else "off")
        return el

    @classmethod
    def from_element(cls, el: ET.Element) -> "Features":
        pmu = el.find("pmu")
        return cls(acpi=el.find("acpi") is not None, apic=el.find("apic") is not None,
                   pmu=None if pmu is None else yes(pmu.get("state")))


# -- <cpu> --------------------------------------------------------------------

@dataclass(frozen=True)
class CpuTopology(XmlElement):
    sockets: int
    cores: int
    threads: int
    dies: int | None = None

    def to_element(self) -> ET.Element:
        return ET.Element("topology", {k: str(v) for k, v in (
            ("sockets", self.sockets), ("dies", self.dies), ("cores", self.cores),
            ("threads", self.threads)) if v is not None})

    @classmethod
    def from_element(cls, el: ET.Element) -> "CpuTopology":
        return cls(sockets=req_int(el, "sockets", "cpu/topology@sockets"),
                   cores=req_int(el, "cores", "cpu/topology@cores"),
                   threads=req_int(el, "threads", "cpu/topology@threads"),
                   dies=opt_int(el, "dies"))


@dataclass(frozen=True)
class NumaCell(XmlElement):
    id: int
    cpus: str  # guest vCPU list, "0-3"
    memory_kib: int
    mem_access: str | None = None  # shared | private

    def to_element(self) -> ET.Element:
        el = ET.Element("cell")
        for k, v in (("id", self.id), ("cpus", self.cpus), ("memory", self.memory_kib),
                     ("unit", "KiB"), ("memAccess", self.mem_access)):
            if v is not None:
                el.set(k, str(v))
        return el

    @classmethod
    def from_element(cls, el: ET.Element) -> "NumaCell":
        mem = to_kib(req_int(el, "memory", "cpu/numa/cell@memory"), el.get("unit"), "cpu/numa/cell@unit")
        return cls(id=req_int(el, "id", "cpu/numa/cell@id"), cpus=el.get("cpus", ""),
                   memory_kib=mem, mem_access=el.get("memAccess"))


@dataclass(frozen=True)
class CpuFeature(XmlElement):
    name: str
    policy: str  # require | disable | force | optional | forbid

    def to_element(self) -> ET.Element:
        return ET.Element("feature", {"policy": self.policy, "name": self.name})

    @classmethod
    def from_element(cls, el: ET.Element) -> "CpuFeature":
        return cls(name=el.get("name", ""), policy=el.get("policy", ""))


@dataclass(frozen=True)
class Cpu(XmlElement):
    mode: str  # host-passthrough | host-model | custom | maximum
    match: str | None = None
    check: str | None = None
    migratable: bool | None = None
    model: str | None = None
    model_fallback: str | None = None
    topology: CpuTopology | None = None
    features: tuple[CpuFeature, ...] = ()
    cells: tuple[NumaCell, ...] = ()

    def to_element(self) -> ET.Element:
        el = ET.Element("cpu", {"mode": self.mode})
        for k, v in (("match", self.match), ("check", self.check), ("migratable", self.migratable)):
            if v is not None:
                el.set(k, "on" if v is True else "off" if v is False else str(v))
        if self.model is not None:
            sub(el, "model", self.model, fallback=self.model_fallback)
        if self.topology is not None:
            el.append(self.topology.to_element())
        for f in self.features:
            el.append(f.to_element())
        if self.cells:
            numa = sub(el, "numa")
            for c in self.cells:
                numa.append(c.to_element())
        return el

    @classmethod
    def from_element(cls, el: ET.Element) -> "Cpu":
        model, topo = el.find("model"), el.find("topology")
        return cls(mode=el.get("mode", "custom"), match=el.get("match"), check=el.get("check"),
                   migratable=yes(el.get("migratable")),
                   model=None if model is None else (model.text or ""),
                   model_fallback=None if model is None else model.get("fallback"),
                   topology=None if topo is None else CpuTopology.from_element(topo),
                   features=tuple(CpuFeature.from_element(f) for f in el.findall("feature")),
                   cells=tuple(NumaCell.from_element(c) for c in el.findall("numa/cell")))


# -- <cputune>, <numatune>, <memoryBacking> -----------------------------------------

@dataclass(frozen=True)
class VcpuPin(XmlElement):
    vcpu: int
    cpuset: str

    def to_element(self) -> ET.Element:
        return ET.Element("vcpupin", {"vcpu": str(self.vcpu), "cpuset": self.cpuset})

    @classmethod
    def from_element(cls, el: ET.Element) -> "VcpuPin":
        return cls(req_int(el, "vcpu", "cputune/vcpupin@vcpu"), el.get("cpuset", ""))


@dataclass(frozen=True)
class IoThreadPin(XmlElement):
    iothread: int
    cpuset: str

    def to_element(self) -> ET.Element:
        return ET.Element("iothreadpin", {"iothread": str(self.iothread), "cpuset": self.cpuset})

    @classmethod
    def from_element(cls, el: ET.Element) -> "IoThreadPin":
        return cls(req_int(el, "iothread", "cputune/iothreadpin@iothread"), el.get("cpuset", ""))


@dataclass(frozen=True)
class CpuTune(XmlElement):
    vcpupins: tuple[VcpuPin, ...] = ()
    emulatorpin: str | None = None  # cpuset
    iothreadpins: tuple[IoThreadPin, ...] = ()

    def to_element(self) -> ET.Element:
        el = ET.Element("cputune")
        for p in self.vcpupins:
            el.append(p.to_element())
        if self.emulatorpin is not None:
            sub(el, "emulatorpin", cpuset=self.emulatorpin)
        for p in self.iothreadpins:
            el.append(p.to_element())
        return el

    @classmethod
    def from_element(cls, el: ET.Element) -> "CpuTune":
        emu = el.find("emulatorpin")
        return cls(vcpupins=tuple(VcpuPin.from_element(p) for p in el.findall("vcpupin")),
                   emulatorpin=None if emu is None else emu.get("cpuset", ""),
                   iothreadpins=tuple(IoThreadPin.from_element(p) for p in el.findall("iothreadpin")))


@dataclass(frozen=True)
class MemNode(XmlElement):
    cellid: int
    mode: str
    nodeset: str

    def to_element(self) -> ET.Element:
        return ET.Element("memnode", {"cellid": str(self.cellid), "mode": self.mode,
                                      "nodeset": self.nodeset})

    @classmethod
    def from_element(cls, el: ET.Element) -> "MemNode":
        return cls(req_int(el, "cellid", "numatune/memnode@cellid"), el.get("mode", ""),
                   el.get("nodeset", ""))


@dataclass(frozen=True)
class NumaTune(XmlElement):
    mode: str | None = None  # strict | preferred | interleave | restrictive
    nodeset: str | None = None  # host NUMA nodes
    memnodes: tuple[MemNode, ...] = ()

    def to_element(self) -> ET.Element:
        el = ET.Element("numatune")
        if self.mode is not None or self.nodeset is not None:
            sub(el, "memory", mode=self.mode, nodeset=self.nodeset)
        for m in self.memnodes:
            el.append(m.to_element())
        return el

    @classmethod
    def from_element(cls, el: ET.Element) -> "NumaTune":
        mem = el.find("memory")
        return cls(mode=None if mem is None else mem.get("mode"),
                   nodeset=None if mem is None else mem.get("nodeset"),
                   memnodes=tuple(MemNode.from_element(m) for m in el.findall("memnode")))


@dataclass(frozen=True)
class HugePage(XmlElement):
    size_kib: int
    nodeset: str | None = None  # guest NUMA cells (not host nodes) this size backs

    def to_element(self) -> ET.Element:
        el = ET.Element("page", {"size": str(self.size_kib), "unit": "KiB"})
        if self.nodeset is not None:
            el.set("nodeset", self.nodeset)
        return el

    @classmethod
    def from_element(cls, el: ET.Element) -> "HugePage":
        size = req_int(el, "size", "memoryBacking/hugepages/page@size")
        return cls(to_kib(size, el.get("unit"), "memoryBacking/hugepages/page@unit"), el.get("nodeset"))


@dataclass(frozen=True)
class MemoryBacking(XmlElement):
    hugepages: tuple[HugePage, ...] | None = None  # None: none; (): default size
    nosharepages: bool = False
    locked: bool = False

    def to_element(self) -> ET.Element:
        el = ET.Element("memoryBacking")
        if self.hugepages is not None:
            hp = sub(el, "hugepages")
            for p in self.hugepages:
                hp.append(p.to_element())
        if self.nosharepages:
            sub(el, "nosharepages")
        if self.locked:
            sub(el, "locked")
        return el

    @classmethod
    def from_element(cls, el: ET.Element) -> "MemoryBacking":
        hp = el.find("hugepages")
        return cls(hugepages=None if hp is None else tuple(HugePage.from_element(p) for p in hp.findall("page")),
                   nosharepages=el.find("nosharepages") is not None,
                   locked=el.find("locked") is not None)


# -- <clock> ------------------------------------------------------------------

@dataclass(frozen=True)
class Timer(XmlElement):
    name: str
    present: bool | None = None
    tickpolicy: str | None = None

    def to_element(self) -> ET.Element:
        return sub(ET.Element("x"), "timer", name=self.name, tickpolicy=self.tickpolicy,
                    present=self.present)

    @classmethod
    def from_element(cls, el: ET.Element) -> "Timer":
        return cls(el.get("name", ""), yes(el.get("present")), el.get("tickpolicy"))


@dataclass(frozen=True)
class Clock(XmlElement):
    offset: str = "utc"
    timers: tuple[Timer, ...] = ()

    def to_element(self) -> ET.Element:
        el = ET.Element("clock", {"offset": self.offset})
        for t in self.timers:
            el.append(t.to_element())
        return el

    @classmethod
    def from_element(cls, el: ET.Element) -> "Clock":
        return cls(el.get("offset", "utc"), tuple(Timer.from_element(t) for t in el.findall("timer")))


# -- <domain> ----------------------------------------------------------------

@dataclass(frozen=True)
class Domain(XmlElement):
    type: str  # kvm | qemu | test
    name: str
    uuid: str | None
    memory_kib: int
    vcpus: int
    os: Os
    devices: Devices = Devices()
    # Children of <metadata>, each one element in its own namespace, as XML text
    # (libvirt rejects un-namespaced metadata).
    metadata: tuple[str, ...] = ()
    memory_backing: MemoryBacking | None = None
    iothreads: int = 0
    cputune: CpuTune | None = None
    numatune: NumaTune | None = None
    features: Features | None = None
    cpu: Cpu | None = None
    clock: Clock | None = None
    on_poweroff: str | None = None
    on_reboot: str | None = None
    on_crash: str | None = None

    def __post_init__(self) -> None:
        # One text form per metadata element, so equality survives a round trip.
        object.__setattr__(self, "metadata", tuple(_normal_metadata(t) for t in self.metadata))

    def to_element(self) -> ET.Element:
        el = ET.Element("domain", {"type": self.type})
        sub(el, "name", self.name)
        if self.uuid is not None:
            sub(el, "uuid", self.uuid)
        if self.metadata:
            md = sub(el, "metadata")
            for text in self.metadata:
                md.append(ET.fromstring(text))
        sub(el, "memory", self.memory_kib, unit="KiB")
        if self.memory_backing is not None:
            el.append(self.memory_backing.to_element())
        sub(el, "vcpu", self.vcpus, placement="static")
        if self.iothreads:
            sub(el, "iothreads", self.iothreads)
        for part in (self.cputune, self.numatune, self.os, self.features, self.cpu, self.clock):
            if part is not None:
                el.append(part.to_element())
        for tag in ("on_poweroff", "on_reboot", "on_crash"):
            if getattr(self, tag) is not None:
                sub(el, tag, getattr(self, tag))
        el.append(self.devices.to_element())
        return el

    @classmethod
    def from_element(cls, el: ET.Element) -> "Domain":
        if el.tag != "domain":
            raise ElementError(f"root element is <{el.tag}>, not <domain>")

        def opt(tag: str, kind):
            child = el.find(tag)
            return None if child is None else kind.from_element(child)

        md = el.find("metadata")
        return cls(type=el.get("type", ""), name=need(el.find("name"), "name").text or "",
                   uuid=el.findtext("uuid"), memory_kib=_memory_kib(el),
                   vcpus=req_int(el.find("vcpu"), None, "vcpu"),
                   os=Os.from_element(need(el.find("os"), "os")),
                   devices=opt("devices", Devices) or Devices(),
                   metadata=() if md is None else tuple(_metadata_text(c) for c in md),
                   memory_backing=opt("memoryBacking", MemoryBacking),
                   iothreads=opt_int(el.find("iothreads"), where="iothreads") or 0,
                   cputune=opt("cputune", CpuTune), numatune=opt("numatune", NumaTune),
                   features=opt("features", Features), cpu=opt("cpu", Cpu), clock=opt("clock", Clock),
                   on_poweroff=el.findtext("on_poweroff"), on_reboot=el.findtext("on_reboot"),
                   on_crash=el.findtext("on_crash"))

    # -- text form ------------------------------------------------------------

    def to_xml(self) -> str:
        """Indented XML text, stable for golden files; what libvirt's defineXML
        takes. Metadata namespaces keep the prefixes their XML text declares."""
        for text in self.metadata:
            _register_prefixes(text)
        el = self.to_element()
        ET.indent(el, "  ")
        return ET.tostring(el, encoding="unicode") + "\n"

    @classmethod
    def from_xml(cls, text: str) -> "Domain":
        _register_prefixes(text)
        try:
            root = ET.fromstring(text)
        except ET.ParseError as e:
            raise ElementError(f"domain XML does not parse: {e}") from None
        return cls.from_element(root)


def _memory_kib(domain: ET.Element) -> int:
    mem = need(domain.find("memory"), "memory")
    return to_kib(req_int(mem, None, "memory"), mem.get("unit"), "memory@unit")


def _normal_metadata(text: str) -> str:
    _register_prefixes(text)
    try:
        el = ET.fromstring(text)
    except ET.ParseError as e:
        raise ElementError(f"metadata: not XML: {e}") from None
    if not el.tag.startswith("{"):
        raise ElementError(f"metadata: <{el.tag}> has no namespace (libvirt requires one)")
    return _metadata_text(el)


def _metadata_text(el: ET.Element) -> str:
    """One metadata child as compact text (indentation whitespace dropped)."""
    el = _strip_whitespace(el)
    return ET.tostring(el, encoding="unicode")


def _strip_whitespace(el: ET.Element) -> ET.Element:
    copy = ET.Element(el.tag, dict(el.attrib))
    copy.text = el.text if (el.text and el.text.strip()) or len(el) == 0 else None
    for child in el:
        copy.append(_strip_whitespace(child))
    copy.tail = None
    return copy


def _register_prefixes(text: str) -> None:
    """ElementTree forgets prefixes on parse and invents ``ns0`` on output; keep
    the document's own prefix for each namespace (the registry is ElementTree's)."""
    try:
        for _event, (prefix, uri) in ET.iterparse(io.StringIO(text), events=("start-ns",)):
            if prefix and not re.match(r"ns\d+$", prefix):
                ET.register_namespace(prefix, uri)
    except ET.ParseError:
        pass  # the real parse reports it
