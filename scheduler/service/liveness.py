"""Marks silent hosts down, once, in every replica's background (``[liveness]``).

Every ``check_s``: the hosts silent for longer than ``placement.heartbeat_timeout_s``
(an indexed query: the silent hosts, not the fleet) and the rack sizes are read, and
``scheduler.liveness_rule.judge`` says which to mark. Marking is a conditional update (not
marked yet, and still the same last beat), so with several replicas a host is marked
once; it is audited (``host.down``, with how many VMs were flagged) and its running VMs
get the reason "host <name> silent since <time>: marked down". A beat or registration
clears both (``repo.hosts.back_up``). An event (a rack or the fleet newly silent at
once) is logged and audited once while it lasts, and its hosts are left unmarked.

No false alarms after a restart: nothing is marked until ``grace_s`` after this
replica started (hosts whose beats went to a scheduler that was down or paused beat
again meanwhile; their liveness is in the database).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from scheduler.config import LivenessConfig
from scheduler.db.engine import Store
from scheduler.liveness_rule import Judgement, Rules, judge
from scheduler.repo import audit as audit_repo
from scheduler.repo import hosts as host_repo

log = logging.getLogger(__name__)


class LivenessWatch:
    def __init__(self, *, store: Store, cfg: LivenessConfig, heartbeat_timeout_s: float,
                 clock: Callable[[], float] = time.time):
        self.store = store
        self.cfg = cfg
        self.timeout = heartbeat_timeout_s
        self.clock = clock
        self.started = clock()
        self.rules = Rules(cfg.rack_share, cfg.fleet_share, cfg.min_hosts)
        self._events: set[str] = set()  # the events reported, while they last
        self._stop = threading.Event()
        self._t: threading.Thread | None = None

    def check(self) -> Judgement | None:
        """One check; None while in the grace period after start."""
        now = self.clock()
        grace = self.cfg.grace_s if self.cfg.grace_s > 0 else self.timeout
        if now - self.started < grace:
            return None
        with self.store.read() as s:
            down = host_repo.down_before(now=now, heartbeat_timeout_s=self.timeout)
            rows = host_repo.silent(session=s, before=down)
            sizes = host_repo.rack_sizes(session=s) if rows else {}
        got = judge({r.name: r.rack for r in rows}, {r.name for r in rows if r.down_since is not None}, sizes,
                    self.rules)
        last = {r.name: r.last_heartbeat for r in rows}
        for name in got.mark:
            with self.store.write() as s:
                flagged = host_repo.mark_down(session=s, name=name, silent_since=last[name], now=now)
                if flagged is None:
                    continue  # another replica did, or it beat meanwhile
                audit_repo.record(session=s, principal="scheduler", action="host.down", target=name, now=now,
                                  detail={"silent_since": last[name], "silent_s": round(now - last[name], 1),
                                          "vms_flagged": flagged})
            log.warning("host down name=%s silent_s=%.1f vms_flagged=%d", name, now - last[name], flagged)
        for why in set(got.events) - self._events:
            log.error("liveness event: %s", why)
            with self.store.write() as s:
                audit_repo.record(session=s, principal="scheduler", action="fleet.silence", target="-", now=now,
                                  detail={"event": why,
                                          "hosts": sorted(h for h, w in got.held.items() if w == why)[:100]})
        self._events = set(got.events)
        return got

    def start(self) -> LivenessWatch:
        self._t = threading.Thread(target=self._run, name="liveness", daemon=True)
        self._t.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.cfg.check_s):
            try:
                self.check()
            except Exception:  # noqa: BLE001 - the next check tries again (a database away)
                log.exception("liveness check failed")

    def stop(self) -> None:
        self._stop.set()
        if self._t is not None:
            self._t.join(10)
