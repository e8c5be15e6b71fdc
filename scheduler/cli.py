"""`scheduler` console script.

  scheduler serve --config /etc/hybrid-kvm/scheduler.toml
  scheduler db upgrade --config FILE        (or --url sqlite:////path.db)
  scheduler db current --config FILE
  scheduler openapi > api/openapi.json
  scheduler hash-token TOKEN                (the sha256 to put under [[auth.tokens]])
  scheduler token create --config FILE --name oss-1 --scope host:oss-1 --ttl 90d
  scheduler token list --config FILE
  scheduler token revoke --config FILE ID | --name PRINCIPAL
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scheduler.config import ServerConfig

EPILOG = """examples:
  scheduler db upgrade --url sqlite:////var/lib/hybrid-kvm/scheduler.db
  scheduler serve --config scheduler/scheduler.example.toml
  HYB_SCHED_DB__URL=postgresql://sched@db/sched scheduler serve --config FILE
"""


def _settings(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from scheduler.config import load_settings
    over = {"db": {"url": args.url}} if getattr(args, "url", None) else {}
    return load_settings(args.config, **over)


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from scheduler.api.app import create_app
    from scheduler.db.engine import Store
    from scheduler.db.migrate import upgrade
    from scheduler.dispatch import HostdClients
    from scheduler.reconcile import start_reconciler

    s = _settings(args)
    logging.basicConfig(level=s.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    tls = _tls(s.server)
    store = Store.from_url(s.db.url, busy_timeout_ms=s.db.busy_timeout_ms, pool_size=s.db.pool_size)
    if s.db.upgrade_on_start:
        upgrade(store.engine)
    hostd = HostdClients(s.dispatch) if s.dispatch.enabled else None
    bg = (lambda app: start_reconciler(app, hostd, s.reconcile)) if hostd and s.reconcile.interval_s > 0 else None
    app = create_app(s, store=store, hostd=hostd, background=bg)
    try:
        uvicorn.run(app, host=args.host or s.server.host, port=args.port or s.server.port,
                    log_level=s.log_level.lower(), access_log=False, http=_http_protocol(),
                    timeout_graceful_shutdown=s.server.shutdown_grace_s, **tls)
    finally:
        if hostd:
            hostd.close()
        store.dispose()
    return 0


def _http_protocol() -> Any:
    """uvicorn's HTTP protocol for a replica: httptools' with heartbeats answered in it
    (``api/beat_protocol.py``), else uvicorn's choice, every beat through ASGI."""
    try:
        from scheduler.api.beat_protocol import BeatProtocol
    except ImportError as e:  # no httptools: uvicorn takes h11
        logging.getLogger(__name__).warning("heartbeats through ASGI (no httptools: %s)", e)
        return "auto"
    return BeatProtocol


def _tls(srv: ServerConfig) -> dict:  # type: ignore[type-arg]
    """uvicorn's TLS arguments from [server]; refuses to serve plain HTTP unless told to."""
    import ssl

    if srv.plaintext:
        logging.getLogger(__name__).warning("REST API over plain HTTP (server.plaintext = true): bearer "
                                            "tokens cross the network in clear; local development only")
        return {}
    if not (srv.tls_cert and srv.tls_key):
        raise SystemExit("scheduler: error [server.tls_cert]: HTTPS needs tls_cert and tls_key "
                         "(or server.plaintext = true for local development)")
    for key in ("tls_cert", "tls_key", "tls_client_ca"):
        path = getattr(srv, key)
        if path is not None and not path.is_file():
            raise SystemExit(f"scheduler: error [server.{key}]: {path} is not a readable file")
    kw = {"ssl_certfile": str(srv.tls_cert), "ssl_keyfile": str(srv.tls_key)}
    if srv.tls_client_ca:
        kw |= {"ssl_ca_certs": str(srv.tls_client_ca), "ssl_cert_reqs": ssl.CERT_REQUIRED}
    return kw


def _db(args: argparse.Namespace) -> int:
    from scheduler.db.engine import make_engine
    from scheduler.db.migrate import current, upgrade
    s = _settings(args)
    engine = make_engine(s.db.url, busy_timeout_ms=s.db.busy_timeout_ms)
    try:
        if args.action == "upgrade":
            upgrade(engine)
        print(current(engine))
    finally:
        engine.dispose()
    return 0


def _openapi(args: argparse.Namespace) -> int:
    from scheduler.api.app import create_app
    from scheduler.config import Settings
    from scheduler.db.engine import Store
    app = create_app(Settings(), store=Store.from_url("sqlite://"))
    print(json.dumps(app.openapi(), indent=2, sort_keys=True))
    return 0


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _ttl(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return float(text[:-1]) * _UNITS[text[-1]] if text[-1] in _UNITS else float(text)
    except ValueError:
        raise SystemExit(f"scheduler: error [--ttl]: {text!r} is not a duration like 3600s, 12h or 90d") from None


def _token(args: argparse.Namespace) -> int:
    """Tokens in the database: effective on every replica within auth.refresh_s."""
    import datetime

    from scheduler.db.engine import Store
    from scheduler.errors import SchedulerError
    from scheduler.service import tokens

    store = Store.from_url(_settings(args).db.url)
    try:
        if args.action == "create":
            new = tokens.create_token(store, name=args.name or "", scopes=args.scope, ttl_s=_ttl(args.ttl),
                                      note=args.note)
            print(f"id {new.id}\ntoken {new.token}\n(shown once: only its sha256 is stored)")
        elif args.action == "revoke":
            ids = tokens.revoke_tokens(store, token_id=args.id, name=args.name)
            print("revoked " + (" ".join(ids) if ids else "nothing (no such active token)"))
            return 0 if ids else 1
        else:
            rows = tokens.list_tokens(store)

            def when(x: float | None) -> str | None:
                return datetime.datetime.fromtimestamp(x, datetime.UTC).isoformat(timespec="seconds") if x else None
            out = [{"id": r.id, "name": r.name, "scopes": r.scopes, "created": when(r.created),
                    "expires": when(r.expires), "revoked": when(r.revoked), "note": r.note} for r in rows]
            if args.json:
                print(json.dumps(out, indent=2))
            for r in [] if args.json else out:
                state = "revoked " + r["revoked"] if r["revoked"] else "expires " + (r["expires"] or "never")
                print(f"{r['id']}  {r['name']:<20} {','.join(r['scopes']):<24} {state}  {r['note']}")
    except SchedulerError as e:
        raise SystemExit(f"scheduler: error [{e.field}]: {e.message}") from None
    finally:
        store.dispose()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scheduler", description="hybrid-kvm placement service",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sv = sub.add_parser("serve", help="run the REST API (uvicorn)")
    sv.add_argument("--config", required=True)
    sv.add_argument("--host")
    sv.add_argument("--port", type=int)
    db = sub.add_parser("db", help="database schema (Alembic)")
    db.add_argument("action", choices=["upgrade", "current"])
    db.add_argument("--config")
    db.add_argument("--url", help="database URL (overrides the config)")
    sub.add_parser("openapi", help="print the OpenAPI schema (api/openapi.json)")
    tk = sub.add_parser("token", help="bearer tokens in the database: create, list, revoke")
    tk.add_argument("action", choices=["create", "list", "revoke"])
    tk.add_argument("id", nargs="?", help="revoke: the token id (from `token list`)")
    tk.add_argument("--config")
    tk.add_argument("--url", help="database URL (overrides the config)")
    tk.add_argument("--name", help="create: the principal; revoke: revoke all of its tokens")
    tk.add_argument("--scope", action="append", default=[],
                    help="create: admin, host, host:<name>, tenant:<name> or prometheus "
                         "(reads GET /v1/prometheus/targets only); repeatable")
    tk.add_argument("--ttl", help="create: lifetime such as 3600s, 12h, 90d (default: never expires)")
    tk.add_argument("--note", default="", help="create: what the token is for")
    tk.add_argument("--json", action="store_true", help="list: JSON")
    ht = sub.add_parser("hash-token", help="sha256 of a bearer token for [[auth.tokens]]")
    ht.add_argument("token")
    args = p.parse_args(argv)
    if args.cmd == "serve":
        return _serve(args)
    if args.cmd == "db":
        return _db(args)
    if args.cmd == "openapi":
        return _openapi(args)
    if args.cmd == "token":
        return _token(args)
    print(hashlib.sha256(args.token.encode()).hexdigest())
    return 0


if __name__ == "__main__":
    sys.exit(main())
