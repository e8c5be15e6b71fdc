"""Who a caller is and what it may do: the one place for each resource's rules.

The API's routes and the web console ask the same function before they call a service,
so a rule cannot exist on one path only, and neither adds one of its own (placement's
``policies/<resource>.py``). A rule either returns (allowed), returns what the caller is
limited to (a tenant), or raises ``Forbidden`` naming what is missing. Checks that need
the stored record (a host principal beating for a host another principal registered,
``HostNotYours``) stay with the record, in the service.

Scopes: ``admin`` (everything), ``tenant:<name>`` (its VMs, its audit), ``host`` and
``host:<name>`` (registration, heartbeats, reading hosts), ``prometheus`` (the scrape
targets)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from scheduler.errors import Forbidden


@dataclass(frozen=True)
class Principal:
    """Who a caller is. Its derived properties are computed once: a principal is made once
    per token (``service.tokens.Entry.principal``), and every heartbeat asked ``host``
    three times."""

    name: str
    scopes: frozenset[str]

    @cached_property
    def admin(self) -> bool:
        return "admin" in self.scopes

    @cached_property
    def tenant(self) -> str | None:
        return next((s.split(":", 1)[1] for s in sorted(self.scopes) if s.startswith("tenant:")), None)

    @cached_property
    def host(self) -> str | None:
        """The one host a ``host:<name>`` token may act as; None for other principals."""
        return next((s.split(":", 1)[1] for s in sorted(self.scopes) if s.startswith("host:")), None)

    def require(self, *any_of: str) -> None:
        """Any of the scopes, or admin. ``host:<name>`` counts as ``host``."""
        if self.admin or not self.scopes.isdisjoint(any_of) or ("host" in any_of and self.host):
            return
        raise Forbidden(f"{self.name} lacks scope {' or '.join(any_of) or 'admin'}")


def allowed(rule, p: Principal) -> bool:  # type: ignore[no-untyped-def]
    """Does ``rule`` let ``p`` through (what a page offers: a link, a form)?"""
    try:
        rule(p)
    except Forbidden:
        return False
    return True


def _tenant_scope(p: Principal) -> str | None:
    """None = sees every tenant (admin); else the tenant the principal is limited to."""
    if p.admin:
        return None
    if p.tenant is None:
        raise Forbidden(f"{p.name} has no tenant scope")
    return p.tenant


# ---------------------------------------------------------------------- hosts


def act_as_host(p: Principal) -> None:
    """Register, beat, send day summaries (the service then checks which host)."""
    p.require("host")


def read_hosts(p: Principal) -> None:
    """The host list, a host, its stats and its drain, the fleet's host summary."""
    p.require("host")


def hold_host(p: Principal) -> None:
    """Cordon, drain, uncordon."""
    p.require()


# ---------------------------------------------------------------------- fleet


def read_fleet(p: Principal) -> None:
    """The utilisation history: distributions, heatmap, a bin's hosts, IO health."""
    p.require()


# ---------------------------------------------------------------------- VMs


def vm_tenant(p: Principal) -> str | None:
    """The tenant whose VMs ``p`` may read, delete and change: None for every tenant."""
    return _tenant_scope(p)


def create_tenant(p: Principal, asked: str | None) -> str:
    """The tenant a new VM of ``p`` belongs to, ``asked`` being the body's ``tenant``: an
    admin names any (``default`` when none), a tenant only its own."""
    scope = _tenant_scope(p)
    if scope is not None and asked not in (None, scope):
        raise Forbidden(f"{p.name} may only create VMs for tenant {scope}", field="tenant")
    return scope or asked or "default"


def move_vm(p: Principal) -> None:
    """Move a VM live to another host (``POST /v1/vms/{id}/migrate``): an operator's act
    (it picks hosts and spends a disruption budget), as a drain is."""
    p.require()


# ---------------------------------------------------------------------- audit


def audit_tenant(p: Principal) -> str | None:
    """The tenant whose records ``p`` reads (its VMs' and its principals'): None for all."""
    return _tenant_scope(p)


# ---------------------------------------------------------------------- rollouts


def rollouts(p: Principal) -> None:
    """Every rollout call, reads included."""
    p.require()


# ---------------------------------------------------------------------- Prometheus


def scrape_targets(p: Principal) -> None:
    p.require("prometheus")
