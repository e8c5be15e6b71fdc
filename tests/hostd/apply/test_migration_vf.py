"""A VM with an SR-IOV VF and a live move (issue 38, item 3): hostd's migration
(hostd/apply/migration.py) on two hosts, each its own libvirt test driver and its own real
SQLite ledger.

This machine has no SR-IOV. What is recorded: the hosts' PFs and VFs, read by hostd's own
discovery from recorded sysfs trees: host A is tests/data/hosts/1s-8c-nosmt-1pf-8vf (an
mlx5 PF, VFs at 0000:01:00.x), host B tests/data/hosts/2s-48c-smt-2pf-32vf (ice-like
ens1f0, VFs at 0000:3b:02.x), so the target's VF is a different function on a different
PF, picked by B's own claim. The domains carry the designer's own interface XML (the
failover pair, the aliases; the whole domain is validated by virt-xml-validate in
tests/hostd/domain/test_domain_golden.py, case vf-failover).

What the test driver lacks is played by tools/dev/hostd_inproc.InprocMigrations: libvirt's
migration job, and device hot-plug (virDomainAttachDeviceFlags / DetachDeviceFlags answer
"not supported" on the test driver): it records the plug and unplug calls hostd makes,
with their device XML and flags, and what the guest then has. The tests with plain
``Migrations`` show what hostd does when libvirt refuses the unplug or the plug. A run on real
SR-IOV hardware (a guest with net_failover) is not done: docs/roadmap.md."""

from __future__ import annotations

import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import libvirt
import pytest

from api.layout import HugepageTarget, IoServiceTarget, Layout, NodeLayout, PfLayout, VfSlot
from hostd.apply.images import ImageStore
from hostd.apply.ledger import Ledger
from hostd.apply.libvirt_host import LibvirtHost
from hostd.apply.migration import MigrateRequest, Migrations
from hostd.apply.vms import VmManager
from hostd.carve.vmclaim import VfReq
from hostd.carve.vmspec import VmSpec
from hostd.discover.fs import HostFs
from hostd.discover.nics import read_nics
from hostd.domain.designer import HostFacts, _interfaces
from hostd.domain.metadata import NS, VmMetadata
from hostd.errors import DomainDesignError, MigrationFailed, MigrationVf
from tools.dev import hostd_inproc
from tools.dev.domains import remove_domains
from tools.dev.hostd_inproc import InprocMigrations, Rates

REPO = Path(__file__).resolve().parents[3]
TREES = {"a": REPO / "tests/data/hosts/1s-8c-nosmt-1pf-8vf", "b": REPO / "tests/data/hosts/2s-48c-smt-2pf-32vf"}
PFS = {"a": "enp1s0f0np0", "b": "ens1f0"}
MAC = "52:54:00:aa:bb:01"


def recorded(host: str) -> tuple[PfLayout, dict[tuple[str, int], str], str]:
    """The host's PF (as a layout offers it: 4 VFs) and its VFs' PCI addresses, read from
    the recorded tree by hostd's discovery."""
    nic = next(n for n in read_nics(HostFs(TREES[host])) if n.name == PFS[host])
    pf = PfLayout(nic.name, nic.pci, 0, 4, 10000, tuple(VfSlot(v.index, 0, 0) for v in nic.vfs[:4]))
    return pf, {(nic.name, v.index): v.pci for v in nic.vfs}, nic.driver or ""


def renderer(facts: HostFacts):  # type: ignore[no-untyped-def]
    """A test-driver domain with hostd's metadata and the designer's own interfaces."""
    def render(md: VmMetadata, image) -> str:  # type: ignore[no-untyped-def]
        ifaces = "".join(i.to_xml() for i in _interfaces(md.spec, md.claim, facts))
        return (f"<domain type='test'><name>{md.spec.name}</name><uuid>{md.vm_id}</uuid>"
                f"<metadata>{md.to_xml()}</metadata><memory unit='MiB'>{md.spec.memory_mib}</memory>"
                f"<vcpu>{md.spec.vcpus}</vcpu><os><type arch='x86_64'>hvm</type></os>"
                f"<devices>{ifaces}</devices></domain>")
    return render


@pytest.fixture
def hosts(tmp_path: Path):
    made: list[tuple[VmManager, LibvirtHost]] = []

    def host(name: str, *, bridge: str = "br-failover", played: bool = True) -> tuple[VmManager, Migrations, Rates]:
        d = tmp_path / name
        d.mkdir()
        (d / "vmlinuz").write_bytes(b"kernel")
        images = ImageStore(d / "images")
        images.add("smoke", "1", "kernel", {"kernel": d / "vmlinuz"})
        (d / "node.xml").write_text("<node></node>")
        lv = LibvirtHost(f"test://{d / 'node.xml'}", NS)  # this host's own domains
        pf, vf_pci, driver = recorded(name)
        layout = Layout(nodes=(NodeLayout(0, (0,), (1,), (2, 3), (HugepageTarget(2048, 256),)),), pfs=(pf,),
                        disks=(), io_service=IoServiceTarget("none", ""), vm_cgroup="machine", reboot_required=())
        facts = HostFacts(virt_type="qemu", console_dir=d / "vms", vf_pci=vf_pci, failover_bridge=bridge)
        rates = Rates()
        m = VmManager(layout=layout, siblings={c: (c,) for c in range(4)}, ledger=Ledger(d / "ledger.db"),
                      libvirt=lv, images=images, render=renderer(facts), disk_check=lambda n: [],
                      vf_rates=rates, pf_drivers={pf.name: driver}, vf_pci=vf_pci)
        hostd_inproc._PRIVATE[lv.uri] = lv
        made.append((m, lv))
        mig = (InprocMigrations if played else Migrations)(m, target_uri=lv.uri)
        return m, mig, rates
    yield host
    for m, lv in made:
        remove_domains(lv.conn())
        m.ledger.close()
        hostd_inproc._PRIVATE.pop(lv.uri, None)
        lv.close()


def spec(mode: str, name: str = "vfm-a") -> VmSpec:
    return VmSpec(request_id=f"req-{name}", name=name, vcpus=1, memory_mib=128, image="smoke",
                  vfs=(VfReq(mac=MAC, vlan=7, max_tx_rate_mbps=2000, migration=mode),))


def on_target(s: VmSpec, host: str) -> VmSpec:
    """The VM's request as the scheduler sends it to a target: the target's PF."""
    return VmSpec.from_dict({**s.to_dict(), "vfs": [{**v, "pf": PFS[host]} for v in s.to_dict()["vfs"]]})


def interfaces(xml: str) -> list[dict[str, str]]:
    out = []
    for i in ET.fromstring(xml).iterfind("./devices/interface"):
        addr, team, alias = i.find("source/address"), i.find("teaming"), i.find("alias")
        out.append({"type": i.get("type"), "mac": i.find("mac").get("address"),
                    "pci": "" if addr is None else f"{int(addr.get('bus'), 16):02x}:{int(addr.get('slot'), 16):02x}."
                                                   f"{int(addr.get('function'), 16)}",
                    "bridge": i.find("source").get("bridge", ""),
                    "teaming": "" if team is None else f"{team.get('type')}:{team.get('persistent', '')}",
                    "alias": "" if alias is None else alias.get("name")})
    return out


def prepare(mig: Migrations, s: VmSpec, vm_id: str, rid: str = "mig-vf-1"):  # type: ignore[no-untyped-def]
    return mig.prepare(request_id=rid, vm_id=vm_id, spec=s, source_disks=(), source_host="a")


def test_failover_target_picks_its_own_vf_and_renders_the_pair_with_the_sources_mac(hosts):
    a, _mig_a, _ = hosts("a")
    b, mig_b, rates_b = hosts("b")
    src = a.create(spec("failover"))
    assert interfaces(a.libvirt.conn().lookupByUUIDString(src.vm_id).XMLDesc(0)) == [
        {"type": "bridge", "mac": MAC, "pci": "", "bridge": "br-failover", "teaming": "persistent:",
         "alias": "ua-vf0-standby"},
        {"type": "hostdev", "mac": MAC, "pci": "01:00.2", "bridge": "", "teaming": "transient:ua-vf0-standby",
         "alias": "ua-vf0"}]  # A's first VF, recorded
    p = prepare(mig_b, on_target(spec("failover"), "b"), src.vm_id)
    assert interfaces(p.domain_xml) == [
        {"type": "bridge", "mac": MAC, "pci": "", "bridge": "br-failover", "teaming": "persistent:",
         "alias": "ua-vf0-standby"},
        {"type": "hostdev", "mac": MAC, "pci": "3b:02.0", "bridge": "", "teaming": "transient:ua-vf0-standby",
         "alias": "ua-vf0"}]  # B's own VF, from B's claim, the guest's MAC kept
    (vf,) = p.record.claim.vfs
    assert (vf.pf, vf.index, vf.mac, vf.vlan) == ("ens1f0", 0, MAC, 7)
    assert rates_b.rates == {("ens1f0", 0): (2000, 0)}  # B's VF carries the VM's rate
    assert b.inventory()["pfs"][0]["vfs_used"] == 1


def test_failover_needs_a_standby_bridge_on_the_target_and_a_refusal_changes_nothing(hosts):
    _a, _, _ = hosts("a")
    b, mig_b, rates_b = hosts("b", bridge="")
    before = b.inventory()
    with pytest.raises(DomainDesignError) as e:
        prepare(mig_b, on_target(spec("failover"), "b"), str(uuid.uuid4()))
    assert e.value.field == "vfs[0].migration" and "set failover_bridge" in e.value.detail
    def same(inv: dict) -> dict:
        return {k: v for k, v in inv.items() if k != "generation"}  # a counter of changes made and undone
    assert b.list() == [] and same(b.inventory()) == same(before)
    assert rates_b.rates.get(("ens1f0", 0), (0, 0)) == (0, 0)  # the VF's rate put back


def test_a_vf_without_a_migration_mode_is_refused_on_both_ends_naming_the_field(hosts):
    a, mig_a, _ = hosts("a")
    b, mig_b, _ = hosts("b")
    src = a.create(spec("none"))
    before = [(r.vm_id, r.state, r.reason) for r in a.list()]
    with pytest.raises(MigrationVf) as e:
        mig_a.migrate(MigrateRequest(name="vfm-a", target_uri=b.libvirt.uri, domain_xml="<domain/>"))
    assert e.value.field == "vfs[0].migration"
    assert "migration=failover" in e.value.detail and "migration=interrupt" in e.value.detail
    with pytest.raises(MigrationVf) as e:
        prepare(mig_b, on_target(spec("none"), "b"), src.vm_id)
    assert e.value.field == "vm.vfs[0].migration"
    assert [(r.vm_id, r.state, r.reason) for r in a.list()] == before and b.list() == []


def test_interrupt_moves_unplugging_on_the_source_and_plugging_the_targets_vf(hosts):
    a, mig_a, rates_a = hosts("a")
    b, mig_b, rates_b = hosts("b")
    src = a.create(spec("interrupt"))
    p = prepare(mig_b, on_target(spec("interrupt"), "b"), src.vm_id)
    assert interfaces(p.domain_xml) == []  # the job carries no VF: the source has none by then
    mig_a.migrate(MigrateRequest(name="vfm-a", target_uri=b.libvirt.uri, domain_xml=p.domain_xml))
    (detach,) = mig_a.calls
    assert detach[:2] == ("detach", src.vm_id) and interfaces(f"<d><devices>{detach[2]}</devices></d>") == [
        {"type": "hostdev", "mac": MAC, "pci": "01:00.2", "bridge": "", "teaming": "", "alias": "ua-vf0"}]
    assert a.list() == [] and rates_a.rates[("enp1s0f0np0", 0)] == (0, 0)  # A's VF free, its rate reset
    rec, _job = mig_b.complete("vfm-a")
    (attach,) = mig_b.calls
    assert attach[:2] == ("attach", src.vm_id)
    assert attach[3] == libvirt.VIR_DOMAIN_AFFECT_LIVE | libvirt.VIR_DOMAIN_AFFECT_CONFIG
    assert interfaces(f"<d><devices>{attach[2]}</devices></d>") == [
        {"type": "hostdev", "mac": MAC, "pci": "3b:02.0", "bridge": "", "teaming": "", "alias": "ua-vf0"}]
    assert (rec.state, rec.reason) == ("running", "migrated here")
    assert rates_b.rates[("ens1f0", 0)] == (2000, 0) and b.inventory()["pfs"][0]["vfs_used"] == 1


def test_a_failed_move_plugs_the_vf_back_on_the_source(hosts):
    a, mig_a, _ = hosts("a")
    b, mig_b, _ = hosts("b")
    src = a.create(spec("interrupt"))
    p = prepare(mig_b, on_target(spec("interrupt"), "b"), src.vm_id)
    mig_a.fail.append("unable to connect to the target: connection refused")
    with pytest.raises(MigrationFailed, match="connection refused"):
        mig_a.migrate(MigrateRequest(name="vfm-a", target_uri=b.libvirt.uri, domain_xml=p.domain_xml))
    (op1, _, out, _), (op2, _, back, flags) = mig_a.calls
    assert (op1, op2, flags) == ("detach", "attach", libvirt.VIR_DOMAIN_AFFECT_LIVE) and back == out
    assert "ua-vf0" in mig_a._plugged(src.vm_id)
    assert [(r.name, r.state, r.reason) for r in a.list()] == [("vfm-a", "running", src.reason)]
    assert mig_b.abort("vfm-a") and b.list() == [] and b.inventory()["pfs"][0]["vfs_used"] == 0


def test_when_libvirt_cannot_unplug_the_vf_the_move_is_refused_and_the_vm_keeps_it(hosts):
    """Without the played hot-plug: the test driver answers the unplug "not supported", as a
    libvirt would that cannot hot-unplug the device."""
    a, mig_a, _ = hosts("a", played=False)
    b, mig_b, _ = hosts("b")
    src = a.create(spec("interrupt"))
    p = prepare(mig_b, on_target(spec("interrupt"), "b"), src.vm_id)
    with pytest.raises(MigrationVf) as e:
        mig_a.migrate(MigrateRequest(name="vfm-a", target_uri=b.libvirt.uri, domain_xml=p.domain_xml))
    assert e.value.field == "vfs[0]" and "cannot unplug VF 0 (ua-vf0) for the move" in e.value.detail
    assert "ua-vf0" in mig_a._plugged(src.vm_id)
    assert [(r.name, r.state, r.reason) for r in a.list()] == [("vfm-a", "running", src.reason)]


def test_a_guest_that_keeps_its_vf_is_not_moved_and_keeps_it(hosts):
    """The unplug asked, the guest does not release the VF (no ACPI hot-plug in it, say):
    hostd's wait ends, the move is refused naming the VF, the VM runs here with it."""
    a, mig_a, _ = hosts("a")
    b, mig_b, _ = hosts("b")
    src = a.create(spec("interrupt"))
    p = prepare(mig_b, on_target(spec("interrupt"), "b"), src.vm_id)
    mig_a.guest_keeps, mig_a.unplug_wait_s = True, 0.3
    with pytest.raises(MigrationVf) as e:
        mig_a.migrate(MigrateRequest(name="vfm-a", target_uri=b.libvirt.uri, domain_xml=p.domain_xml))
    assert e.value.field == "vfs[0]" and "the guest has not released ua-vf0 in 0.3 s" in e.value.detail
    assert [c[0] for c in mig_a.calls] == ["detach"] and mig_a.moved == []  # asked once; no job, no re-plug
    assert "ua-vf0" in mig_a._plugged(src.vm_id)
    assert [(r.name, r.state, r.reason) for r in a.list()] == [("vfm-a", "running", src.reason)]


def test_failover_source_leaves_the_unplug_to_qemu_and_checks_the_vf_after_a_failure(hosts):
    """Failover: hostd unplugs nothing (QEMU unplugs the primary once the job starts and
    plugs it back when the job fails); after a failure it checks, and plugs back what
    QEMU did not."""
    a, mig_a, _ = hosts("a")
    b, mig_b, _ = hosts("b")
    src = a.create(spec("failover"))
    p = prepare(mig_b, on_target(spec("failover"), "b"), src.vm_id)
    mig_a.fail.append("guest did not answer the unplug")
    mig_a.out[src.vm_id] = {"ua-vf0"}  # QEMU unplugged the primary and did not put it back
    with pytest.raises(MigrationFailed):
        mig_a.migrate(MigrateRequest(name="vfm-a", target_uri=b.libvirt.uri, domain_xml=p.domain_xml))
    (op, _, back, flags), = mig_a.calls
    assert (op, flags) == ("attach", libvirt.VIR_DOMAIN_AFFECT_LIVE)
    assert interfaces(f"<d><devices>{back}</devices></d>")[0]["teaming"] == "transient:ua-vf0-standby"
    assert "ua-vf0" in mig_a._plugged(src.vm_id)
    mig_a.calls.clear()
    mig_a.migrate(MigrateRequest(name="vfm-a", target_uri=b.libvirt.uri, domain_xml=p.domain_xml))
    assert mig_a.calls == [] and a.list() == []  # the pair moved as it is: no unplug by hostd
    rec, _ = mig_b.complete("vfm-a")
    assert mig_b.calls == [] and rec.reason == "migrated here"


def test_an_arrived_vm_whose_vf_cannot_be_plugged_runs_and_says_so(hosts):
    """The target's libvirt refuses the plug (here the test driver: "not supported"):
    the VM runs on the target all the same (one running copy), its row naming the VF."""
    a, mig_a, _ = hosts("a")
    b, mig_b, _ = hosts("b", played=False)
    src = a.create(spec("interrupt"))
    p = prepare(mig_b, on_target(spec("interrupt"), "b"), src.vm_id)
    mig_a.migrate(MigrateRequest(name="vfm-a", target_uri=b.libvirt.uri, domain_xml=p.domain_xml))
    rec, _ = mig_b.complete("vfm-a")
    assert rec.state == "running" and rec.reason.startswith("migrated here; vfs[0] not plugged: ")
    assert "not supported" in rec.reason
