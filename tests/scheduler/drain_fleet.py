"""A fleet for the scheduler's drain and live-migration tests (imported by basename, as
sched_helpers): three real hostd gRPC servers in-process (tools/dev/hostd_inproc.py:
libvirt's test driver, real SQLite ledgers, mTLS) registered with a real scheduler
(its drain loop in its lifespan, dispatch on), on SQLite and PostgreSQL.

``fleet``: the hostds share the test driver (``test:///default``), as the drain tests
always had them. ``private_fleet``: each hostd has a test driver of its own, so a VM
runs on one of them only and live migration works between them (``InprocMigrations``);
it yields a ``Fleet`` whose ``scheduler()`` starts another scheduler process's worth
(a new app) on the same database: a restart."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.layout import HugepageTarget, NodeLayout
from sched_helpers import HOST, TA, make_client, vm_body
from scheduler.config import DispatchConfig
from scheduler.dispatch import HostdClients
from tools.dev.hostd_inproc import LAYOUT, InprocHostd, dev_certs, start_hostd

# Four 1-vCPU VMs of 128 MiB fit each host.
ROOMY = replace(LAYOUT, nodes=(NodeLayout(0, (0,), (1,), (2, 3, 4, 5), (HugepageTarget(2048, 512),)),))
NAMES = ("h1", "h2", "h3")


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    return dev_certs(tmp_path_factory.mktemp("ca"))


@dataclass
class Fleet:
    db_url: str
    clients: HostdClients
    hostds: dict[str, InprocHostd]

    @contextlib.contextmanager
    def scheduler(self, *, register: bool = False, **over: Any) -> Iterator[TestClient]:
        """A scheduler on the fleet's database and hostds (``register``: the hosts too)."""
        over = {"dispatch": {"enabled": True}, "drain": {"interval_s": 0.2, "stop_grace_s": 0}} | over
        with make_client(self.db_url, hostd=self.clients, **over) as api:
            if register:
                for name in self.hostds:
                    self.register(api, name)
            yield api

    def register(self, api: TestClient, name: str, *, address: str = "") -> None:
        """Register (or re-register) a host with its hostd's address, or ``address``."""
        body = {"name": name, "address": address or f"localhost:{self.hostds[name].port}",
                "layout": json.loads(ROOMY.to_json()), "rack": name}
        assert api.post("/v1/hosts", json=body, headers=HOST).status_code in (200, 201)


@contextlib.contextmanager
def _fleet(tmp_path: Path, certs: Path, db_url: str, *, private: bool) -> Iterator[Fleet]:
    started: dict[str, InprocHostd] = {}
    clients = HostdClients(DispatchConfig(ca=str(certs / "ca.crt"), cert=str(certs / "scheduler.crt"),
                                          key=str(certs / "scheduler.key"), timeout_s=10, max_attempts=3))
    try:
        for name in NAMES:
            d = tmp_path / name
            d.mkdir()
            started[name] = start_hostd(d, certs, name, layout=ROOMY, workers=4, private=private)
        yield Fleet(db_url, clients, started)
    finally:
        clients.close()
        for h in started.values():
            h.stop("t-")


@pytest.fixture
def fleet(tmp_path: Path, certs: Path, db_url: str):  # type: ignore[no-untyped-def]
    with _fleet(tmp_path, certs, db_url, private=False) as f, f.scheduler(register=True) as api:
        yield api, {n: h.manager for n, h in f.hostds.items()}


@pytest.fixture
def private_fleet(tmp_path: Path, certs: Path, db_url: str) -> Iterator[Fleet]:
    with _fleet(tmp_path, certs, db_url, private=True) as f:
        yield f


def create(api, name: str, **kw) -> str:  # type: ignore[no-untyped-def]
    r = api.post("/v1/vms", json=vm_body(name, vcpus=1, memory_mib=128, **kw), headers=TA | {"Idempotency-Key": name})
    assert r.status_code == 202, r.text
    assert api.get(f"/v1/vms/{r.json()['id']}", headers=TA).json()["status"] == "running"
    return r.json()["id"]


def wait(pred, what: str, timeout: float = 30.0):  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")
