"""The pure parts of hostd's migration (hostd/apply/migration.py): the disks the NBD copy
moves, and which guest target each host disk is."""

from __future__ import annotations

from hostd.apply.migration import block_targets, disk_targets

XML = """<domain type="qemu"><name>v</name><devices>
<disk type="block" device="disk"><source dev="/dev/loop9"/><target dev="vda" bus="virtio"/><serial>loop3</serial></disk>
<disk type="block" device="disk"><source dev="/dev/loop10"/><target dev="vdb" bus="virtio"/></disk>
<disk type="file" device="cdrom"><source file="/x.iso"/><target dev="sda" bus="sata"/><readonly/></disk>
</devices></domain>"""


def test_block_targets_by_host_disk_name() -> None:
    assert block_targets(XML) == {"loop9": "vda", "loop10": "vdb"}


def test_disk_targets_are_the_writable_disks() -> None:
    assert disk_targets(XML) == ["vda", "vdb"]
