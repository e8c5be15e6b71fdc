"""The IO-health signal, continuously: one sample of the host every ``interval_s``, the
rates between consecutive samples (``signal.diff``) kept in a ring for ``GetHostStats``
and the heartbeat, and exported as Prometheus metrics. The active probe runs on a thread
of its own (a probe can take up to its timeout); its latencies go to the histogram and
into the interval they fell in.

Where the IO service and the VMs are (their cgroup directories under the host root) is
given by the daemon, which knows the carve layout; nothing here looks it up.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass, replace

from hostd.discover.fs import HostFs
from hostd.health import readers
from hostd.health.probe import Probe
from hostd.health.signal import HostStats, Sample, diff
from hostd.metrics import Metrics

log = logging.getLogger(__name__)

KEEP = 900  # samples kept: 15 min at 1 s


@dataclass(frozen=True)
class Where:
    """Paths relative to the host root: the IO service's and the VMs' cgroup directories
    (their threads are read recursively), the PSI file and the throttling cgroup."""

    io_cgroup: str | None
    vm_cgroup: str | None
    psi: str = "proc/pressure/cpu"
    throttle_cgroup: str | None = None


class Sampler:
    def __init__(self, root, io_cpus: tuple[int, ...], where: Where, *, interval_s: float = 1.0,
                 probe: Probe | None = None, probe_interval_s: float = 1.0, metrics: Metrics | None = None,
                 keep: int = KEEP):
        self.fs_root = root
        self.io_cpus = tuple(io_cpus)
        self.where = where
        self.interval_s = interval_s
        self.probe = probe
        self.probe_interval_s = probe_interval_s
        self.metrics = metrics
        self.history: deque[HostStats] = deque(maxlen=keep)
        self._last: Sample | None = None
        self._probes: list[tuple[bool, float]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------ sampling

    def sample(self) -> Sample:
        fs = HostFs(self.fs_root)
        w = self.where
        return Sample(
            mono=time.monotonic(), wall=time.time(), cpu=readers.read_cpu_times(fs),
            irqs=readers.read_interrupts(fs), threads=readers.read_threads(fs),
            io_tids=frozenset(readers.cgroup_threads(fs, w.io_cgroup)) if w.io_cgroup else frozenset(),
            vm_tids=frozenset(readers.cgroup_threads(fs, w.vm_cgroup)) if w.vm_cgroup else frozenset(),
            psi=readers.read_psi(fs, w.psi), throttle=readers.read_throttle(fs, w.throttle_cgroup)
            if w.throttle_cgroup else None)

    def step(self) -> HostStats | None:
        """Take a sample; the stats since the previous one (None for the first)."""
        t0 = time.perf_counter()
        cur = self.sample()
        prev, self._last = self._last, cur
        if self.metrics:
            self.metrics.io_sample_seconds.observe(time.perf_counter() - t0)
        if prev is None:
            return None
        stats = diff(prev, cur, self.io_cpus)
        with self._lock:
            probes, self._probes = self._probes, []
        if self.probe is not None:
            lat = sorted(s * 1000 for ok, s in probes if ok)
            stats = replace(stats, probe_ok=len(lat), probe_failed=sum(1 for ok, _ in probes if not ok),
                            probe_p50_ms=statistics.median(lat) if lat else None,
                            probe_p99_ms=lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else None)
        self.history.append(stats)
        self._export(stats)
        return stats

    def _export(self, s: HostStats) -> None:
        m = self.metrics
        if m is None:
            return
        m.io_cpu_busy.set(s.io_cpu_busy)
        m.cpu_cores.labels("io_service").set(s.cpu_io_service)
        m.cpu_cores.labels("vms").set(s.cpu_vms)
        m.cpu_cores.labels("other").set(s.cpu_other)
        m.io_foreign_threads.labels("user").set(s.foreign_threads - s.foreign_kernel_threads)
        m.io_foreign_threads.labels("kernel").set(s.foreign_kernel_threads)
        m.io_foreign_cpu.inc(s.foreign_cpu_s)
        m.io_irqs.inc(s.irqs_on_io_cpus_per_s * s.interval_s)
        if s.psi_some_avg10 is not None:
            m.io_psi_avg10.set(s.psi_some_avg10)
        if s.psi_some_stall is not None:
            m.io_psi_stall.set(s.psi_some_stall)
        m.io_throttled.inc(s.throttled_periods)

    def probe_once(self) -> tuple[bool, float, str]:
        assert self.probe is not None
        ok, seconds, err = self.probe()
        if self.metrics:
            if ok:
                self.metrics.io_probe.observe(seconds)
            else:
                self.metrics.io_probe_failures.inc()
        if not ok:
            log.info("io probe failed kind=%s target=%s: %s", self.probe.kind, self.probe.target, err)
        with self._lock:
            self._probes.append((ok, seconds))
        return ok, seconds, err

    def latest(self, n: int = 1) -> list[HostStats]:
        return list(self.history)[-n:] if n > 0 else []

    # ------------------------------------------------------------ threads

    def start(self) -> None:
        self._threads.append(threading.Thread(target=self._run, name="io-health", daemon=True))
        if self.probe is not None:
            self._threads.append(threading.Thread(target=self._run_probe, name="io-probe", daemon=True))
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=self.interval_s + (self.probe.timeout_s if self.probe else 0) + 1)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:  # noqa: BLE001 - a bad sample must not end the signal
                log.exception("io-health sample failed")
            self._stop.wait(self.interval_s)

    def _run_probe(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            self.probe_once()
            self._stop.wait(max(0.0, self.probe_interval_s - (time.monotonic() - t0)))
