"""hostd's handle on libvirt: one connection that survives libvirtd restarts,
and the few domain operations hostd needs, with libvirt errors turned into
hostd errors that name the domain.

Domains hostd owns carry an element in hostd's metadata namespace; only those
are ever listed, changed or removed (as oVirt VDSM recognises its VMs).

Domain lifecycle events and reconnects go to the ``DomainListener``s subscribed
(the VM manager): each connection registers for lifecycle events, and every
connection after the first tells the listeners to resync what changed while
hostd was blind. ``close`` stops that first: the callback is deregistered and every
listener call in flight has returned before it does, so a daemon stopping can close
what the listeners write to (the ledger) after it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import libvirt

from hostd.apply.ledger import VmState
from hostd.errors import DomainError, LibvirtUnavailable

log = logging.getLogger(__name__)

STOP_WAIT_S = 30.0  # close() waits this long for listener calls in flight
RECONNECT_ATTEMPTS = 30
RECONNECT_DELAY_S = 0.2
KEEPALIVE = (5, 3)  # seconds between probes, probes missed before libvirt drops the connection

# Lifecycle events hostd acts on, and the VM state each one means.
EVENT_STATES = {
    libvirt.VIR_DOMAIN_EVENT_STARTED: VmState.RUNNING,
    libvirt.VIR_DOMAIN_EVENT_RESUMED: VmState.RUNNING,
    libvirt.VIR_DOMAIN_EVENT_STOPPED: VmState.STOPPED,
    libvirt.VIR_DOMAIN_EVENT_SHUTDOWN: VmState.STOPPED,
    libvirt.VIR_DOMAIN_EVENT_CRASHED: VmState.FAILED,
}
_event_loop_started = False


class DomainListener(Protocol):
    def on_domain_event(self, vm_id: str, state: str, reason: str) -> None: ...

    def on_reconnect(self) -> None: ...


def start_event_loop() -> None:
    """libvirt's default event implementation, run on one daemon thread. Must be
    registered before the first connection is opened; once per process."""
    global _event_loop_started
    if _event_loop_started:
        return
    libvirt.virEventRegisterDefaultImpl()

    def run() -> None:
        while True:
            libvirt.virEventRunDefaultImpl()
    threading.Thread(target=run, name="libvirt-events", daemon=True).start()
    _event_loop_started = True


@dataclass(frozen=True)
class OwnedDomain:
    name: str
    uuid: str
    active: bool
    metadata: str  # the raw XML of hostd's metadata element


class LibvirtHost:
    def __init__(self, uri: str, metadata_uri: str, *,
                 open_fn: Callable[[str], libvirt.virConnect] = libvirt.open):
        self.uri = uri
        self.metadata_uri = metadata_uri
        self._open = open_fn
        self._lock = threading.RLock()
        self._conn: libvirt.virConnect | None = None
        self.reconnects = 0
        self._listeners: list[DomainListener] = []
        self._connected_once = False
        self._callback_id: int | None = None  # the lifecycle callback on self._conn
        # Listener calls run on threads of their own; close() stops new ones and waits
        # for these. A lock of its own: libvirt's event loop thread takes it.
        self._calls_lock = threading.Lock()
        self._calls: set[threading.Thread] = set()
        self._stopped = False

    def subscribe(self, listener: DomainListener) -> None:
        """Lifecycle events of every domain, and a call after each reconnect, from the
        next connection on (``start_event_loop`` must have run for events to flow)."""
        with self._lock:
            self._listeners.append(listener)

    # -- connection ---------------------------------------------------------

    def conn(self) -> libvirt.virConnect:
        """A live connection; reconnects (bounded) when libvirtd went away."""
        with self._lock:
            if self._conn is not None:
                try:
                    if self._conn.isAlive():
                        return self._conn
                except libvirt.libvirtError:
                    pass
                log.warning("libvirt connection lost uri=%s", self.uri)
                self._close_quietly()
                self.reconnects += 1
            last: Exception | None = None
            for _ in range(RECONNECT_ATTEMPTS):
                try:
                    self._conn = self._open(self.uri)
                    log.info("libvirt connected uri=%s", self.uri)
                except libvirt.libvirtError as e:
                    last = e
                    time.sleep(RECONNECT_DELAY_S)
                    continue
                self._hook(self._conn)
                return self._conn
            raise LibvirtUnavailable(f"cannot connect to {self.uri}: {last}", field="libvirt")

    def _hook(self, conn: libvirt.virConnect) -> None:
        """Register the listeners on a new connection. The listeners run on threads of
        their own: this runs under the connection lock, a listener takes the manager's
        lock, and a gRPC call may hold the two the other way round."""
        if not self._listeners:
            return

        def lifecycle(_conn, dom, event, detail, _opaque) -> None:
            state = EVENT_STATES.get(event)
            if state:
                for li in list(self._listeners):
                    self._call(li.on_domain_event, "domain-event",
                               dom.UUIDString(), state, f"libvirt event {event}/{detail}")
        try:
            self._callback_id = conn.domainEventRegisterAny(None, libvirt.VIR_DOMAIN_EVENT_ID_LIFECYCLE,
                                                            lifecycle, None)
        except libvirt.libvirtError as e:
            log.error("cannot register for domain events uri=%s: %s", self.uri, e)
        try:
            conn.setKeepAlive(*KEEPALIVE)
        except libvirt.libvirtError as e:  # the test driver has none: a local connection needs none
            log.info("no keepalive on uri=%s: %s", self.uri, e.get_error_message())
        if self._connected_once:
            for li in list(self._listeners):
                self._call(li.on_reconnect, "reconcile")
        self._connected_once = True

    def _call(self, fn: Callable[..., None], name: str, *args: object) -> None:
        """Run a listener call on a thread of its own, unless events are stopped."""
        def run() -> None:
            try:
                fn(*args)
            finally:
                with self._calls_lock:
                    self._calls.discard(threading.current_thread())
        with self._calls_lock:
            if self._stopped:
                return
            t = threading.Thread(target=run, name=name, daemon=True)
            self._calls.add(t)
            t.start()

    def stop_events(self) -> None:
        """No listener is called from now on: the callback is deregistered, and the calls
        in flight have returned (or STOP_WAIT_S passed, which is logged)."""
        with self._calls_lock:
            self._stopped = True
            calls = list(self._calls)
        with self._lock:
            self._deregister()
        deadline = time.monotonic() + STOP_WAIT_S
        for t in calls:
            t.join(max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                log.error("a libvirt event listener is still running after %.0f s: %s", STOP_WAIT_S, t.name)

    def _deregister(self) -> None:
        if self._conn is not None and self._callback_id is not None:
            try:
                self._conn.domainEventDeregisterAny(self._callback_id)
            except libvirt.libvirtError:
                pass  # a dead connection delivers nothing more either
        self._callback_id = None

    def close(self) -> None:
        """Stop events (``stop_events``), then close the connection."""
        self.stop_events()
        with self._lock:
            self._close_quietly()

    def _close_quietly(self) -> None:
        self._deregister()
        if self._conn is not None:
            try:
                self._conn.close()
            except libvirt.libvirtError:
                pass
            self._conn = None

    def _retrying(self, what: str, fn: Callable[[libvirt.virConnect], object]) -> object:
        """Run ``fn`` once more on a fresh connection if the first one died mid-call."""
        for attempt in (1, 2):
            c = self.conn()
            try:
                return fn(c)
            except libvirt.libvirtError as e:
                if attempt == 1 and e.get_error_code() in (libvirt.VIR_ERR_SYSTEM_ERROR,
                                                           libvirt.VIR_ERR_RPC,
                                                           libvirt.VIR_ERR_INTERNAL_ERROR) \
                        and not _alive(c):
                    continue
                raise DomainError(f"{what}: {e.get_error_message()}", field=what) from None
        raise AssertionError("unreachable")

    # -- domains ------------------------------------------------------------

    def define(self, name: str, xml: str) -> str:
        return str(self._retrying(f"domain {name}", lambda c: c.defineXML(xml).UUIDString()))

    def start(self, uuid: str) -> None:
        self._retrying(f"domain {uuid}", lambda c: c.lookupByUUIDString(uuid).create())

    def destroy_and_undefine(self, uuid: str) -> None:
        """Gone for good; a domain already gone is not an error."""
        def op(c: libvirt.virConnect) -> None:
            try:
                dom = c.lookupByUUIDString(uuid)
            except libvirt.libvirtError as e:
                if e.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                    return
                raise
            if dom.isActive():
                dom.destroy()
            _undefine(dom)
        self._retrying(f"domain {uuid}", op)

    def shutdown(self, uuid: str, grace_s: float) -> None:
        """ACPI shutdown, then destroy after ``grace_s`` seconds."""
        def op(c: libvirt.virConnect) -> None:
            dom = c.lookupByUUIDString(uuid)
            if not dom.isActive():
                return
            if grace_s > 0:
                try:
                    dom.shutdown()
                except libvirt.libvirtError:
                    pass
                deadline = time.monotonic() + grace_s
                while time.monotonic() < deadline and dom.isActive():
                    time.sleep(0.1)
            if dom.isActive():
                dom.destroy()
        self._retrying(f"domain {uuid}", op)

    def active(self, uuid: str) -> bool | None:
        """Whether the domain runs now (None: no such domain)."""
        def op(c: libvirt.virConnect) -> bool | None:
            try:
                return bool(c.lookupByUUIDString(uuid).isActive())
            except libvirt.libvirtError as e:
                if e.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                    return None
                raise
        return self._retrying(f"domain {uuid}", op)  # type: ignore[return-value]

    def xml(self, uuid: str, *, live: bool = True) -> str:
        flags = 0 if live else libvirt.VIR_DOMAIN_XML_INACTIVE
        return str(self._retrying(f"domain {uuid}", lambda c: c.lookupByUUIDString(uuid).XMLDesc(flags)))

    def set_iotune(self, uuid: str, target: str, params: dict[str, int | str]) -> None:
        """Live and persistent; two calls, because some drivers refuse LIVE|CONFIG together."""
        def op(c: libvirt.virConnect) -> None:
            dom = c.lookupByUUIDString(uuid)
            if dom.isActive():
                dom.setBlockIoTune(target, params, libvirt.VIR_DOMAIN_AFFECT_LIVE)
            dom.setBlockIoTune(target, params, libvirt.VIR_DOMAIN_AFFECT_CONFIG)
        self._retrying(f"domain {uuid}", op)

    def get_iotune(self, uuid: str, target: str) -> dict[str, int | str]:
        return dict(self._retrying(  # type: ignore[arg-type]
            f"domain {uuid}", lambda c: c.lookupByUUIDString(uuid).blockIoTune(target, 0)))

    def owned(self) -> list[OwnedDomain]:
        """Every domain carrying hostd's metadata element, running or not."""
        def op(c: libvirt.virConnect) -> list[OwnedDomain]:
            out = []
            for dom in c.listAllDomains():
                try:
                    meta = dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, self.metadata_uri)
                except libvirt.libvirtError as e:
                    if e.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN_METADATA:
                        continue
                    if e.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                        continue  # vanished while listing
                    raise
                out.append(OwnedDomain(dom.name(), dom.UUIDString(), bool(dom.isActive()), meta))
            return out
        return list(self._retrying("list domains", op))  # type: ignore[arg-type]


def _undefine(dom: libvirt.virDomain) -> None:
    try:
        dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)
    except libvirt.libvirtError:
        dom.undefine()


def _alive(c: libvirt.virConnect) -> bool:
    try:
        return bool(c.isAlive())
    except libvirt.libvirtError:
        return False
