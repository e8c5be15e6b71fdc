"""The wire format of the two requests the fast path answers, read in one place.

``POST /v1/vms`` and ``POST /v1/hosts/{name}/heartbeat`` are served twice: by their
routes (``routes/vms.py``, ``routes/hosts.py``: the contract in the OpenAPI document,
which answer every request the fast path hands over) and by ``api/fastpath.py``, which
skips the framework under load. Both read the request here, from the same raw inputs
(the principal, the headers' text, the body's bytes), so there is one reading of each
body and one set of errors: a field that does not validate is a ``RequestValidationError``
with the route's locations, a refusal a ``SchedulerError``, whichever path called.

The create answer (the VM's JSON and the headers) is written here too, for the same
reason: both paths send it.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from functools import cache
from typing import Any

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from pydantic import TypeAdapter, ValidationError

from scheduler import policies
from scheduler.api.gate import BodyTooLarge
from scheduler.db.models import Vm
from scheduler.errors import InvalidRequest
from scheduler.migration_view import last_migration_json, migration_json
from scheduler.policies import Principal
from scheduler.schemas.hosts import HeartbeatIn, HeartbeatOut, HostRegister
from scheduler.schemas.vms import VmCreate
from scheduler.service.vms import cells_json

KEY = r"^[A-Za-z0-9_.:-]{1,128}$"
KEY_RE = re.compile(KEY)
_BOOL = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}

@dataclass(frozen=True, slots=True)
class CreateRequest:
    """A create request as read: the VM, the tenant it belongs to, the key, a dry run?,
    and who asks (the audit's actor)."""

    body: VmCreate
    tenant: str
    key: str
    dry_run: bool
    actor: str


def json_content(ctype: str) -> bool:
    """A body sent as JSON, or with no Content-Type at all."""
    return not ctype or ctype.split(";", 1)[0].strip().lower().endswith(("/json", "+json"))


def invalid(loc: tuple, msg: str) -> RequestValidationError:
    return RequestValidationError([{"loc": loc, "msg": msg, "type": "value_error"}])


@cache
def _adapter(kind: Any) -> TypeAdapter:
    return TypeAdapter(kind)


def _model(kind: Any, body: bytes) -> Any:
    """The body as ``kind`` (a model, or a model or null); its errors located under
    ``body`` as FastAPI locates them."""
    try:
        return _adapter(kind).validate_json(body)
    except ValidationError as e:
        raise RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in e.errors()]) from None


def read_create(p: Principal, *, dry_run: str | None, key: str | None, ctype: str,
                body: bytes) -> CreateRequest:
    """``POST /v1/vms`` from its ``dry_run`` query value, ``Idempotency-Key`` and
    ``Content-Type`` headers (None/"" when absent) and body, checked in the order FastAPI
    would solve them (query, header, body), then who may create it (403 for another
    tenant's VM) and the key a create needs (422)."""
    dry = False if dry_run is None else _BOOL.get(dry_run.lower())
    if dry is None:
        raise invalid(("query", "dry_run"), "Input should be a valid boolean, unable to interpret input")
    if key is not None and not KEY_RE.match(key):
        raise invalid(("header", "Idempotency-Key"), f"String should match pattern '{KEY}'")
    if not json_content(ctype):
        raise invalid(("body",), f"send the VM as JSON (Content-Type: application/json), not {ctype}")
    vm = _model(VmCreate, body)
    tenant = policies.create_tenant(p, vm.tenant)
    if not key:
        raise InvalidRequest("required: a retry with the same key returns the same VM", field="Idempotency-Key")
    return CreateRequest(body=vm, tenant=tenant, key=key, dry_run=dry, actor=p.name)


def read_register(p: Principal, *, ctype: str, body: bytes) -> HostRegister:
    """``POST /v1/hosts``'s body, for the fast path (``api/fastpath.register``): who may
    register (403), then JSON ``HostRegister``. The route still reads its body through
    FastAPI (the contract); the fast path hands it every request this refuses."""
    policies.act_as_host(p)
    kind = ctype.split(";", 1)[0].strip().lower()  # FastAPI's rule: application/json or application/*+json
    if not (kind.startswith("application/") and kind.endswith(("/json", "+json"))):
        raise invalid(("body",), f"send the host as JSON (Content-Type: application/json), not {ctype!r}")
    return _model(HostRegister, body)


MAX_BEAT_BYTES = 64 << 10


def read_heartbeat(p: Principal, *, ctype: str, body: bytes) -> HeartbeatIn | None:
    """A heartbeat's body: none (blank) or ``null`` is a beat without stats; else JSON
    ``HeartbeatIn``. The principal may act as a host first."""
    policies.act_as_host(p)
    if len(body) > MAX_BEAT_BYTES:
        raise BodyTooLarge(f"{len(body)} bytes; a heartbeat's body is at most {MAX_BEAT_BYTES} "
                           "(its stats are a few hundred)", field="body")
    if not body.strip():
        return None
    if not json_content(ctype):
        raise invalid(("body",), f"send the heartbeat as JSON (Content-Type: application/json), not {ctype}")
    return _model(HeartbeatIn | None, body)  # the contract's body: a HeartbeatIn or null


async def beat(hosts: Any, name: str, p: Principal, beat: HeartbeatIn | None) -> dict:
    """Answer a heartbeat read by ``read_heartbeat``, as the JSON of ``HeartbeatOut``: from
    memory on the event loop when it can (``HostService.beat_now``: no database, no thread
    hop, and no model: its validation and dump were a tenth of a beat's CPU on the fast
    path), else through the database on the thread pool (``heartbeat``: 404, refusals
    and their audit). The route renders it through its ``response_model``, the fast path
    as it is: a test keeps the two equal."""
    got = beat_from_memory(hosts, name, p, beat)
    if got is not None:
        return got
    out = await run_in_threadpool(hosts.heartbeat, name, actor=p.name, admin=p.admin, bound_host=p.host,
                                  stats=beat.stats if beat else None)
    return out.model_dump(mode="json")


def beat_from_memory(hosts: Any, name: str, p: Principal, beat: HeartbeatIn | None) -> dict | None:
    """``beat``'s answer from memory (``HostService.beat_now``), or None when the database
    must answer it."""
    got = hosts.beat_now(name, actor=p.name, admin=p.admin, bound_host=p.host, stats=beat.stats if beat else None)
    return None if got is None else beat_json(name, *got)


def beat_json(name: str, state: str, generation: int, last_heartbeat: float) -> dict:
    """``HeartbeatOut(...).model_dump(mode="json")``, without the model."""
    return {"name": name, "state": str(state), "generation": generation, "last_heartbeat": last_heartbeat}


def body_schemas() -> dict[str, dict]:
    """The OpenAPI component schemas of the bodies read here that no model FastAPI parses
    refers to (the heartbeat's; ``VmCreate`` is in ``VmPublic``): FastAPI lists only the
    models it parses itself. Written by FastAPI's own generator, from a route that
    declares the body as the heartbeat route did, so they read exactly as before."""
    r = APIRouter()

    @r.post("/", responses={422: {"description": "invalid"}})  # no HTTPValidationError schemas
    def declared(body: HeartbeatIn | None = None) -> None:
        """Documentation only: never served."""
    return get_openapi(title="bodies", version="0", routes=r.routes)["components"]["schemas"]


def vm_json(vm: Vm) -> dict:
    """``service/vms.vm_public(vm)`` as JSON, built directly: the create answer (re-validating
    the stored request through the models cost as much as the claim). A test keeps the
    two equal."""
    a = vm.allocation
    placement = None if not a else {
        "nodes": list(a["nodes"]), "cpus": list(a["cpus"]),
        "hugepages": [{"node": n, "size_kb": s, "count": c} for n, s, c in a["pages"]],
        "vfs": [dict(v) for v in a.get("vfs", ())], "disks": [dict(d) for d in a.get("disks", ())],
        "cells": cells_json(a["nodes"], a["cpus"], a["pages"], a.get("cell_vcpus", ()))}
    return {"id": vm.id, "name": vm.name, "tenant": vm.tenant, "status": vm.status, "reason": vm.reason,
            "host": vm.host, "replaces": vm.replaces, "placement": placement, "hostd_vm_id": vm.hostd_vm_id,
            "attempts": vm.attempts,
            # as vm_public: the stored request carries the effective tenant, the public one None
            "request": {k: (None if k == "tenant" else v) for k, v in vm.request.items()},
            "migration": None if not vm.migration_state else migration_json(vm, time.time()),
            "last_migration": last_migration_json(vm),
            "created": vm.created, "updated": vm.updated}


def created_headers(vm: Vm, claim_s: float) -> dict[str, str]:
    """The create answer's headers: the claim's time (fit + transaction, the bench reads
    it) and where the VM lives."""
    return {"Server-Timing": f"claim;dur={claim_s * 1e3:.3f}", "Location": f"/v1/vms/{vm.id}"}
