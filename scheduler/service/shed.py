"""Load shedding: under overload a replica answers what it cannot serve in time at once,
503 ``hyb.scheduler.overloaded`` with a ``Retry-After``, instead of queueing it
(``[server] shed_*``).

Overloaded means: this replica's event loop ran a timer later than ``shed_loop_lag_s``
within the last ``shed_hold_s`` (its CPU taken or stolen, or more requests than it
answers: everything it answers now is that late), or, for a claim, more than
``shed_claim_queue`` creates wait for the claim thread. Then:

- a heartbeat is still counted (its host's liveness is kept, from memory, as a served
  beat's; its stats are dropped) and answered 503 with a Retry-After sized so the host's
  next beat, however it jitters (``api.bounds.RETRY_AFTER_JITTER``), lands before the
  heartbeat timeout (``liveness_rule.beat_retry_after``): a shed beat never makes a host
  look down;
- a claim (``POST /v1/vms``) and a registration (``POST /v1/hosts``) are answered 503
  with ``Retry-After`` (``shed_retry_s``): nothing is recorded, the client retries.

Each shed request is noted in the replica's ``Lag``: while it sheds, and for the lag
window after, ``/readyz`` answers 503 and says why (a load balancer sends the work
elsewhere). A shed registration also stops this replica marking hosts down for that long,
as its own lag does: a host told to register later does not beat meanwhile. A shed beat
does not: it is counted, and its Retry-After lands the next beat before the timeout, so
a replica that sheds beats but keeps up with reading them goes on judging: the one
that carries the fleet while its peer restarts is the one left to mark the dead hosts.
"""

from __future__ import annotations

from collections.abc import Callable

from scheduler.errors import SchedulerError
from scheduler.metrics import Metrics
from scheduler.service.liveness import Lag


class Overloaded(SchedulerError):
    """Shed: come back after ``Retry-After`` seconds (``extra["retry_after_s"]``)."""
    code = "hyb.scheduler.overloaded"
    status = 503


class Shed:
    def __init__(self, *, lag: Lag, loop_lag_s: float, hold_s: float, claim_queue: int, retry_s: float,
                 beat_retry_s: int, depth: Callable[[], int] = lambda: 0, metrics: Metrics | None = None):
        """``loop_lag_s`` 0: never on the event loop's lateness; ``claim_queue`` 0: never on
        the claim queue's depth. ``depth``: how many creates wait for the claim thread."""
        self.lag = lag
        self.loop_lag_s = loop_lag_s
        self.hold_s = hold_s
        self.claim_queue = claim_queue
        self.retry_s = retry_s
        self.beat_retry_s = beat_retry_s
        self.depth = depth
        self.metrics = metrics

    def _loop(self) -> str | None:
        if self.loop_lag_s <= 0:
            return None
        late = self.lag.loop_late_within(self.hold_s)
        if late > self.loop_lag_s:
            return f"event loop {late:.2f} s late (over server.shed_loop_lag_s {self.loop_lag_s:g} s)"
        return None

    def check(self, kind: str) -> Overloaded | None:
        """The refusal for a request of ``kind`` ("beat", "claim", "register") now, or None
        (serve it). Counted and noted when refused."""
        why = self._loop()
        if why is None and kind == "claim" and self.claim_queue > 0:
            n = self.depth()
            if n > self.claim_queue:
                why = f"{n} creates wait for the claim thread (over server.shed_claim_queue {self.claim_queue})"
        if why is None:
            return None
        self.lag.shed(silences=kind == "register")
        if self.metrics is not None:
            self.metrics.shed.labels(kind).inc()
        retry = self.beat_retry_s if kind == "beat" else self.retry_s
        what = "beat counted, its stats dropped; " if kind == "beat" else ""
        return Overloaded(f"overloaded: {why}; {what}retry after {retry:g} s", extra={"retry_after_s": retry})

