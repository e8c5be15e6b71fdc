"""LibvirtHost against libvirt's own test driver (a real libvirt, no daemon):
ownership by metadata, define/start/destroy, iotune round trip, reconnect."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from hostd.apply.libvirt_host import LibvirtHost
from hostd.carve.vmspec import IoTune
from hostd.errors import DomainError, LibvirtUnavailable
from tools.dev.domains import remove_domains

NS = "https://hybrid-kvm.example/xmlns/test/1"


def _xml(name: str, owned: bool) -> str:
    meta = (f"<metadata><hyb:vm xmlns:hyb='{NS}'><hyb:request>r-{name}</hyb:request></hyb:vm>"
            f"</metadata>") if owned else ""
    return f"""<domain type='test'><name>{name}</name><uuid>{uuid.uuid4()}</uuid>{meta}
      <memory unit='MiB'>128</memory><vcpu>1</vcpu>
      <os><type arch='x86_64'>hvm</type></os>
      <devices><disk type='block' device='disk'><source dev='/dev/null'/><target dev='vda' bus='virtio'/></disk>
      </devices></domain>"""


@pytest.fixture
def host():
    h = LibvirtHost("test:///default", NS)
    yield h
    remove_domains(h.conn(), "rt-")
    h.close()


def test_only_owned_domains_are_listed(host: LibvirtHost) -> None:
    u1 = host.define("rt-owned", _xml("rt-owned", True))
    host.start(u1)
    host.define("rt-foreign", _xml("rt-foreign", False))
    owned = {d.name: d for d in host.owned()}
    assert "rt-foreign" not in owned and "test" not in owned
    assert owned["rt-owned"].uuid == u1 and owned["rt-owned"].active
    assert "r-rt-owned" in owned["rt-owned"].metadata


def test_destroy_and_undefine_is_idempotent(host: LibvirtHost) -> None:
    u = host.define("rt-gone", _xml("rt-gone", True))
    host.start(u)
    host.destroy_and_undefine(u)
    host.destroy_and_undefine(u)  # already gone: fine
    assert all(d.name != "rt-gone" for d in host.owned())


def test_bad_xml_error_names_the_domain(host: LibvirtHost) -> None:
    with pytest.raises(DomainError) as e:
        host.define("rt-bad", "<domain type='test'><name>rt-bad</name></domain>")
    assert e.value.field == "domain rt-bad"


def test_reconnects_after_the_connection_dies(host: LibvirtHost) -> None:
    host.conn().close()  # what a libvirtd restart does to us
    host.define("rt-after", _xml("rt-after", True))
    assert host.reconnects == 1


def test_unreachable_libvirt_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("hostd.apply.libvirt_host.RECONNECT_ATTEMPTS", 2)
    monkeypatch.setattr("hostd.apply.libvirt_host.RECONNECT_DELAY_S", 0.01)
    h = LibvirtHost("qemu+unix:///system?socket=/nonexistent/sock", NS)
    with pytest.raises(LibvirtUnavailable, match="cannot connect"):
        h.conn()


@pytest.mark.root
@pytest.mark.integration
def test_an_iotune_change_on_qemu_leaves_exactly_the_new_throttle(libvirtd: str) -> None:
    """The QEMU driver keeps every field a SetBlockIoTune call leaves out: dropping an
    IOPS limit that had a burst was refused ("cannot reset 'total_iops_sec' when
    'total_iops_sec_max' is set"), and a burst left behind refused a later higher base
    rate. IoTune.libvirt_params gives every field, 0 clearing one. A guest idling in its
    firmware, a throttled /dev/null (not relabelled): no boot needed."""
    host = LibvirtHost(libvirtd, NS)
    xml = f"""<domain type='qemu'><name>hyb-test-iotune</name><uuid>{uuid.uuid4()}</uuid>
      <memory unit='MiB'>64</memory><vcpu>1</vcpu><os><type arch='x86_64' machine='pc'>hvm</type></os>
      <devices><disk type='block' device='disk'><driver name='qemu' type='raw'/>
        <source dev='/dev/null'><seclabel model='dac' relabel='no'/></source><target dev='vdb' bus='virtio'/>
        <iotune><total_bytes_sec>1000000</total_bytes_sec><total_iops_sec>100</total_iops_sec>
          <total_iops_sec_max>200</total_iops_sec_max><total_iops_sec_max_length>3</total_iops_sec_max_length>
        </iotune></disk></devices></domain>"""
    u = host.define("hyb-test-iotune", xml)
    try:
        host.start(u)
        for tune in (IoTune(total_bytes_sec=500_000),  # the IOPS limit and its burst dropped
                     IoTune(total_bytes_sec=400_000, total_bytes_sec_max=800_000, total_bytes_sec_max_length=5),
                     IoTune(total_bytes_sec=3_000_000)):  # above the burst just dropped
            host.set_iotune(u, "vdb", tune.libvirt_params())
            want = {k: v for k, v in dataclasses.asdict(tune).items() if k != "group_name"}
            got = host.get_iotune(u, "vdb")
            assert {k: v for k, v in got.items() if k in want} == want, got
    finally:
        host.destroy_and_undefine(u)
        host.close()
