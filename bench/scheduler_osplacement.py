"""The named baseline of bench/placement.py: OpenStack Placement (PyPI
``openstack-placement``) on the same database engine, driven like Nova drives it.

Its own venv (--placement-venv, created on first use with pip), ``placement-manage db
sync``, then its WSGI app ``placement.wsgi.api:application`` under gunicorn (gthread,
one worker per scheduler replica of ours), ``auth_strategy = noauth2``.

Model (what Placement can express of our hosts): one root provider per host, one child
provider per NUMA node with PCPU (the node's VM CPUs), MEMORY_MB (its hugepages, 2 MiB
and 1 GiB pools added up: Placement has no page sizes), SRIOV_NET_VF (VFs of node-local
PFs; no tx budget), DISK_GB (node-local raw disks, max_unit one disk). A VM is one
granular request group ``resources1=PCPU:v,MEMORY_MB:m[,SRIOV_NET_VF:n][,DISK_GB:d]`` so
everything comes from one NUMA node, then ``PUT /allocations/{consumer}`` with the first
candidate; a 409 (provider generation race) tries the next candidate, then asks again
(16 rounds, as our claim_retries). No SMT awareness, no CPU ids, no VF bandwidth, no page
sizes: it checks less than we do.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from tools.dev.procs import free_port
from tools.dev.schedbench import Conn, Req, Result, host_res, run_clients, stop, wait_http

MV = "placement 1.39"
HEADERS = {"X-Auth-Token": "admin", "OpenStack-API-Version": MV, "Accept": "application/json"}
NS = uuid.UUID("6c1f3f64-52c0-4a39-9d0f-4d3b0c6f0a11")
DISK_GB = 2000


def ensure_venv(venv: Path) -> Path:
    """Placement's own venv, made on first use (tools/dev/caches.py: one builder at a time)."""
    from tools.dev.caches import placement_venv
    return placement_venv(venv)


def _conf(tmp: Path, url: str, conflict_retries: int) -> Path:
    """Placement's config. ``conflict_retries`` is its ``allocation_conflict_retry_count``:
    how often ``PUT /allocations`` retries its write, inside the same database
    transaction, after a provider generation conflict. Placement's default (10)
    overcommits under concurrent writers on PostgreSQL: the retry measures the
    providers' usage *before* deleting the consumer's rows, and those now include the
    rows its failed attempt inserted, so the over-capacity check's "no worse than
    before" exception lets the write through (it logs "Over capacity ... but
    allocation of 8 reduces existing overage from 16 to 16" and answers 204). With 1
    a conflict is a 409 and the bench's client asks again, as Nova does."""
    d = tmp / "placement-etc"
    d.mkdir(exist_ok=True)
    (d / "placement.conf").write_text(
        "[DEFAULT]\ndebug = False\n[api]\nauth_strategy = noauth2\n"
        f"[placement_database]\nconnection = {url}\nsync_on_startup = False\n"
        "[placement]\nrandomize_allocation_candidates = False\n"
        f"allocation_conflict_retry_count = {conflict_retries}\n"
        "[oslo_policy]\nenforce_scope = False\nenforce_new_defaults = False\n")
    return d


def _providers(name: str, shape: Any, rack: str) -> list[tuple[str, str | None, dict[str, dict[str, int]]]]:
    """(uuid, parent uuid, inventories) for one host: the root, then one child per NUMA node."""
    res = host_res(name, shape, rack)
    root = str(uuid.uuid5(NS, name))
    out: list[tuple[str, str | None, dict[str, dict[str, int]]]] = [(root, None, {})]
    for n in res.nodes:
        inv = {"PCPU": {"total": len(n.cpus)},
               "MEMORY_MB": {"total": sum(size // 1024 * count for size, count in n.hugepages)}}
        vfs = sum(len(p.slots) for p in res.pfs if p.node in (None, n.node))
        disks = sum(1 for d in res.disks if d.node in (None, n.node))
        if vfs:
            inv["SRIOV_NET_VF"] = {"total": vfs}
        if disks:
            inv["DISK_GB"] = {"total": disks * DISK_GB, "max_unit": DISK_GB, "step_size": DISK_GB}
        out.append((str(uuid.uuid5(NS, f"{name}/numa{n.node}")), root, inv))
    return out


def _query(r: Req) -> str:
    w = r.want
    parts = [f"PCPU:{w.vcpus}", f"MEMORY_MB:{w.memory_mib}"]
    if w.vfs:
        parts.append(f"SRIOV_NET_VF:{len(w.vfs)}")
    if w.disks:
        parts.append(f"DISK_GB:{DISK_GB * len(w.disks)}")
    return "/allocation_candidates?resources1=" + ",".join(parts) + "&limit=3"


def run_placement(store: str, pg_port: int | None, hosts: list, reqs: list[Req], *, clients: int, workers: int,
                  conflict_retries: int = 1,
                  venv: Path, tmp: Path) -> Result:
    label = f"openstack-placement {store}"
    venv = ensure_venv(venv)
    url = (f"sqlite:///{tmp}/placement.db" if pg_port is None
           else f"postgresql+psycopg2://postgres@127.0.0.1:{pg_port}/placement")
    conf = _conf(tmp, url, conflict_retries)
    env = dict(os.environ, OS_PLACEMENT_CONFIG_DIR=str(conf))
    sync = subprocess.run([str(venv / "bin" / "placement-manage"), "--config-dir", str(conf), "db", "sync"],
                          env=env, capture_output=True, text=True)
    if sync.returncode:
        raise RuntimeError(f"placement-manage db sync failed:\n{sync.stdout[-1500:]}{sync.stderr[-1500:]}")
    port = free_port()
    log = tmp / f"placement-{store}.log"
    # On SQLite, Placement (oslo.db, no busy timeout) answers concurrent writers with 500
    # "database is locked" (seen with 2 workers): it gets one worker, one thread there.
    workers, threads = (1, 1) if pg_port is None else (workers, max(2, clients // workers))
    with open(log, "wb") as log_f:  # the child keeps its own descriptor
        proc = subprocess.Popen([str(venv / "bin" / "gunicorn"), "-w", str(workers), "-k", "gthread", "--threads",
                                 str(threads), "-b", f"127.0.0.1:{port}", "--log-level", "warning",
                                 "placement.wsgi.api:application"], env=env, stdout=log_f,
                                stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp)
    out = Result(label)
    try:
        wait_http(port, "/", proc, log)
        bases = [("127.0.0.1", port)]
        provs = [p for h in hosts for p in _providers(*h)]
        roots = [p for p in provs if p[1] is None]
        children = [p for p in provs if p[1] is not None]

        async def create(c: Conn, p: tuple) -> None:
            u, parent, inv = p
            body = {"name": u, "uuid": u} | ({"parent_provider_uuid": parent} if parent else {})
            r = await c.request("POST", "/resource_providers", body, HEADERS)
            if r.status != 200:
                raise RuntimeError(f"POST /resource_providers: {r.status} {r.body[:300]!r}")
            if inv:
                gen = r.json()["generation"]
                r = await c.request("PUT", f"/resource_providers/{u}/inventories",
                                    {"resource_provider_generation": gen, "inventories": inv}, HEADERS)
                if r.status != 200:
                    raise RuntimeError(f"PUT inventories: {r.status} {r.body[:300]!r}")
        t = time.perf_counter()
        asyncio.run(run_clients(clients, bases, roots, create))
        asyncio.run(run_clients(clients, bases, children, create))
        print(f"  [{label}] registered {len(hosts)} hosts ({len(provs)} providers) in "
              f"{time.perf_counter() - t:.1f} s", flush=True)

        async def place(c: Conn, r: Req) -> tuple[int, float]:
            t0 = time.perf_counter()
            consumer = str(uuid.uuid5(NS, f"vm-{r.i}"))
            for _round in range(16):
                got = await c.request("GET", _query(r), None, HEADERS)
                if got.status != 200:
                    out.note = out.note or f"GET allocation_candidates: {got.status} {got.body[:300]!r}"
                    return got.status, time.perf_counter() - t0
                cands = got.json()["allocation_requests"]
                if not cands:
                    return 507, time.perf_counter() - t0
                for cand in cands:
                    put = await c.request("PUT", f"/allocations/{consumer}",
                                          {"allocations": cand["allocations"], "project_id": "bench",
                                           "user_id": "bench", "consumer_generation": None,
                                           "consumer_type": "INSTANCE"}, HEADERS)
                    if put.status == 204:
                        return 202, time.perf_counter() - t0
                    if put.status != 409:
                        out.note = out.note or f"PUT allocations: {put.status} {put.body[:300]!r}"
                        return put.status, time.perf_counter() - t0
            return 409, time.perf_counter() - t0
        t = time.perf_counter()
        res = asyncio.run(run_clients(clients, bases, reqs, place))
        out.seconds = time.perf_counter() - t
        out.tally([(status, dt, str(status)) for status, dt in res])
        out.overcommit = _overcommit(url)
    finally:
        stop([proc])
    return out


def _overcommit(url: str) -> list[str]:
    """Providers whose allocations exceed (total - reserved) * allocation_ratio, from Placement's tables."""
    from sqlalchemy import create_engine, text
    engine = create_engine(url.replace("postgresql+psycopg2", "postgresql+psycopg"))
    try:
        with engine.connect() as c:
            rows = c.execute(text(
                "SELECT i.resource_provider_id, i.resource_class_id FROM inventories i JOIN "
                "(SELECT resource_provider_id, resource_class_id, SUM(used) AS used FROM allocations "
                " GROUP BY resource_provider_id, resource_class_id) a USING (resource_provider_id, resource_class_id) "
                "WHERE a.used > (i.total - i.reserved) * i.allocation_ratio")).all()
    finally:
        engine.dispose()
    return [f"provider {p} class {c}" for p, c in rows]
