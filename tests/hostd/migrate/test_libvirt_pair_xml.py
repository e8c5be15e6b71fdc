"""The pure parts of the two-host harness (tools/dev/libvirt_pair.py): the guest's XML,
its rewrite for the target, the ``virsh migrate`` arguments and libvirt's job record.
The job record is one ``virsh domjobinfo --completed`` output captured on this machine
(libvirt 9.0) on the target of a migration."""

from __future__ import annotations

import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tools.dev.libvirt_pair import Host, guest_xml, job_ms, job_stats, migrate_argv, retarget_xml

JOBINFO = """Job type:         Completed
Operation:        Incoming migration
Time elapsed:     2591         ms
Time elapsed w/o network: 2577         ms
Data processed:   89.266 MiB
Memory total:     128.375 MiB
Memory bandwidth: 300.070 MiB/s
Iteration:        3
Total downtime:   170          ms
Downtime w/o network: 156          ms
Setup time:       5            ms
"""


def source_xml() -> str:
    return guest_xml(name="hyb-mig-t", kernel=Path("/k"), initrd=Path("/i"), disk=Path("/dev/loop7"),
                     vcpu_pin="0", emulator_pin="0", iotune={"total_bytes_sec": 100, "total_iops_sec": 10},
                     guest_uuid="0b5a1f7e-5a5e-4c1b-9d0e-3f6c2b1a0d11")


def test_retarget_rewrites_disk_pinning_and_throttles_only() -> None:
    src = source_xml()
    out = ET.fromstring(retarget_xml(src, disk=Path("/dev/loop9"), vcpu_pin="1", emulator_pin="1",
                                     iotune={"total_bytes_sec": 20, "read_iops_sec": 5}))
    disk = out.find("./devices/disk")
    assert disk.find("source").get("dev") == "/dev/loop9"
    assert {c.tag: c.text for c in disk.find("iotune")} == {"total_bytes_sec": "20", "read_iops_sec": "5"}
    assert out.find("./cputune/vcpupin").get("cpuset") == "1"
    assert out.find("./cputune/emulatorpin").get("cpuset") == "1"
    before = ET.fromstring(src)
    for path in ("name", "uuid", "memory", "memoryBacking", "os", "devices/serial", "devices/disk/target"):
        assert ET.tostring(out.find(path)) == ET.tostring(before.find(path)), path


def test_guest_xml_validates_against_libvirt_schema(tmp_path: Path) -> None:
    if not shutil.which("virt-xml-validate"):
        pytest.skip("virt-xml-validate not installed")
    for name, text in (("src", source_xml()),
                       ("dst", retarget_xml(source_xml(), disk=Path("/dev/loop9"), vcpu_pin="1", emulator_pin="1",
                                            iotune={"total_iops_sec": 5}))):
        p = tmp_path / f"{name}.xml"
        p.write_text(text)
        r = subprocess.run(["virt-xml-validate", str(p), "domain"], capture_output=True, text=True)
        assert r.returncode == 0, (name, r.stderr)


def test_migrate_argv_names_the_target_and_the_bounds() -> None:
    dest = Host("b", Path("/tmp/pair/host-b"), "10.77.0.2", 49400)
    argv = migrate_argv("g", Path("/t.xml"), dest, bandwidth_mib=64, tls=True, timeout_s=120)
    assert argv[-3:] == ["g", "qemu+unix:///system?socket=/tmp/pair/host-b/run/libvirt-sock", "tcp://10.77.0.2"]
    for flag in ("--live", "--p2p", "--copy-storage-all", "--persistent", "--undefinesource", "--auto-converge",
                 "--tls"):
        assert flag in argv
    assert argv[argv.index("--bandwidth") + 1] == "64" and argv[argv.index("--timeout") + 1] == "120"
    assert argv[argv.index("--xml") + 1] == argv[argv.index("--persistent-xml") + 1] == "/t.xml"
    plain = migrate_argv("g", Path("/t.xml"), dest, bandwidth_mib=None, tls=False)
    assert "--bandwidth" not in plain and "--tls" not in plain


def test_job_record_times_in_ms() -> None:
    stats = job_stats(JOBINFO)
    assert stats["Operation"] == "Incoming migration"
    assert (job_ms(stats, "Time elapsed"), job_ms(stats, "Total downtime")) == (2591.0, 170.0)
