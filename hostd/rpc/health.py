"""What ``Health`` answers: libvirt reachable, host warnings from discovery, a state
dir QEMU cannot traverse, failed VMs."""

from __future__ import annotations

from pathlib import Path

from api import hostd_pb2 as pb
from hostd.apply.ledger import VmState
from hostd.apply.libvirt_host import LibvirtHost
from hostd.apply.overlays import unreachable_for_qemu
from hostd.apply.vms import VmManager
from hostd.health.sampler import Sampler


class HealthCheck:
    def __init__(self, *, libvirt: LibvirtHost, manager: VmManager, virt_type: str, state_dir: Path,
                 host_warnings: tuple[str, ...] = (), sampler: Sampler | None = None):
        self.libvirt = libvirt
        self.manager = manager
        self.virt_type = virt_type
        self.state_dir = state_dir
        self.host_warnings = host_warnings
        self.sampler = sampler

    def __call__(self) -> pb.HealthResponse:
        problems = []
        try:
            self.libvirt.conn().getLibVersion()
            lv_state = "connected"
        except Exception as e:
            lv_state = f"not connected: {e}"
            problems.append(lv_state)
        problems += [f"host: {w}" for w in self.host_warnings]
        blocked = unreachable_for_qemu(self.state_dir)
        if blocked is not None:
            problems.append(f"state_dir: QEMU cannot traverse {blocked}; VMs with a root disk image will fail")
        last = self.sampler.latest(1) if self.sampler else []
        user = [f for f in last[0].top_foreign if not f.kthread] if last else []
        if user:
            problems.append("io_cpus are not exclusive: " + ", ".join(f"{f.comm} (pid {f.pid}, {f.cpu_s:.2f} s)"
                                                                     for f in user) + " ran there last interval")
        vms = self.manager.list()
        failed = [r.name for r in vms if r.state == VmState.FAILED]
        if failed:
            problems.append(f"failed VMs: {', '.join(failed)}")
        return pb.HealthResponse(ok=lv_state == "connected", libvirt=lv_state, virt_type=self.virt_type,
                                 vms=len(vms), problems=problems)
