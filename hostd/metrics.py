"""hostd's Prometheus metrics, on a registry of the daemon's own (no global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.rpc = Counter("hostd_rpc_total", "gRPC calls by method and outcome code",
                           ["method", "code"], registry=r)
        self.create_seconds = Histogram("hostd_create_vm_seconds", "CreateVM wall time (claim to running)",
                                        buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60), registry=r)
        self.vms = Gauge("hostd_vms", "VMs in the ledger by state", ["state"], registry=r)
        self.reconcile_actions = Counter("hostd_reconcile_actions_total",
                                         "repairs made by reconcile (rollback, release, adopt)", registry=r)
        self.libvirt_reconnects = Gauge("hostd_libvirt_reconnects", "libvirt reconnects since start", registry=r)
        self.free_cpus = Gauge("hostd_free_vm_cpus", "VM CPUs not claimed, per NUMA node", ["node"], registry=r)
        self.free_pages = Gauge("hostd_free_hugepages", "hugepages not claimed, per node and size",
                                ["node", "size_kb"], registry=r)
