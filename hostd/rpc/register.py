"""hostd -> scheduler: register this host (layout, SMT siblings, PF capabilities,
disk classes) and send heartbeats, so the scheduler's inventory is what hostd
carved. Runs on its own thread in `hostd serve`; the scheduler being away never
stops hostd from serving the VMs it has.

A good client of a shared service (``Registrar.next_wait``): beats come every
``interval_s`` less up to a tenth, at random (a fleet started at once drifts apart);
told to come back later (429/503 with ``Retry-After``: the scheduler shedding load, a
beat too soon) it waits that long and up to ``RETRY_AFTER_JITTER`` more, at random;
after a failure without one (the scheduler away, a 5xx) it backs off exponentially
from one second with jitter, never longer than ``interval_s``, so when a scheduler
comes back from an outage the fleet's beats arrive spread over one interval, no denser
than in steady state. A host re-registers only when the scheduler does not know it
(404) or its registration changed: not after every failure (after an outage the whole
fleet re-registering at once was the heaviest part of the return).
"""

from __future__ import annotations

import logging
import os
import random
import ssl
import threading
import time
from pathlib import Path

import httpx

from api.bounds import RETRY_AFTER_JITTER
from api.layout import Layout
from api.rest import retry_after
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
BACKOFF_FIRST_S = 1.0  # the first retry after a failure without Retry-After (then doubling)


class Later(Exception):
    """The scheduler said to come back later (429/503 with Retry-After), or is away."""

    def __init__(self, message: str, retry_after_s: float | None = None):
        super().__init__(message)
        self.retry_after_s = retry_after_s


def wait_after(*, interval_s: float, failures: int, later: float | None, rng: random.Random) -> float:
    """How long a heartbeat client waits before its next attempt (the module's docstring
    says why): ``later``, the scheduler's Retry-After (at most ten intervals), and up to
    ``RETRY_AFTER_JITTER`` more; after ``failures`` in a row without one, half to all of
    1, 2, 4 ... s, never over the interval; else the interval less up to a tenth.
    bench/fleet_pulse.py's simulated fleet waits by this too."""
    if later is not None:
        return min(later, 10 * interval_s) * (1 + rng.uniform(0, RETRY_AFTER_JITTER))
    if failures:
        return min(interval_s, BACKOFF_FIRST_S * 2 ** min(failures - 1, 30)) * rng.uniform(0.5, 1.0)
    return interval_s * rng.uniform(0.9, 1.0)


def _refusal(r: httpx.Response, what: str) -> Exception:
    """A 429/503 that says when to come back, or a 5xx: Later (retried, the registration
    kept); anything else: RuntimeError."""
    ra = retry_after(r) if r.status_code in (429, 503) else None
    if ra is not None or r.status_code >= 500:
        return Later(f"{what}: {r.status_code} {r.text[:300]}", ra)
    return RuntimeError(f"{what}: {r.status_code} {r.text[:300]}")


class Registrar:
    """Register once, then heartbeat every ``interval_s``; re-register when the
    scheduler has forgotten this host (404) or after it was unreachable."""

    def __init__(self, url: str, token: str, body: dict, *, interval_s: float,
                 ca: Path | None = None, stats: Sampler | None = None, days_s: float = 0.0,
                 peak_window: str = "21:00-22:00", days_file: Path | None = None, beat_stats: bool = False,
                 rng: random.Random | None = None):
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
        self.rng = rng or random.Random()
        self.failures = 0  # in a row, without a Retry-After
        self.later: float | None = None  # the scheduler's last Retry-After, not yet waited
        self._generation = 0  # bumps with each new body (update)
        self._stop = threading.Event()

    def register(self) -> None:
        gen = self._generation  # before the body: a newer body makes the next beat register again
        body = self.body
        r = self.client.post(f"{self.url}/v1/hosts", json=body)
        if r.status_code not in (200, 201):
            raise _refusal(r, "scheduler refused registration")
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
            raise _refusal(r, "heartbeat refused")
        if self.days is not None and time.monotonic() - self._days_sent >= self.days_s:
            self.send_days()

    def attempt(self) -> None:
        """One beat (or registration), its outcome kept for ``next_wait``: a refusal drops
        the registration (the next attempt registers afresh); the scheduler away, a 5xx
        or a Retry-After keep it."""
        try:
            self.beat()
            self.failures, self.later = 0, None
        except Later as e:
            if e.retry_after_s is not None:
                self.failures, self.later = 0, e.retry_after_s
            else:
                self.failures += 1
            log.warning("scheduler url=%s: %s (next try in about %s)", self.url, e,
                        f"{e.retry_after_s:g} s" if e.retry_after_s is not None else "a backoff")
        except httpx.HTTPError as e:
            self.failures += 1
            log.warning("scheduler unreachable url=%s error=%s", self.url, e)
        except RuntimeError as e:
            self.failures += 1
            self.registered = False
            log.warning("scheduler registration url=%s error=%s", self.url, e)

    def next_wait(self) -> float:
        """How long until the next attempt (``wait_after``)."""
        wait = wait_after(interval_s=self.interval_s, failures=self.failures, later=self.later, rng=self.rng)
        self.later = None
        return wait

    def run(self) -> None:
        while True:
            self.attempt()
            if self._stop.wait(self.next_wait()):
                return

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.run, name="registrar", daemon=True)
        t.start()
        return t

    def stop(self) -> None:
        self._stop.set()
        self.client.close()
