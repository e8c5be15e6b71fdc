"""Element classes: every class round-trips (object -> XML -> object) with all
of its optional parts set, reads libvirt's own formatting (other units,
elements we do not model), writes nothing for unset values, and names the
element when XML cannot be read."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from hostd.domain.elements import (BridgeInterface, Chardev, Clock, Controller, Cpu, CpuFeature, CpuTopology,
                                   CpuTune, Devices, Disk, DiskDriver, Domain, ElementError, Features,
                                   HostdevInterface, HugePage, IoThreadPin, IoTune, MemBalloon, MemNode,
                                   MemoryBacking, NumaCell, NumaTune, Os, PciAddress, Rng, Teaming, Timer,
                                   VcpuPin)

VF = PciAddress(0, 0x3B, 2, 1)
FULL_IOTUNE = IoTune(**{f: i + 1 for i, f in enumerate(IoTune.__dataclass_fields__) if f != "group_name"},
                     group_name="g-1")
DISK = Disk("/dev/nvme0n1", "vdb", "virtio", "block", "disk",
            DiskDriver("qemu", "raw", "none", "native", 2, "unmap"), "nvme0n1", True, FULL_IOTUNE)
DEVICES = Devices(
    emulator="/usr/bin/qemu-system-x86_64",
    disks=(Disk("/var/lib/hostd/root.qcow2", "vda", type="file", driver=DiskDriver(type="qcow2")), DISK),
    controllers=(Controller("usb", model="none"), Controller("pci", 0, "pcie-root")),
    interfaces=(HostdevInterface(VF, "52:54:00:00:00:01", (100,), True, "vfio"),
                HostdevInterface(PciAddress(1, 2, 3, 4), None, (10, 20), False)),
    serials=(Chardev("serial", "pty", log_file="/var/log/c.log", log_append=True),
             Chardev("serial", "file", source_path="/tmp/s.log", target_port=1)),
    consoles=(Chardev("console", "pty", target_type="serial", target_port=0),),
    memballoon=MemBalloon("none"), rngs=(Rng("virtio", "random", "/dev/random", 1024, 1000),))
DOMAIN = Domain(
    type="kvm", name="vm-a", uuid="6b1a4f3e-0000-4000-8000-000000000001", memory_kib=4 * 2**20,
    vcpus=4, os=Os("hvm", "x86_64", "q35", "/k", "/i", "console=ttyS0", ()), devices=DEVICES,
    metadata=('<hyb:vm xmlns:hyb="https://hybrid-kvm.example/xmlns/hostd/1" version="1">'
              '<hyb:vm-id>x</hyb:vm-id><hyb:claim>{"a": [1, 2]}</hyb:claim></hyb:vm>',
              '<o:other xmlns:o="urn:other"/>'),
    memory_backing=MemoryBacking((HugePage(1048576, "0"), HugePage(2048, "1")), True, True),
    iothreads=2,
    cputune=CpuTune((VcpuPin(0, "2"), VcpuPin(1, "10")), "1,9", (IoThreadPin(1, "1,9"), IoThreadPin(2, "9"))),
    numatune=NumaTune("strict", "0-1", (MemNode(0, "strict", "0"), MemNode(1, "preferred", "1"))),
    features=Features(True, True, False),
    cpu=Cpu("host-passthrough", None, "none", False, None, None, CpuTopology(1, 2, 2),
            (CpuFeature("invtsc", "require"),),
            (NumaCell(0, "0-1", 2 * 2**20, "shared"), NumaCell(1, "2-3", 2 * 2**20))),
    clock=Clock("utc", (Timer("rtc", tickpolicy="catchup"), Timer("hpet", present=False))),
    on_poweroff="destroy", on_reboot="restart", on_crash="destroy")

SAMPLES = [
    Os(), Os("hvm", "x86_64", "pc", boot=("hd", "network")),
    Features(), Features(True, True, True),
    CpuTopology(2, 4, 2, 1), NumaCell(3, "0-7", 1024, "private"), CpuFeature("x2apic", "disable"),
    Cpu("custom", "exact", "partial", None, "qemu64", "forbid", CpuTopology(1, 1, 1)),
    Cpu("maximum", migratable=True), DOMAIN.cpu,
    VcpuPin(7, "3-4"), IoThreadPin(1, "0"), CpuTune(), DOMAIN.cputune,
    MemNode(0, "strict", "1"), NumaTune(), NumaTune("interleave", "0-3"), DOMAIN.numatune,
    HugePage(2048), HugePage(1048576, "0-1"),
    MemoryBacking(), MemoryBacking(()), MemoryBacking((HugePage(2048),), False, True), DOMAIN.memory_backing,
    IoTune(), FULL_IOTUNE, DiskDriver(), DISK,
    VF, DEVICES.interfaces[0], DEVICES.interfaces[1],
    Teaming("persistent"), Teaming("transient", "ua-vf0-standby"),
    BridgeInterface("br0", "52:54:00:00:00:01", "virtio", Teaming("persistent"), "ua-vf0-standby"),
    HostdevInterface(VF, "52:54:00:00:00:01", teaming=Teaming("transient", "ua-vf0-standby"), alias="ua-vf0"),
    Devices(interfaces=(BridgeInterface("br0"), HostdevInterface(VF))),
    *DEVICES.serials, *DEVICES.consoles, *DEVICES.controllers, MemBalloon("virtio"), Rng(),
    DEVICES.rngs[0], Devices(), DEVICES,
    Timer("pit", True, "delay"), Clock(), DOMAIN.clock,
]


@pytest.mark.parametrize("obj", SAMPLES, ids=lambda o: type(o).__name__)
def test_round_trip(obj) -> None:
    assert type(obj).from_xml(obj.to_xml()) == obj
    assert type(obj).from_element(obj.to_element()) == obj


def test_domain_round_trip_keeps_metadata_prefixes() -> None:
    text = DOMAIN.to_xml()
    assert Domain.from_xml(text) == DOMAIN
    assert "<hyb:vm " in text and "ns0:" not in text
    assert Domain.from_xml(text).to_xml() == text


def test_unset_values_write_no_xml() -> None:
    assert Features().to_xml() == "<features />"
    assert IoTune().to_xml() == "<iotune />"
    assert Cpu("maximum").to_xml() == '<cpu mode="maximum" />'
    assert CpuTune().to_xml() == "<cputune />"
    assert MemoryBacking().to_xml() == "<memoryBacking />"
    assert MemoryBacking(()).to_xml() == "<memoryBacking>\n  <hugepages />\n</memoryBacking>"
    iot = ET.fromstring(IoTune(total_bytes_sec=5, group_name="").to_xml())
    assert [c.tag for c in iot] == ["total_bytes_sec"]


def test_vlan_trunk_only_with_several_tags() -> None:
    one = ET.fromstring(HostdevInterface(VF, vlan_tags=(5,)).to_xml())
    two = ET.fromstring(HostdevInterface(VF, vlan_tags=(5, 6)).to_xml())
    assert one.find("vlan").get("trunk") is None and two.find("vlan").get("trunk") == "yes"
    assert [t.get("id") for t in two.iterfind("vlan/tag")] == ["5", "6"]


def test_pci_address_sysfs_form() -> None:
    assert PciAddress.parse("0000:3b:02.1") == VF and str(VF) == "0000:3b:02.1"
    assert ET.fromstring(VF.to_xml()).attrib == {"type": "pci", "domain": "0x0000", "bus": "0x3b",
                                                 "slot": "0x02", "function": "0x1"}
    with pytest.raises(ElementError, match="not a PCI address"):
        PciAddress.parse("3b:02")


LIBVIRT_FORMATTED = """<domain type='qemu' id='3'>
  <name>vm-b</name>
  <uuid>6b1a4f3e-0000-4000-8000-000000000002</uuid>
  <metadata><hyb:vm xmlns:hyb="https://hybrid-kvm.example/xmlns/hostd/1">
      <hyb:vm-id>y</hyb:vm-id>
    </hyb:vm></metadata>
  <memory unit='GiB'>1</memory>
  <currentMemory unit='KiB'>1048576</currentMemory>
  <memoryBacking><hugepages><page size='1' unit='G' nodeset='0'/></hugepages></memoryBacking>
  <vcpu placement='static'>1</vcpu>
  <resource><partition>/machine</partition></resource>
  <os><type arch='x86_64' machine='pc-q35-7.2'>hvm</type><kernel>/k</kernel></os>
  <cpu mode='maximum' check='none' migratable='on'>
    <numa><cell id='0' cpus='0' memory='1' unit='GiB'/></numa>
  </cpu>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='block' device='disk'>
      <driver name='qemu' type='raw' cache='none' io='native' iothread='1'/>
      <source dev='/dev/loop3' index='1'/>
      <backingStore/>
      <target dev='vda' bus='virtio'/>
      <iotune><total_bytes_sec>4194304</total_bytes_sec><group_name>smoke</group_name></iotune>
      <alias name='virtio-disk0'/>
      <address type='pci' domain='0x0000' bus='0x03' slot='0x00' function='0x0'/>
    </disk>
    <serial type='pty'>
      <source path='/dev/pts/3'/>
      <log file='/x/console.log' append='on'/>
      <target type='isa-serial' port='0'><model name='isa-serial'/></target>
      <alias name='serial0'/>
    </serial>
    <memballoon model='none'/>
  </devices>
  <seclabel type='dynamic' model='dac' relabel='yes'/>
</domain>"""


def test_reads_libvirt_formatting() -> None:
    d = Domain.from_xml(LIBVIRT_FORMATTED)
    assert d.memory_kib == 2**20 and d.memory_backing == MemoryBacking((HugePage(1048576, "0"),))
    assert d.cpu.migratable is True and d.cpu.cells == (NumaCell(0, "0", 2**20),)
    assert d.devices.disks[0].source == "/dev/loop3"
    assert d.devices.disks[0].iotune == IoTune(total_bytes_sec=4194304, group_name="smoke")
    assert d.devices.serials[0].log_file == "/x/console.log"
    assert d.devices.serials[0].source_path == "/dev/pts/3"  # the pty libvirt allocated
    assert d.metadata == ('<hyb:vm xmlns:hyb="https://hybrid-kvm.example/xmlns/hostd/1">'
                          '<hyb:vm-id>y</hyb:vm-id></hyb:vm>',)


@pytest.mark.parametrize("cls, xml, where", [
    (CpuTune, "<cputune><vcpupin vcpu='x' cpuset='1'/></cputune>", "cputune/vcpupin@vcpu"),
    (Disk, "<disk type='network' device='disk'><target dev='vda'/></disk>", "disk type 'network'"),
    (HostdevInterface, "<interface type='bridge'><source bridge='br0'/></interface>", "only 'hostdev'"),
    (Devices, "<devices><interface type='user'/></devices>", "only 'hostdev' and 'bridge' are modelled"),
    (NumaCell, "<cell id='0' cpus='0' memory='1' unit='parsecs'/>", "cpu/numa/cell@unit"),
    (IoTune, "<iotune><total_bytes_sec>lots</total_bytes_sec></iotune>", "iotune/total_bytes_sec"),
    (Rng, "<rng model='virtio'/>", "rng/backend: missing"),
    (Disk, "<disk", "XML does not parse"),
])
def test_unreadable_xml_names_the_element(cls, xml: str, where: str) -> None:
    with pytest.raises(ElementError, match=where):
        cls.from_xml(xml)


def test_metadata_needs_a_namespace() -> None:
    with pytest.raises(ElementError, match="no namespace"):
        Domain(type="kvm", name="a", uuid=None, memory_kib=1, vcpus=1, os=Os(), metadata=("<vm/>",))


def test_domain_root_must_be_domain() -> None:
    with pytest.raises(ElementError, match="not <domain>"):
        Domain.from_xml("<network/>")
