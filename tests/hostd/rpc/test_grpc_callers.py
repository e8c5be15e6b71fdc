"""Who may call what: every hostd holds a certificate the fleet CA signed, so a stolen
or compromised storage host can dial any other hostd over mTLS. Its certificate must
get the read-only RPCs and nothing that changes a VM. Real gRPC over mTLS with
certificates from tools/dev/make-dev-ca.sh, a real ledger, libvirt's test driver."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest
from tools.dev.hostd_inproc import dev_certs, start_hostd

from api import hostd_pb2 as pb
from api import hostd_pb2_grpc as pb_grpc
from hostd.rpc.callers import MUTATING, READ_ONLY


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    return dev_certs(tmp_path_factory.mktemp("ca"), clients=("oss-2",))


@pytest.fixture
def hostd(tmp_path: Path, certs: Path):
    h = start_hostd(tmp_path, certs, "h1", mutating_callers=("scheduler", "fleet-rollout"))
    channels: list[grpc.Channel] = []

    def stub(who: str) -> pb_grpc.HostdStub:
        creds = grpc.ssl_channel_credentials((certs / "ca.crt").read_bytes(),
                                             private_key=(certs / f"{who}.key").read_bytes(),
                                             certificate_chain=(certs / f"{who}.crt").read_bytes())
        channels.append(grpc.secure_channel(f"localhost:{h.port}", creds))
        return pb_grpc.HostdStub(channels[-1])
    yield stub, h
    for c in channels:
        c.close()
    h.stop("c-")


def create(rid: str = "r-1", name: str = "c-1") -> pb.CreateVMRequest:
    return pb.CreateVMRequest(request_id=rid, name=name, vcpus=1, memory_mib=128, image="smoke")


def test_every_rpc_is_classified() -> None:
    rpcs = {m.name for m in pb.DESCRIPTOR.services_by_name["Hostd"].methods}
    assert MUTATING | READ_ONLY == rpcs and not MUTATING & READ_ONLY


def test_another_hosts_certificate_reads_but_cannot_change(hostd) -> None:
    stub, h = hostd
    vm = stub("scheduler").CreateVM(create(), timeout=10)
    intruder = stub("oss-2")
    calls = {
        "CreateVM": lambda: intruder.CreateVM(create("r-2", "c-2"), timeout=10),
        "DeleteVM": lambda: intruder.DeleteVM(pb.DeleteVMRequest(vm_id=vm.vm_id), timeout=10),
        "StartVM": lambda: intruder.StartVM(pb.VMRef(vm_id=vm.vm_id), timeout=10),
        "StopVM": lambda: intruder.StopVM(pb.StopVMRequest(vm_id=vm.vm_id), timeout=10),
        "UpdateIOLimits": lambda: intruder.UpdateIOLimits(pb.UpdateIOLimitsRequest(vm_id=vm.vm_id), timeout=10),
        "Carve": lambda: intruder.Carve(pb.CarveRequest(policy_toml="", policy_digest=""), timeout=10),
        "Uncarve": lambda: intruder.Uncarve(pb.UncarveRequest(drained=True), timeout=10),
        "PrepareMigration": lambda: intruder.PrepareMigration(
            pb.PrepareMigrationRequest(request_id="m-1", vm_id=vm.vm_id, vm=create("r-3", "c-3")), timeout=10),
        "MigrateVM": lambda: intruder.MigrateVM(pb.MigrateVMRequest(name="c-1", target_uri="test:///default",
                                                                    domain_xml="<domain/>"), timeout=10),
        "CompleteMigration": lambda: intruder.CompleteMigration(pb.MigrationRef(name="c-1"), timeout=10),
        "AbortMigration": lambda: intruder.AbortMigration(pb.MigrationRef(name="c-1"), timeout=10),
    }
    assert set(calls) == MUTATING
    for method, call in calls.items():
        with pytest.raises(grpc.RpcError) as e:
            call()
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED, method
        assert e.value.details().startswith("hyb.rpc.forbidden [caller]: caller oss-2 may not call " + method)
    # nothing changed, and the read-only side still answers the intruder
    assert [(r.vm_id, r.state) for r in h.manager.list()] == [(vm.vm_id, "running")]
    assert intruder.Health(pb.HealthRequest(), timeout=10).ok
    assert [v.vm_id for v in intruder.ListVMs(pb.ListVMsRequest(), timeout=10).vms] == [vm.vm_id]
    assert intruder.GetInventory(pb.GetInventoryRequest(), timeout=10).host == "h1"


def test_the_rollouts_certificate_may_change(hostd) -> None:
    stub, h = hostd
    rollout = stub("fleet-rollout")
    vm = rollout.CreateVM(create(), timeout=10)
    rollout.DeleteVM(pb.DeleteVMRequest(vm_id=vm.vm_id), timeout=10)
    assert h.manager.list() == []


def test_host_stats_are_read_only_and_match_the_signal(tmp_path: Path, certs: Path) -> None:
    """GetHostStats over mTLS, by another host's certificate (a read): the samples the
    signal took, newest last, field by field."""
    from hostd.health.sampler import Sampler, Where

    s = Sampler(Path("/"), (0,), Where(None, None), interval_s=0.2)
    for _ in range(4):
        s.step()
        time.sleep(0.05)
    h = start_hostd(tmp_path, certs, "h1", sampler=s)
    try:
        creds = grpc.ssl_channel_credentials((certs / "ca.crt").read_bytes(),
                                             private_key=(certs / "oss-2.key").read_bytes(),
                                             certificate_chain=(certs / "oss-2.crt").read_bytes())
        with grpc.secure_channel(f"localhost:{h.port}", creds) as ch:
            r = pb_grpc.HostdStub(ch).GetHostStats(pb.GetHostStatsRequest(last=2), timeout=10)
            latest = pb_grpc.HostdStub(ch).GetHostStats(pb.GetHostStatsRequest(), timeout=10)
    finally:
        h.stop("c-")
    want = s.latest(2)
    assert r.host == "h1" and r.interval_seconds == 0.2 and len(r.samples) == 2 and len(latest.samples) == 1
    for got, w in zip(r.samples, want):
        assert (got.at_unix, list(got.io_cpus), got.foreign_threads) == (w.at, [0], w.foreign_threads)
        assert got.cpu_other == pytest.approx(w.cpu_other) and got.HasField("psi_some_avg10")
    assert latest.samples[0].at_unix == want[-1].at
