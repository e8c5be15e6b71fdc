"""hostd's handle on libvirt: one connection that survives libvirtd restarts,
and the few domain operations hostd needs, with libvirt errors turned into
hostd errors that name the domain.

Domains hostd owns carry an element in hostd's metadata namespace; only those
are ever listed, changed or removed (as oVirt VDSM recognises its VMs).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import libvirt

from hostd.errors import HostdError

log = logging.getLogger(__name__)

RECONNECT_ATTEMPTS = 30
RECONNECT_DELAY_S = 0.2


class LibvirtUnavailable(HostdError):
    code = "hyb.host.libvirt_unavailable"


class DomainError(HostdError):
    code = "hyb.vm.libvirt_error"


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
        # Called with each new connection (event callbacks, resync after a reconnect).
        self.on_connect: list[Callable[[libvirt.virConnect], None]] = []

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
                for fn in self.on_connect:
                    try:
                        fn(self._conn)
                    except Exception:
                        log.exception("on_connect hook failed")
                return self._conn
            raise LibvirtUnavailable(f"cannot connect to {self.uri}: {last}", field="libvirt")

    def close(self) -> None:
        with self._lock:
            self._close_quietly()

    def _close_quietly(self) -> None:
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

    def define_and_start(self, name: str, xml: str) -> str:
        """Define and start; on a failed start the definition is removed again.
        Returns the domain UUID."""
        def op(c: libvirt.virConnect) -> str:
            dom = c.defineXML(xml)
            try:
                dom.create()
            except libvirt.libvirtError:
                _undefine(dom)
                raise
            return dom.UUIDString()
        return str(self._retrying(f"domain {name}", op))

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
