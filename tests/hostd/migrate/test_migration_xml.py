"""The pure parts of hostd's migration (hostd/apply/migration.py): the target's XML keeps
the source's guest-visible disk serials, and the disks the NBD copy moves."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from hostd.apply.migration import disk_targets, keep_serials

XML = """<domain type="qemu"><name>v</name><devices>
<disk type="block" device="disk"><source dev="/dev/loop9"/><target dev="vda" bus="virtio"/><serial>loop9</serial></disk>
<disk type="block" device="disk"><source dev="/dev/loop10"/><target dev="vdb" bus="virtio"/></disk>
<disk type="file" device="cdrom"><source file="/x.iso"/><target dev="sda" bus="sata"/><readonly/></disk>
</devices></domain>"""


def test_keep_serials_sets_the_sources_serial_on_each_claimed_disk() -> None:
    out, targets = keep_serials(XML, {"loop9": "loop3", "loop10": "loop4"})
    root = ET.fromstring(out)
    assert [d.findtext("serial") for d in root.iterfind("./devices/disk")] == ["loop3", "loop4", None]
    assert targets == {"loop9": "vda", "loop10": "vdb"}
    assert [d.find("source").get("dev") for d in root.iterfind("./devices/disk")][:2] == ["/dev/loop9",
                                                                                          "/dev/loop10"]


def test_disk_targets_are_the_writable_disks() -> None:
    assert disk_targets(XML) == ["vda", "vdb"]
