"""The replica's long-lived heap kept out of the cyclic GC's full collections.

A full collection walks every container object the process holds. At 100,000 hosts
that is the placement index, the pulse's maps and the beat book: ~60 ms a collection,
several a minute a replica under the fleet's beats, each a stop of every thread (the
beats' p99, and a claim's: ``hyb_sched_gc_pause_seconds``). Nearly all of it lives as
long as the replica.

So whatever survives a full collection is frozen (``gc.freeze()``, from the
collection's own "stop" callback): it moves to the permanent generation, which no
collection walks, and the next full collection walks only what survived since. Frozen
objects are still freed by their reference counts, and what they reference stays alive
(they count as roots), so nothing is freed early. The cost: a reference cycle that
was alive at a freeze and dies later is not collected until ``refreeze`` (unfreeze,
one full collection, freeze the survivors), every ``every_s``. That is one full stop
in ``every_s`` instead of several a minute. (Instagram's servers freeze before they
fork, for their copy-on-write pages; here it is for the collector's walks.)

CPython starts a full collection once a quarter more objects have reached the old
generation than the last one left there, so a fleet that grows is frozen a quarter at
a time, as it registers. Claims are the other source of churn: they replace index
entries, and ``HostCache.freeze_churn`` freezes the young survivors every so many
changes, so no full collection has to walk them.
"""

from __future__ import annotations

import asyncio
import gc
import logging

log = logging.getLogger("scheduler.heap")


class HeapFreeze:
    """``install`` while the app serves (a full collection now, frozen after it; each
    later full collection freezes its survivors), ``loop`` to re-collect every
    ``every_s``, ``thaw`` when the app stops (the freeze is the process's, and a test
    process runs many apps one after the other). ``every_s`` 0: nothing frozen."""

    def __init__(self, every_s: float):
        self.every_s = every_s

    def _after(self, phase: str, info: dict) -> None:
        if phase == "stop" and info["generation"] == 2:
            gc.freeze()  # the collection is over: its survivors are the long-lived heap

    def install(self) -> None:
        if self.every_s <= 0 or self._after in gc.callbacks:
            return
        gc.callbacks.append(self._after)
        gc.collect()
        log.info("heap frozen: %d objects out of the collector's walks", gc.get_freeze_count())

    def refreeze(self) -> None:
        gc.unfreeze()
        gc.collect()  # frozen again by ``_after``

    async def loop(self) -> None:
        if self.every_s <= 0:
            return
        while True:
            await asyncio.sleep(self.every_s)
            await asyncio.to_thread(self.refreeze)

    def thaw(self) -> None:
        if self._after in gc.callbacks:
            gc.callbacks.remove(self._after)
            gc.unfreeze()
