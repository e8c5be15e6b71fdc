"""Helpers shared by the scheduler tests (imported by basename: tests/scheduler, the
directory of its conftest.py, is on sys.path under pytest's default import mode, also for
the tests in its subdirectories)."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from scheduler.config import Settings
from scheduler.db.engine import Store
from scheduler.db.migrate import upgrade
from tools.dev import sched_inproc
from tools.dev.schedbench import create_database
from tools.dev.host_shapes import SHAPES, Shape, make_layout


TOKENS = {"adm": ["admin"], "ta": ["tenant:a"], "tb": ["tenant:b"], "hst": ["host"], "hst2": ["host"],
          "oss1": ["host:oss-1"]}


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def token_config() -> list[dict]:
    return sched_inproc.token_config(TOKENS)


class Clock:
    def __init__(self, t: float = 1_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def settings(db_url: str, **over: Any) -> Settings:
    return sched_inproc.settings(db_url, TOKENS, **over)


def make_client(db_url: str, *, clock: Clock | None = None, hostd=None, **over: Any) -> TestClient:  # type: ignore[no-untyped-def]
    return sched_inproc.scheduler_client(db_url, TOKENS, clock=clock or Clock(), hostd=hostd, **over)


def host_body(name: str, shape: Shape = SHAPES[0], *, rack: str = "", address: str = "", **labels: str) -> dict:
    layout, sib = make_layout(shape)
    return {"name": name, "address": address or f"{name}:7443", "rack": rack, "labels": labels,
            "layout": json.loads(layout.to_json()), "cpu_siblings": {str(k): list(v) for k, v in sib.items()}}


def vm_body(name: str = "web-1", vcpus: int = 2, memory_mib: int = 1024, **kw: Any) -> dict:
    return {"name": name, "vcpus": vcpus, "memory_mib": memory_mib, "image": "smoke", **kw}


ADM, TA, TB, HOST = auth("adm"), auth("ta"), auth("tb"), auth("hst")

# For the 1 GiB demand hint: a node a 1 GiB VM of 8 vCPUs needs whole, and a plain
# 12-CPU node (best fit on CPUs alone prefers the former's 8-CPU hole)
ONE_G = Shape("one-1g", nodes=1, cores_per_node=6, smt=2, io_cores_per_node=1, host_cores=1, pages_2m_per_node=6144,
              pages_1g_per_node=16, vfs_per_node=0, disks_per_node=0)  # 8 VM CPUs, 12 GiB 2M, 16 GiB 1G
PLAIN = Shape("plain", nodes=1, cores_per_node=8, smt=2, io_cores_per_node=1, host_cores=1, pages_2m_per_node=12288,
              vfs_per_node=0, disks_per_node=0)  # 12 VM CPUs, 24 GiB 2M


_PG_TEMPLATES: dict[str, str] = {}  # server base URL -> its migrated, empty template database


def new_pg_database(base_url: str, *, migrated: bool = True) -> str:
    """A new database on the PostgreSQL server at ``base_url`` (the session's
    ``pg_server``), migrated to the head and empty (``migrated=False``: not even the
    schema, for the migrations' own tests); its URL. It is a copy of a template
    migrated once per server and process, as the in-process SQLite databases are
    (``tools/dev/sched_inproc._from_template``): Alembic's upgrade took 0.13-0.17 s a
    database, and the suite makes about 230. The whole migration chain still runs on
    PostgreSQL in tests/scheduler/db/."""
    name = "t_" + uuid.uuid4().hex[:12]
    create_database(_port(base_url), name, template=_pg_template(base_url) if migrated else "")
    return f"{base_url}/{name}"


def _port(base_url: str) -> int:
    return int(base_url.rsplit(":", 1)[1])


def _pg_template(base_url: str) -> str:
    """This process's migrated template database on the server at ``base_url``, made
    the first time it is asked for."""
    template = _PG_TEMPLATES.get(base_url)
    if template is None:
        template = f"tmpl_{os.getpid()}"
        create_database(_port(base_url), template)
        store = Store.from_url(f"{base_url}/{template}")
        try:
            upgrade(store.engine)
        finally:
            store.dispose()  # CREATE DATABASE ... TEMPLATE refuses a template in use
        _PG_TEMPLATES[base_url] = template
    return template


def database(request: pytest.FixtureRequest, tmp_path: Path, *, migrated: bool = True) -> str:
    """The URL of a new database for ``request.param``'s store: an SQLite file not yet
    made (the in-process scheduler makes it at the head), or a PostgreSQL database at the
    head (``migrated=False``: empty, for tests/scheduler/db/)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/sched.db"
    return new_pg_database(request.getfixturevalue("pg_server"), migrated=migrated)


def database_and_lock(request: pytest.FixtureRequest, tmp_path: Path, *, migrated: bool = True) -> tuple[str, str]:
    """(``database``, ``placement.claim_lock``) for a ``STORES_AND_LOCKS`` parameter."""
    return database(request, tmp_path, migrated=migrated), request.param.partition("-")[2] or "store"


STORES = ["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)]
STORES_AND_LOCKS = [*STORES, pytest.param("postgresql-rows", marks=pytest.mark.integration)]
