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
        # The IO-health signal (hostd/health/), every io_health_interval_s.
        self.io_cpu_busy = Gauge("hostd_io_cpu_busy_ratio", "how busy the IO service's CPUs were", registry=r)
        self.cpu_cores = Gauge("hostd_cpu_cores", "CPU used by class (cores)", ["class"], registry=r)
        self.io_foreign_threads = Gauge("hostd_io_foreign_threads",
                                        "threads not of the IO service that ran on its CPUs in the last interval",
                                        ["kind"], registry=r)
        self.io_foreign_cpu = Counter("hostd_io_foreign_cpu_seconds_total",
                                      "CPU time of other threads on the IO service's CPUs", registry=r)
        self.io_irqs = Counter("hostd_io_irqs_total", "interrupts delivered to the IO service's CPUs", registry=r)
        self.io_psi_avg10 = Gauge("hostd_io_cpu_pressure_some_avg10",
                                  "PSI cpu some avg10 (percent) of the IO service's cgroup, or the host", registry=r)
        self.io_psi_stall = Gauge("hostd_io_cpu_pressure_stall_ratio",
                                  "fraction of the last interval some IO task waited for a CPU", registry=r)
        self.io_throttled = Counter("hostd_io_throttled_periods_total",
                                    "CFS periods the IO service's cgroup was throttled", registry=r)
        self.io_probe = Histogram("hostd_io_probe_seconds", "latency of the active probe of the IO service",
                                  buckets=(5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05,
                                           0.1, 0.25, 0.5, 1.0), registry=r)
        self.io_probe_failures = Counter("hostd_io_probe_failures_total", "failed probes of the IO service",
                                         registry=r)
        # Live migration (apply/migration.py): the source counts its MigrateVM, the target
        # its CompleteMigration and AbortMigration; times and downtimes are libvirt's.
        self.migrations = Counter("hostd_migrations_total", "live migrations by this host's role and result",
                                  ["role", "result"], registry=r)
        self.migrating = Gauge("hostd_migrations_running", "MigrateVM jobs running on this host", registry=r)
        self.migration_seconds = Histogram("hostd_migration_seconds", "a live migration's job time (libvirt's)",
                                           buckets=(1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800), registry=r)
        self.migration_downtime = Histogram("hostd_migration_downtime_seconds",
                                            "a live migration's downtime (libvirt's: the guest paused)",
                                            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5), registry=r)
        self.io_sample_seconds = Histogram("hostd_io_sample_seconds", "time one IO-health sample took",
                                           buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1), registry=r)
