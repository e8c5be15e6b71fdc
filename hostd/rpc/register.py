"""hostd -> scheduler: register this host (layout, SMT siblings, PF capabilities,
disk classes) and send heartbeats, so the scheduler's inventory is what hostd
carved. Runs on its own thread in `hostd serve`; the scheduler being away never
stops hostd from serving the VMs it has.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from pathlib import Path

import httpx

from api.layout import Layout
from hostd.discover.model import Topology
from hostd.health.daily import DayFold
from hostd.health.sampler import Sampler
from hostd.health.summary import summarize

log = logging.getLogger(__name__)


def disk_class(topo: Topology, name: str) -> str:
    d = next((d for d in topo.disks if d.name == name), None)
    if d is None:
        return "unknown"
    if name.startswith("nvme"):
        return "nvme"
    if name.startswith("loop"):
        return "loop"
    return "hdd" if d.rotational else "ssd"


def registration(topo: Topology, layout: Layout, *, name: str, address: str, rack: str,
                 labels: dict[str, str], min_rate: dict[str, bool], metrics_url: str = "",
                 hostd_version: str = "", carved_policy: str = "") -> dict:
    """The POST /v1/hosts body. ``metrics_url`` (where Prometheus scrapes this hostd; ""
    when metrics are off: not sent, so not a scrape target), ``hostd_version`` and
    ``carved_policy`` (the carved policy's sha256, "" when not carved) reach Prometheus
    as target labels through the scheduler (GET /v1/prometheus/targets)."""
    body = {
        "name": name, "address": address, "rack": rack, "labels": labels,
        "layout": layout.to_dict(),
        "cpu_siblings": {str(c.id): list(c.siblings) for c in topo.cpus if len(c.siblings) > 1},
        "pf_min_rate": min_rate,
        "disk_classes": {d.name: disk_class(topo, d.name) for d in layout.disks},
        "carved_policy": carved_policy,
    }
    if metrics_url:
        body["metrics_url"] = metrics_url
    if hostd_version:
        body["hostd_version"] = hostd_version
    return body


def metrics_url(*, metrics_listen: str, advertise_host: str, path: str = "/metrics") -> str:
    """Where Prometheus finds ``metrics_listen``: its own host when it names one, else
    (0.0.0.0, [::] or no host: every address) ``advertise_host``; "" when metrics are off."""
    if not metrics_listen:
        return ""
    host, _, port = metrics_listen.rpartition(":")
    if host.strip("[]") in ("", "0.0.0.0", "::"):
        host = advertise_host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # IPv6
    return f"http://{host}:{port}{path}"


KEEP_FOR_BEAT = 600  # samples one beat may summarise (10 min at 1 s)


class Registrar:
    """Register once, then heartbeat every ``interval_s``; re-register when the
    scheduler has forgotten this host (404) or after it was unreachable."""

    def __init__(self, url: str, token: str, body: dict, *, interval_s: float,
                 ca: Path | None = None, stats: Sampler | None = None, days_s: float = 0.0,
                 peak_window: str = "21:00-22:00", days_file: Path | None = None, beat_stats: bool = False):
        self.url = url.rstrip("/")
        self.body = body
        self.stats = stats  # the IO-health signal: folded into the days, and with beat_stats in each beat
        self.beat_stats = beat_stats
        self._sent_at = 0.0
        # The host's days (hostd/health/daily.py), fed the same samples, sent every days_s
        # and kept in days_file across restarts.
        self.days_s, self.peak_window, self.days_file = days_s, peak_window, days_file
        self.days = self._fold(body) if stats is not None and days_s > 0 else None
        self._folded_at = 0.0
        self._days_sent = time.monotonic()
        self.interval_s = interval_s
        self.client = httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=10,
                                   verify=ssl.create_default_context(cafile=str(ca)) if ca else True)
        self.registered = False
        self._generation = 0  # bumps with each new body (update)
        self._stop = threading.Event()

    def register(self) -> None:
        gen = self._generation  # before the body: a newer body makes the next beat register again
        body = self.body
        r = self.client.post(f"{self.url}/v1/hosts", json=body)
        if r.status_code not in (200, 201):
            raise RuntimeError(f"scheduler refused registration: {r.status_code} {r.text[:300]}")
        self.registered = gen == self._generation
        log.info("registered with scheduler url=%s host=%s status=%d", self.url, body["name"],
                 r.status_code)

    @staticmethod
    def _cpus(body: dict) -> int:
        """The host's CPUs, from the layout it registers."""
        return sum(len(n.get(k, ())) for n in body.get("layout", {}).get("nodes", ())
                   for k in ("io_cpus", "host_cpus", "vm_cpus")) or os.cpu_count() or 1

    def _fold(self, body: dict) -> DayFold:
        fold = DayFold(self._cpus(body), peak=self.peak_window)
        if self.days_file is not None and self.days_file.exists():
            try:
                fold.load(self.days_file.read_text())
            except (OSError, ValueError, TypeError, KeyError) as e:
                log.warning("days file %s not read (%s): the days start afresh", self.days_file, e)
        return fold

    def send_days(self) -> None:
        """The days so far to the scheduler, and to ``days_file``."""
        if self.days is None or not self.days.days:
            return
        if self.days_file is not None:
            tmp = self.days_file.with_suffix(".tmp")
            tmp.write_text(self.days.to_json())
            os.replace(tmp, self.days_file)
        r = self.client.post(f"{self.url}/v1/hosts/{self.body['name']}/days", json={"days": self.days.summaries()})
        if r.status_code != 202:
            raise RuntimeError(f"days refused: {r.status_code} {r.text[:300]}")
        self._days_sent = time.monotonic()

    def update(self, body: dict) -> None:
        """A new registration (the host was carved again): sent on the next beat, which
        registers afresh instead of heartbeating. A new CPU count starts the days afresh."""
        if self.days is not None and self._cpus(body) != self.days.cpus:
            self.days = DayFold(self._cpus(body), peak=self.peak_window)
        self.body = body
        self._generation += 1
        self.registered = False
        log.info("registration changed host=%s: re-registering on the next beat", body["name"])

    def beat(self) -> None:
        if not self.registered:
            self.register()
            return
        latest = self.stats.latest(KEEP_FOR_BEAT) if self.stats else []
        if self.days is not None:
            new = [s for s in latest if s.at > self._folded_at]
            self.days.add(new)
            if new:
                self._folded_at = new[-1].at
        fresh = [s for s in latest if s.at > self._sent_at] if self.beat_stats else []
        summary = summarize(fresh)
        r = self.client.post(f"{self.url}/v1/hosts/{self.body['name']}/heartbeat",
                             json={"stats": summary} if summary else None)
        if r.status_code == 200 and fresh:
            self._sent_at = fresh[-1].at
        if r.status_code == 404:
            self.registered = False
            self.register()
        elif r.status_code != 200:
            raise RuntimeError(f"heartbeat refused: {r.status_code} {r.text[:300]}")
        if self.days is not None and time.monotonic() - self._days_sent >= self.days_s:
            self.send_days()

    def run(self) -> None:
        while True:
            try:
                self.beat()
            except (httpx.HTTPError, RuntimeError) as e:
                self.registered = False
                log.warning("scheduler registration url=%s error=%s", self.url, e)
            if self._stop.wait(self.interval_s):
                return

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.run, name="registrar", daemon=True)
        t.start()
        return t

    def stop(self) -> None:
        self._stop.set()
        self.client.close()
