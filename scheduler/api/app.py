"""The FastAPI application: ``create_app(settings)`` wires store, index, services."""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Response
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from api.bounds import RETRY_AFTER_JITTER
from api.states import VmStatus
from scheduler.api import errors, fastpath, gate, wire
from scheduler.api.routes import audit, fleet, hosts, rollouts, vms
from scheduler.api.routes import prometheus as prometheus_sd
from scheduler.config import Settings
from scheduler.console import headers as console_headers
from scheduler.console import routes as console_routes
from scheduler.db.engine import Store
from scheduler.db.migrate import HERE, current
from scheduler.heap import HeapFreeze
from scheduler.liveness_rule import beat_retry_after, lag_window, missed_beat_after, silent_allowance
from scheduler.metrics import Metrics
from scheduler.service.audit import AuditService
from scheduler.service.claims import Placer
from scheduler.service.drains import DrainLoop, DrainService
from scheduler.service.migrations import MigrationService
from scheduler.service.fleet import FleetService
from scheduler.service.hostcache import HostCache
from scheduler.service.liveness import Lag, LivenessWatch
from scheduler.service.pulse import Pulse
from scheduler.service.shed import Shed
from scheduler.service.hosts import HostService
from scheduler.service.rollouts import RolloutService
from scheduler.service.sessions import SessionBook
from scheduler.service.tokens import TokenBook
from scheduler.service.vms import Hostd, VmService

log = logging.getLogger(__name__)
VERSION = "1.0.0"


def head_revision() -> str:
    from alembic.config import Config
    from alembic.script import ScriptDirectory
    cfg = Config()
    cfg.set_main_option("script_location", str(HERE))
    return ScriptDirectory.from_config(cfg).get_current_head() or ""


def create_app(settings: Settings, *, store: Store | None = None, hostd: Hostd | None = None,
               clock: Callable[[], float] = time.time, background: Callable[[FastAPI], object] | None = None
               ) -> FastAPI:
    """``hostd``: the gRPC clients (None with dispatch off). ``background``: started in the
    lifespan (the reconcile loop); returns an object with ``stop()``."""
    store = store or Store.from_url(settings.db.url, busy_timeout_ms=settings.db.busy_timeout_ms,
                                    pool_size=settings.db.pool_size)

    @asynccontextmanager
    async def lifespan(app: FastAPI):  # type: ignore[no-untyped-def]
        await asyncio.to_thread(_warm_index, cache, store, clock)
        heap = HeapFreeze(settings.server.gc_freeze_s)
        await asyncio.to_thread(heap.install)
        refreeze = asyncio.get_running_loop().create_task(heap.loop())
        bg = background(app) if background else None
        drains = DrainLoop(app.state.drains, settings.drain.interval_s) \
            if app.state.dispatch_enabled and settings.drain.interval_s > 0 else None
        watch = app.state.liveness.start() if settings.liveness.check_s > 0 else None
        lag = asyncio.get_running_loop().create_task(app.state.liveness.lag.watch_loop())
        metrics.gc_pauses.install()
        try:
            yield
        finally:
            metrics.gc_pauses.remove()
            refreeze.cancel()
            heap.thaw()
            lag.cancel()
            if drains is not None:
                drains.stop()
            if watch is not None:
                watch.stop()
            if bg is not None:
                bg.stop()  # type: ignore[attr-defined]
            app.state.drains.close()
            app.state.migrations.close()
            app.state.vms.close()
            app.state.hosts.close()

    # FastAPI 0.16x instruments every request for OpenTelemetry unless told not to, and
    # its check for a configured provider was 3 % of the event loop per request (py-spy);
    # this service exports Prometheus metrics instead.
    quiet = {"telemetry": {"tracing": False, "metrics": False, "logs": False}} \
        if "telemetry" in inspect.signature(FastAPI.__init__).parameters else {}
    app = SchedulerApp(title="hybrid-kvm scheduler", version=VERSION, lifespan=lifespan, **quiet,
                  description="Placement of pinned, hugepage-backed KVM VMs on storage hosts "
                              "(NUMA-aware fit, claims with host generations, dispatch to hostd).")
    metrics = Metrics()
    if store.checkpointer is not None:
        store.checkpointer.observe = metrics.sqlite_checkpoint.observe
    # Beats answered from memory (a flush period) share the fleet's liveness through one
    # row per replica and period (scheduler/service/pulse.py); written through, the rows are it.
    pulse = Pulse(replica=f"{socket.gethostname()[:40]}-{os.getpid()}-{secrets.token_hex(4)}",
                  period_s=settings.placement.heartbeat_period_s, clock=clock,
                  keep_s=max(2 * settings.placement.heartbeat_timeout_s, 4 * settings.placement.heartbeat_period_s)) \
        if settings.stats.heartbeat_flush_s > 0 else None
    cache = HostCache(heartbeat_timeout_s=settings.placement.heartbeat_timeout_s, pulse=pulse,
                      refresh_interval_s=settings.placement.index_refresh_ms / 1000,
                      full_refresh_s=settings.placement.index_full_refresh_s or None,
                      down_check_s=settings.placement.index_down_check_s or None)
    placer = Placer(store=store, cache=cache, candidates=settings.placement.candidates,
                    retries=settings.placement.claim_retries, metrics=metrics, clock=clock,
                    claim_lock=settings.placement.claim_lock)
    app.state.settings = settings
    app.state.store = store
    app.state.tokens = TokenBook(settings.auth.tokens, store=store, refresh_s=settings.auth.refresh_s)
    app.state.metrics = metrics
    app.state.placer = placer
    app.state.dispatch_enabled = settings.dispatch.enabled and hostd is not None
    app.state.vms = VmService(store=store, placer=placer, hostd=hostd if app.state.dispatch_enabled else None,
                              default_policy=settings.placement.default_policy,
                              max_attempts=settings.dispatch.max_attempts, metrics=metrics, clock=clock,
                              claim_batch=settings.placement.claim_batch,
                              on_maintenance=settings.drain.on_maintenance)
    app.state.migrations = MigrationService(
        store=store, placer=placer, vms=app.state.vms, hostd=hostd if app.state.dispatch_enabled else None,
        cfg=settings.migration, heartbeat_timeout_s=settings.placement.heartbeat_timeout_s, clock=clock,
        metrics=metrics)
    app.state.drains = DrainService(store=store, vms=app.state.vms, clock=clock, workers=settings.drain.workers,
                                    stop_grace_s=settings.drain.stop_grace_s, migrations=app.state.migrations,
                                    orphan_after_s=settings.dispatch.timeout_s * settings.dispatch.max_attempts)
    app.state.migrations.on_done = app.state.drains.wake.set
    app.state.hosts = HostService(store=store, cache=cache, heartbeat_timeout_s=settings.placement.heartbeat_timeout_s,
                                  clock=clock, stats_bucket_s=settings.stats.bucket_s,
                                  stats_retention_days=settings.stats.retention_days,
                                  heartbeat_flush_s=settings.stats.heartbeat_flush_s,
                                  heartbeat_write_s=settings.placement.heartbeat_write_s,
                                  heartbeat_min_interval_s=settings.placement.heartbeat_min_interval_s,
                                  history_days=settings.stats.history_days, metrics=metrics,
                                  on_draining=app.state.drains.wake.set,
                                  register_batch=settings.placement.register_batch)
    app.state.rollouts = RolloutService(store=store, clock=clock)
    app.state.audit = AuditService(store=store, clock=clock)
    app.state.fleet = FleetService(store=store, heartbeat_timeout_s=settings.placement.heartbeat_timeout_s,
                                   clock=clock, pulse=pulse)
    missed_beat_s = missed_beat_after(interval_s=settings.liveness.beat_interval_s,
                                      period_s=settings.placement.heartbeat_period_s,
                                      flush_s=settings.stats.heartbeat_flush_s)
    app.state.hosts.lag = lag = Lag(window_s=lag_window(missed_beat_s=missed_beat_s,
                                                        retry_s=settings.server.shed_retry_s,
                                                        jitter=RETRY_AFTER_JITTER))
    if pulse is not None:  # its rows say when this replica lags: its peers hold their checks too
        pulse.lag_reason = lambda: lag.reason(settings.liveness.lag_bound_s)
    app.state.shed = Shed(lag=lag, loop_lag_s=settings.server.shed_loop_lag_s, hold_s=settings.server.shed_hold_s,
                          claim_queue=settings.server.shed_claim_queue, retry_s=settings.server.shed_retry_s,
                          beat_retry_s=beat_retry_after(timeout_s=settings.placement.heartbeat_timeout_s,
                                                        period_s=settings.placement.heartbeat_period_s,
                                                        flush_s=settings.stats.heartbeat_flush_s,
                                                        jitter=RETRY_AFTER_JITTER),
                          depth=app.state.vms.claims.depth, metrics=metrics)
    app.state.liveness = LivenessWatch(store=store, cfg=settings.liveness, clock=clock, pulse=pulse, lag=lag, cache=cache,
                                       heartbeat_timeout_s=settings.placement.heartbeat_timeout_s,
                                       missed_beat_s=missed_beat_s,
                                       heard_late_s=silent_allowance(period_s=settings.placement.heartbeat_period_s,
                                                                     flush_s=settings.stats.heartbeat_flush_s))
    errors.install(app)
    if settings.console.enabled:
        app.state.console = SessionBook(store, app.state.tokens, ttl_s=settings.console.session_ttl_s, clock=clock)
        console_routes.install(app)
    app.include_router(hosts.router)
    app.include_router(vms.router)
    app.include_router(audit.router)
    app.include_router(prometheus_sd.router)
    app.include_router(rollouts.router)
    app.include_router(fleet.router)

    @app.get("/healthz", tags=["ops"])
    def healthz() -> dict[str, str]:
        """The process answers."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["ops"], responses={503: {"model": errors.ErrorBody}})
    def readyz() -> Response:
        """The database answers, its schema is at the head migration, and it stores writes:
        after a write it could not store (a full disk), a probe write must succeed again."""
        try:
            rev = current(store.engine)
        except Exception as e:  # noqa: BLE001 - readiness reports any failure
            return _not_ready(f"database: {type(e).__name__}: {e}")
        if rev != head_revision():
            return _not_ready(f"schema at {rev}, head is {head_revision()}: run `scheduler db upgrade`")
        if store.health.refused is not None:
            try:
                store.probe_write()  # the refusal stands until a write is stored again
            except Exception:  # noqa: BLE001 - readiness reports any failure
                pass
            refused = store.health.refused
            if refused is not None:
                since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(refused[0]))
                return _not_ready(f"database refuses writes since {since}: {refused[1]}")
        lag = app.state.liveness.lag
        lagging = lag.reason(settings.liveness.lag_bound_s)
        if lagging is not None:
            metrics.lagging.set(1)
            return _not_ready(f"behind on its own work, marking no host down: {lagging}")
        metrics.lagging.set(0)
        if shed := lag.shed_lately():  # beats and claims: still judging, but send work elsewhere
            return _not_ready(f"overloaded: shed {shed} requests lately")
        return Response('{"status":"ready"}', media_type="application/json")

    @app.get("/metrics", tags=["ops"], response_class=Response)
    def prometheus() -> Response:
        for k, v in app.state.hosts.state_counts().items():
            metrics.hosts.labels(k).set(v)
        loop_late, flush_late = app.state.liveness.lag.worst()
        metrics.lag.labels("event_loop").set(loop_late)
        metrics.lag.labels("flush").set(flush_late)
        metrics.lagging.set(int(app.state.liveness.lag.reason(settings.liveness.lag_bound_s) is not None))
        by_status = app.state.vms.status_counts()
        for k in VmStatus:
            metrics.vms.labels(k).set(by_status.get(k, 0))
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    app.add_middleware(CountRequests, metrics=metrics)
    return app


class SchedulerApp(FastAPI):
    """FastAPI with claims and heartbeats answered ahead of the middleware stack and the
    router (``api/fastpath.py``); every other request, and every one that path hands
    back, goes through the application as usual."""

    async def __call__(self, scope, receive, send):  # type: ignore[no-untyped-def]
        name = fastpath.beat_name(scope)
        beat = bool(name)
        if beat:  # the fleet's beats first, admitted by the gate's rules (``fastpath.beat_first``)
            got = await fastpath.beat_first(self, scope, receive, send, name)
            if got is None:
                return
            receive, beat = got
        if scope["type"] == "http":
            page = None
            state = self.state
            if gate.is_console(scope["path"]):
                send = console_headers.wrap(scope, send)
                page = console_routes.refusal_page if hasattr(state, "console") else None
            srv = state.settings.server
            receive = await gate.admit(scope, receive, send, tokens=state.tokens,
                                       open_endpoints=srv.open_endpoints, max_body=srv.max_body_bytes,
                                       max_admin_body=srv.max_admin_body_bytes, page=page)
            if receive is None:
                return
        if fastpath.claims(scope):
            receive = await fastpath.create(self, scope, receive, send)
            if receive is None:
                return
        elif beat:
            receive = await fastpath.heartbeat(self, scope, receive, send)
            if receive is None:
                return
        elif fastpath.registers(scope):
            if (shed := self.state.shed.check("register")) is not None:
                await fastpath.refuse(self, send, shed, route=fastpath.REGISTER_ROUTE)
                return
            receive = await fastpath.register(self, scope, receive, send)
            if receive is None:
                return
        await super().__call__(scope, receive, send)

    def openapi(self) -> dict[str, Any]:
        """FastAPI's document, with the schemas of the bodies the routes read themselves
        (``api/wire.py``) among its components."""
        if not self.openapi_schema:
            doc = super().openapi()
            doc.setdefault("components", {}).setdefault("schemas", {}).update(wire.body_schemas())
        return self.openapi_schema


class CountRequests:
    """Requests by method, route template and status, as a plain ASGI middleware
    (Starlette's ``@app.middleware("http")`` wraps every request in extra tasks and
    streams: it measured as a good part of the per-request cost under load)."""

    def __init__(self, app, metrics: Metrics):  # type: ignore[no-untyped-def]
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = 500

        async def send_status(msg):  # type: ignore[no-untyped-def]
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
            await send(msg)
        try:
            await self.app(scope, receive, send_status)
        finally:
            route = scope.get("route")
            self.metrics.http.labels(scope["method"], getattr(route, "path", "unmatched"), str(status)).inc()


def _warm_index(cache: HostCache, store: Store, clock: Callable[[], float]) -> None:
    """The placement index's first full pass, before the server takes a request (uvicorn
    opens its port after the lifespan's start): a replica that started cold under the
    fleet's beats answered them from the database until its first pass, fell tens of
    seconds behind on liveness, and the liveness check marked hosts down that kept
    beating (100,000 hosts; 7 hosts in a CI run of the short pulse). Until the port
    opens, hostd's beats go to the other replicas. A database the pass cannot read (no
    schema yet: ``/readyz`` says so) leaves the index cold, as before."""
    t0 = time.monotonic()
    try:
        cache.refresh(store, now=clock())
    except Exception as e:  # noqa: BLE001 - the claim path and the flusher build it later
        log.warning("placement index not built at start (%s: %s); beats go to the database until it is",
                    type(e).__name__, e)
        return
    log.info("placement index built at start: %d hosts in %.2f s", len(cache.index), time.monotonic() - t0)


def _not_ready(why: str) -> Response:
    import json
    return Response(json.dumps({"error": {"code": "hyb.scheduler.not_ready", "field": None, "message": why}}),
                    status_code=503, media_type="application/json")
