"""Device element classes (``<devices>`` children): objects <-> XML, no policy.
See ``elements.py`` for the conventions."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, fields

from hostd.domain.xmlutil import ElementError, XmlElement, fmt, need, opt_int, req_int, sub, yes

# -- devices: disk --------------------------------------------------------------

@dataclass(frozen=True)
class IoTune(XmlElement):
    """``<iotune>``: every limit libvirt 9.0 knows; 0 = not written."""

    total_bytes_sec: int = 0
    read_bytes_sec: int = 0
    write_bytes_sec: int = 0
    total_iops_sec: int = 0
    read_iops_sec: int = 0
    write_iops_sec: int = 0
    total_bytes_sec_max: int = 0
    read_bytes_sec_max: int = 0
    write_bytes_sec_max: int = 0
    total_iops_sec_max: int = 0
    read_iops_sec_max: int = 0
    write_iops_sec_max: int = 0
    size_iops_sec: int = 0
    total_bytes_sec_max_length: int = 0
    read_bytes_sec_max_length: int = 0
    write_bytes_sec_max_length: int = 0
    total_iops_sec_max_length: int = 0
    read_iops_sec_max_length: int = 0
    write_iops_sec_max_length: int = 0
    group_name: str = ""

    def to_element(self) -> ET.Element:
        el = ET.Element("iotune")
        for f in fields(self):
            v = getattr(self, f.name)
            if v:
                sub(el, f.name, v)
        return el

    @classmethod
    def from_element(cls, el: ET.Element) -> "IoTune":
        kw: dict[str, object] = {}
        for f in fields(cls):
            child = el.find(f.name)
            if child is not None:
                kw[f.name] = (child.text or "") if f.name == "group_name" else \
                    req_int(child, None, f"iotune/{f.name}")
        return cls(**kw)  # type: ignore[arg-type]


@dataclass(frozen=True)
class DiskDriver(XmlElement):
    name: str = "qemu"
    type: str | None = None  # raw | qcow2
    cache: str | None = None
    io: str | None = None
    iothread: int | None = None
    discard: str | None = None

    def to_element(self) -> ET.Element:
        el = ET.Element("driver")
        for k in ("name", "type", "cache", "io", "iothread", "discard"):
            if getattr(self, k) is not None:
                el.set(k, str(getattr(self, k)))
        return el

    @classmethod
    def from_element(cls, el: ET.Element) -> "DiskDriver":
        return cls(name=el.get("name", "qemu"), type=el.get("type"), cache=el.get("cache"),
                   io=el.get("io"), iothread=opt_int(el, "iothread"), discard=el.get("discard"))


_DISK_SOURCE_ATTR = {"block": "dev", "file": "file"}


@dataclass(frozen=True)
class Disk(XmlElement):
    source: str  # block: device path; file: image path
    target_dev: str
    target_bus: str = "virtio"
    type: str = "block"  # block | file
    device: str = "disk"
    driver: DiskDriver | None = None
    serial: str | None = None
    readonly: bool = False
    iotune: IoTune | None = None

    def to_element(self) -> ET.Element:
        if self.type not in _DISK_SOURCE_ATTR:
            raise ElementError(f"disk {self.target_dev}: type {self.type!r} is not one of "
                               f"{sorted(_DISK_SOURCE_ATTR)}")
        el = ET.Element("disk", {"type": self.type, "device": self.device})
        if self.driver is not None:
            el.append(self.driver.to_element())
        sub(el, "source", **{_DISK_SOURCE_ATTR[self.type]: self.source})
        sub(el, "target", dev=self.target_dev, bus=self.target_bus)
        if self.iotune is not None:
            el.append(self.iotune.to_element())
        if self.readonly:
            sub(el, "readonly")
        if self.serial is not None:
            sub(el, "serial", self.serial)
        return el

    @classmethod
    def from_element(cls, el: ET.Element) -> "Disk":
        typ = el.get("type", "file")
        if typ not in _DISK_SOURCE_ATTR:
            raise ElementError(f"disk type {typ!r} is not one of {sorted(_DISK_SOURCE_ATTR)}")
        src, tgt = el.find("source"), need(el.find("target"), "disk/target")
        drv, iot = el.find("driver"), el.find("iotune")
        return cls(source="" if src is None else src.get(_DISK_SOURCE_ATTR[typ], ""),
                   target_dev=tgt.get("dev", ""), target_bus=tgt.get("bus", ""), type=typ,
                   device=el.get("device", "disk"),
                   driver=None if drv is None else DiskDriver.from_element(drv),
                   serial=el.findtext("serial"), readonly=el.find("readonly") is not None,
                   iotune=None if iot is None else IoTune.from_element(iot))


# -- devices: SR-IOV VF as <interface type='hostdev'> ---------------------------------

@dataclass(frozen=True)
class PciAddress(XmlElement):
    domain: int
    bus: int
    slot: int
    function: int

    @classmethod
    def parse(cls, text: str) -> "PciAddress":
        """From sysfs form ``0000:3b:02.1``."""
        try:
            dom, bus, rest = text.split(":")
            slot, fn = rest.split(".")
            return cls(int(dom, 16), int(bus, 16), int(slot, 16), int(fn, 16))
        except ValueError:
            raise ElementError(f"{text!r} is not a PCI address like 0000:3b:02.1") from None

    def __str__(self) -> str:
        return f"{self.domain:04x}:{self.bus:02x}:{self.slot:02x}.{self.function:x}"

    def to_element(self) -> ET.Element:
        return ET.Element("address", {"type": "pci", "domain": f"0x{self.domain:04x}",
                                      "bus": f"0x{self.bus:02x}", "slot": f"0x{self.slot:02x}",
                                      "function": f"0x{self.function:x}"})

    @classmethod
    def from_element(cls, el: ET.Element) -> "PciAddress":
        return cls(*(req_int(el, k, f"address@{k}") for k in ("domain", "bus", "slot", "function")))


@dataclass(frozen=True)
class Teaming(XmlElement):
    """``<teaming>``: QEMU's virtio-net failover (libvirt 6.1+). ``persistent`` on the
    virtio-net standby; ``transient`` with ``persistent=<the standby's alias>`` on the
    hostdev primary, which libvirt and QEMU unplug for a migration (the guest's
    net_failover driver moves the traffic to the standby meanwhile)."""

    type: str  # persistent | transient
    persistent: str | None = None  # transient only: the standby's alias (ua-...)

    def to_element(self) -> ET.Element:
        return ET.Element("teaming", {"type": self.type, **({"persistent": self.persistent}
                                                              if self.persistent is not None else {})})

    @classmethod
    def from_element(cls, el: ET.Element) -> "Teaming":
        return cls(type=el.get("type", ""), persistent=el.get("persistent"))


def _alias(el: ET.Element, alias: str | None) -> None:
    if alias is not None:
        sub(el, "alias", name=alias)


@dataclass(frozen=True)
class HostdevInterface(XmlElement):
    source: PciAddress
    mac: str | None = None
    vlan_tags: tuple[int, ...] = ()  # more than one: a trunk
    managed: bool = True
    driver: str | None = None  # vfio
    teaming: Teaming | None = None  # transient: the primary of a failover pair
    alias: str | None = None  # ua-...: a user alias (a VF that moves: found by it to unplug)

    def to_element(self) -> ET.Element:
        el = ET.Element("interface", {"type": "hostdev", "managed": fmt(self.managed)})
        if self.mac is not None:
            sub(el, "mac", address=self.mac)
        if self.driver is not None:
            sub(el, "driver", name=self.driver)
        sub(el, "source").append(self.source.to_element())
        if self.vlan_tags:
            vlan = sub(el, "vlan", trunk="yes" if len(self.vlan_tags) > 1 else None)
            for t in self.vlan_tags:
                sub(vlan, "tag", id=t)
        if self.teaming is not None:
            el.append(self.teaming.to_element())
        _alias(el, self.alias)
        return el

    @classmethod
    def from_element(cls, el: ET.Element) -> "HostdevInterface":
        if el.get("type") != "hostdev":
            raise ElementError(f"interface type {el.get('type')!r}: only 'hostdev' is a HostdevInterface")
        mac, drv, team, alias = el.find("mac"), el.find("driver"), el.find("teaming"), el.find("alias")
        addr = need(el.find("source/address"), "interface/source/address")
        return cls(source=PciAddress.from_element(addr), mac=None if mac is None else mac.get("address"),
                   vlan_tags=tuple(req_int(t, "id", "interface/vlan/tag@id")
                                   for t in el.findall("vlan/tag")),
                   managed=yes(el.get("managed")) or False,
                   driver=None if drv is None else drv.get("name"),
                   teaming=None if team is None else Teaming.from_element(team),
                   alias=None if alias is None else alias.get("name"))


@dataclass(frozen=True)
class BridgeInterface(XmlElement):
    """``<interface type='bridge'>`` with a virtio-net model: the standby of a failover
    pair (``teaming persistent``), on a host bridge (hostd config ``failover_bridge``)."""

    bridge: str
    mac: str | None = None
    model: str = "virtio"
    teaming: Teaming | None = None
    alias: str | None = None

    def to_element(self) -> ET.Element:
        el = ET.Element("interface", {"type": "bridge"})
        if self.mac is not None:
            sub(el, "mac", address=self.mac)
        sub(el, "source", bridge=self.bridge)
        sub(el, "model", type=self.model)
        if self.teaming is not None:
            el.append(self.teaming.to_element())
        _alias(el, self.alias)
        return el

    @classmethod
    def from_element(cls, el: ET.Element) -> "BridgeInterface":
        if el.get("type") != "bridge":
            raise ElementError(f"interface type {el.get('type')!r}: only 'bridge' is a BridgeInterface")
        mac, model, team, alias = el.find("mac"), el.find("model"), el.find("teaming"), el.find("alias")
        src = need(el.find("source"), "interface/source")
        return cls(bridge=src.get("bridge", ""), mac=None if mac is None else mac.get("address"),
                   model="" if model is None else model.get("type", ""),
                   teaming=None if team is None else Teaming.from_element(team),
                   alias=None if alias is None else alias.get("name"))


Interface = HostdevInterface | BridgeInterface
_INTERFACES: dict[str, type[HostdevInterface] | type[BridgeInterface]] = {
    "hostdev": HostdevInterface, "bridge": BridgeInterface}


def interface_from_element(el: ET.Element) -> Interface:
    cls = _INTERFACES.get(el.get("type", ""))
    if cls is None:
        raise ElementError(f"interface type {el.get('type')!r}: only {' and '.join(map(repr, _INTERFACES))} "
                           "are modelled")
    return cls.from_element(el)


# -- devices: serial/console, controller, memballoon, rng ---------------------------------

@dataclass(frozen=True)
class Chardev(XmlElement):
    """``<serial>`` or ``<console>``: ``type='pty'`` (optionally with a ``<log>``
    file) or ``type='file'`` with a source path."""

    kind: str = "serial"  # serial | console
    type: str = "pty"
    source_path: str | None = None
    log_file: str | None = None
    log_append: bool | None = None
    target_type: str | None = None  # console: serial | virtio
    target_port: int | None = 0

    def to_element(self) -> ET.Element:
        el = ET.Element(self.kind, {"type": self.type})
        if self.source_path is not None:
            sub(el, "source", path=self.source_path)
        if self.log_file is not None:
            sub(el, "log", file=self.log_file,
                 append=None if self.log_append is None else ("on" if self.log_append else "off"))
        sub(el, "target", type_=self.target_type, port=self.target_port)
        return el

    @classmethod
    def from_element(cls, el: ET.Element) -> "Chardev":
        src, log, tgt = el.find("source"), el.find("log"), el.find("target")
        return cls(kind=el.tag, type=el.get("type", "pty"),
                   source_path=None if src is None else src.get("path"),
                   log_file=None if log is None else log.get("file"),
                   log_append=None if log is None else yes(log.get("append")),
                   target_type=None if tgt is None else tgt.get("type"),
                   target_port=opt_int(tgt, "port"))


@dataclass(frozen=True)
class Controller(XmlElement):
    type: str
    index: int | None = None
    model: str | None = None

    def to_element(self) -> ET.Element:
        return sub(ET.Element("x"), "controller", type_=self.type, index=self.index, model=self.model)

    @classmethod
    def from_element(cls, el: ET.Element) -> "Controller":
        return cls(el.get("type", ""), opt_int(el, "index"), el.get("model"))


@dataclass(frozen=True)
class MemBalloon(XmlElement):
    model: str = "none"

    def to_element(self) -> ET.Element:
        return ET.Element("memballoon", {"model": self.model})

    @classmethod
    def from_element(cls, el: ET.Element) -> "MemBalloon":
        return cls(el.get("model", ""))


@dataclass(frozen=True)
class Rng(XmlElement):
    model: str = "virtio"
    backend_model: str = "random"
    backend: str = "/dev/urandom"
    rate_bytes: int | None = None
    rate_period_ms: int | None = None

    def to_element(self) -> ET.Element:
        el = ET.Element("rng", {"model": self.model})
        if self.rate_bytes is not None:
            sub(el, "rate", bytes=self.rate_bytes, period=self.rate_period_ms)
        sub(el, "backend", self.backend, model=self.backend_model)
        return el

    @classmethod
    def from_element(cls, el: ET.Element) -> "Rng":
        be, rate = need(el.find("backend"), "rng/backend"), el.find("rate")
        return cls(model=el.get("model", ""), backend_model=be.get("model", ""), backend=be.text or "",
                   rate_bytes=opt_int(rate, "bytes"), rate_period_ms=opt_int(rate, "period"))


@dataclass(frozen=True)
class Devices(XmlElement):
    emulator: str | None = None
    disks: tuple[Disk, ...] = ()
    controllers: tuple[Controller, ...] = ()
    interfaces: tuple[Interface, ...] = ()
    serials: tuple[Chardev, ...] = ()
    consoles: tuple[Chardev, ...] = ()
    memballoon: MemBalloon | None = None
    rngs: tuple[Rng, ...] = ()

    def to_element(self) -> ET.Element:
        el = ET.Element("devices")
        if self.emulator is not None:
            sub(el, "emulator", self.emulator)
        for group in (self.disks, self.controllers, self.interfaces, self.serials, self.consoles):
            for d in group:
                el.append(d.to_element())
        if self.memballoon is not None:
            el.append(self.memballoon.to_element())
        for r in self.rngs:
            el.append(r.to_element())
        return el

    @classmethod
    def from_element(cls, el: ET.Element) -> "Devices":
        mb = el.find("memballoon")
        return cls(emulator=el.findtext("emulator"),
                   disks=tuple(Disk.from_element(d) for d in el.findall("disk")),
                   controllers=tuple(Controller.from_element(c) for c in el.findall("controller")),
                   interfaces=tuple(interface_from_element(i) for i in el.findall("interface")),
                   serials=tuple(Chardev.from_element(s) for s in el.findall("serial")),
                   consoles=tuple(Chardev.from_element(c) for c in el.findall("console")),
                   memballoon=None if mb is None else MemBalloon.from_element(mb),
                   rngs=tuple(Rng.from_element(r) for r in el.findall("rng")))
