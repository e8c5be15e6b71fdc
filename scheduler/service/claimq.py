"""The process's claim thread: create requests queue here and are claimed in batches
(host registrations use the same queue for their own thread: ``HostService.register_many``).

Every claim in a process already ran one at a time (``Placer``'s FIFO lock; the store
serialises writers anyway), but each on its own request thread: 32 threads passing the
GIL and the lock around, one transaction and one commit per VM. Here the event loop hands
each request to one thread, which takes everything that queued while it was busy (up to
``max_batch``) and claims it in one transaction (``Placer.claim_many``). Under load the
batch grows with the queue, so the per-commit cost is shared; with one request in flight
a batch is that one request and nothing waits for company.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from scheduler.osthread import name_this_thread

log = logging.getLogger(__name__)

_STOP = object()


class ClaimQueue:
    def __init__(self, run: Callable[[list[Any], Callable[[], list[Any]]], list[Any]], *,
                 max_batch: int = 64, name: str = "claims"):
        """``run(items, more)`` returns one result per item, a value or an exception to
        raise in that request, for ``items`` and then for every item ``more()`` handed it:
        ``more()`` takes the requests that queued since the batch formed into the batch
        (``run`` calls it once its transaction has begun: on SQLite, holding the writer
        lock it may have waited for while they arrived)."""
        self._run = run
        self._max = max(1, max_batch)
        self._name = name
        self._q: queue.SimpleQueue[tuple[Any, Future] | object] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start = threading.Lock()
        self._closed = False

    def submit(self, item: Any, loop: asyncio.AbstractEventLoop | None = None) -> Future | asyncio.Future:
        """A ``concurrent.futures.Future`` for ``item``'s result; with ``loop`` (called on that
        loop's thread), an asyncio future of it instead, settled together with the rest of
        its batch in one callback (per-request ``wrap_future`` hand-overs cost 5 % of the
        claim thread's CPU)."""
        if self._closed:
            raise RuntimeError("the claim queue is closed")
        fut: Future | asyncio.Future = Future() if loop is None else loop.create_future()
        self._q.put((item, fut))
        if self._thread is None:
            with self._start:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                    self._thread.start()
        return fut

    def _loop(self) -> None:
        name_this_thread(f"hyb-{self._name}")
        while True:
            first = self._q.get()
            if first is _STOP:
                return
            batch = [first] if _start(first[1]) else []  # type: ignore[index]
            _, stop = self._pull(batch)
            if not batch:
                if stop:
                    return
                continue

            def more() -> list[Any]:
                """What queued since the batch formed (called by ``run`` once its
                transaction has begun: on SQLite, holding the writer lock it may have
                waited for)."""
                nonlocal stop
                if stop:
                    return []
                got, stop = self._pull(batch)
                return got
            try:
                results = self._run([b[0] for b in batch], more)  # type: ignore[index]
            except BaseException as e:  # noqa: BLE001 - every request of the batch gets it
                log.exception("%s batch failed", self._name)
                results = [e] * len(batch)
            if len(results) != len(batch):  # never leave a request unanswered
                results = [RuntimeError(f"{self._name} batch answered {len(results)} of {len(batch)}")] * len(batch)
            by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future, Any]]] = {}
            for (_, fut), r in zip(batch, results):  # type: ignore[misc]
                if isinstance(fut, asyncio.Future):
                    by_loop.setdefault(fut.get_loop(), []).append((fut, r))
                else:
                    _settle(fut, r)
            for loop, settled in by_loop.items():
                try:
                    loop.call_soon_threadsafe(_settle_all, settled)
                except RuntimeError:  # the loop closed: nobody is waiting any more
                    pass
            if stop:
                return

    def _pull(self, batch: list[Any]) -> tuple[list[Any], bool]:
        """Move what is queued into ``batch``, up to ``max_batch`` in all: (the items
        added, whether the queue was closed). A request whose client went away (its
        future cancelled) is not claimed; the others can no longer be cancelled from
        here on (an asyncio future cancelled later gets its result dropped: the claim
        stands, as for a client that goes away mid-claim)."""
        got: list[Any] = []
        while len(batch) < self._max:
            try:
                nxt = self._q.get_nowait()
            except queue.Empty:
                break
            if nxt is _STOP:
                return got, True
            if _start(nxt[1]):  # type: ignore[index]
                batch.append(nxt)
                got.append(nxt[0])  # type: ignore[index]
        return got, False

    def depth(self) -> int:
        """Requests waiting for the claim thread (not the batch it is claiming)."""
        return self._q.qsize()

    def close(self, timeout: float = 10) -> None:
        """Finish what is queued, then stop the thread."""
        self._closed = True
        if self._thread is not None:
            self._q.put(_STOP)
            self._thread.join(timeout)


def _start(fut: Future | asyncio.Future) -> bool:
    if isinstance(fut, asyncio.Future):
        return not fut.cancelled()
    return fut.set_running_or_notify_cancel()


def _settle(fut: Future | asyncio.Future, r: Any) -> None:
    if isinstance(r, BaseException):
        fut.set_exception(r)
    else:
        fut.set_result(r)


def _settle_all(settled: list[tuple[asyncio.Future, Any]]) -> None:
    """On the futures' loop: one batch's results."""
    for fut, r in settled:
        if not fut.done():  # cancelled meanwhile: the client is gone
            _settle(fut, r)
