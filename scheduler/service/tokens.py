"""Bearer tokens: the config's (``[[auth.tokens]]``, for bootstrap) and the database's
(``scheduler token create``), looked up by sha256.

Each replica keeps the database tokens in memory and reads the rows changed since its
last look (created or revoked) at most every ``refresh_s`` seconds, on the request that
finds the book stale: a revocation on one replica stops the token on every replica
within that time, and a lookup never waits on the database otherwise. A row's
``changed`` stamp comes from the writer's clock, so each look goes back ``SKEW_S``
further than the newest stamp it has seen.

A token presented and found is remembered by its text (``_known``), so the next request
with it skips the sha256 (a tenth of a heartbeat's CPU in process): only tokens found
valid go in (an unknown one never does, so no client without a token can grow it),
only as sent without surrounding blanks (one key a token), and at most
``cache_max`` (then it starts over). What a hit returns is checked as a miss's is: the
database's tokens are still refreshed on the same ``refresh_s``, the expiry is still
compared with the clock, and a refresh that drops or changes a token empties the cache
before the book answers again, so a revocation takes effect within ``refresh_s`` as
without it.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

from sqlalchemy import select, update

from scheduler.config import TokenConfig
from scheduler.db.engine import Store
from scheduler.db.models import ApiToken
from scheduler.errors import InvalidRequest, Unauthenticated
from scheduler.policies import Principal

log = logging.getLogger(__name__)

SKEW_S = 5.0
CACHE_MAX = 1 << 17  # tokens remembered by their text: a 100,000-host fleet with a token a host
PREFIX = "hyb_"  # every generated token starts so: secret scanners can find leaked ones


def digest(token: str) -> str:
    return hashlib.sha256(token.strip().encode()).hexdigest()


@dataclass(frozen=True)
class Entry:
    name: str
    scopes: frozenset[str]
    expires: float | None  # unix time; None: never

    @cached_property
    def principal(self) -> Principal:
        """The caller this token is, made once per token (``api/deps.principal_for``): its
        derived properties are then computed once, not on every request."""
        return Principal(self.name, self.scopes)


class TokenBook:
    def __init__(self, config_tokens: Sequence[TokenConfig], *, store: Store | None = None,
                 refresh_s: float = 2.0, clock: Callable[[], float] = time.time,
                 cache_max: int = CACHE_MAX):
        self._config = [(t.sha256.lower(), Entry(t.name, frozenset(t.scopes),
                                                 t.expires.timestamp() if t.expires else None))
                        for t in config_tokens]
        # by digest, the first of a repeated one (as the list was read): one dict lookup
        # per request, as the database's tokens (a digest's timing tells nothing of the token)
        self._config_by_sha: dict[str, Entry] = {}
        for sha, e in self._config:
            self._config_by_sha.setdefault(sha, e)
        self.store = store
        self.refresh_s = refresh_s
        self.clock = clock
        self._db: dict[str, Entry] = {}
        self._seen = 0.0  # newest ``changed`` read
        self._looked = float("-inf")  # monotonic time of the last read
        self._lock = threading.Lock()
        # token text -> (its entry, from the database?): tokens found valid, as sent; emptied
        # (under ``_lock``, with ``_epoch`` moved) when a refresh drops or changes a token
        self._known: dict[str, tuple[Entry, bool]] = {}
        self._epoch = 0
        self.cache_max = cache_max

    def lookup(self, token: str) -> Entry:
        """The entry of a bearer token, or Unauthenticated (unknown, expired)."""
        got = self._known.get(token)
        if got is None:
            return self._lookup_new(token)
        entry, from_db = got
        if from_db:
            self._refresh()  # a revocation seen here empties ``_known``: ask again
            if self._known.get(token) is not got:
                return self._lookup_new(token)
        return self._unexpired(entry)

    def _lookup_new(self, token: str) -> Entry:
        """``lookup`` by the token's sha256; a token found is remembered (``_known``)
        unless the book changed meanwhile (a revocation read between the lookup and the
        remembering must not be undone by it)."""
        epoch = self._epoch
        d = digest(token)
        entry = self.lookup_digest(d)
        if token and token == token.strip() and self.cache_max > 0:
            from_db = self._config_by_sha.get(d) is None
            with self._lock:
                if self._epoch == epoch and (not from_db or self._db.get(d) is entry):
                    if len(self._known) >= self.cache_max:
                        self._known.clear()
                    self._known[token] = (entry, from_db)
        return entry

    def lookup_digest(self, d: str) -> Entry:
        """The entry of a token's sha256 (what a console session keeps of it)."""
        entry = self._config_by_sha.get(d)
        if entry is None and self.store is not None:
            self._refresh()
            entry = self._db.get(d)
        if entry is None:
            raise Unauthenticated("unknown or revoked token", field="Authorization")
        return self._unexpired(entry)

    def _unexpired(self, entry: Entry) -> Entry:
        if entry.expires is not None and entry.expires <= self.clock():
            raise Unauthenticated(f"the token of {entry.name} expired", field="Authorization")
        return entry

    def _refresh(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._looked < self.refresh_s:
            return
        with self._lock:
            if not force and now - self._looked < self.refresh_s:
                return
            assert self.store is not None
            try:
                with self.store.read() as s:
                    rows = s.scalars(select(ApiToken).where(ApiToken.changed >= self._seen - SKEW_S)).all()
            except Exception:  # noqa: BLE001 - keep serving the tokens known; a request is not the place to fail
                log.exception("cannot read api_tokens; keeping the %d known", len(self._db))
                return
            dropped = False
            for r in rows:
                old = self._db.get(r.sha256)
                if r.revoked is None:
                    new = Entry(r.name, frozenset(r.scopes), r.expires)
                    if old is None or old != new:
                        self._db[r.sha256] = new
                        dropped = dropped or old is not None
                elif old is not None:
                    del self._db[r.sha256]
                    dropped = True
                self._seen = max(self._seen, r.changed)
            if dropped:  # before any lookup can see the refresh as done
                self._known = {}
                self._epoch += 1
            self._looked = now


@dataclass(frozen=True)
class NewToken:
    id: str
    token: str  # shown once, never stored


def create_token(store: Store, *, name: str, scopes: Sequence[str], ttl_s: float | None, note: str = "",
                 now: float | None = None) -> NewToken:
    if not name or len(name) > 64:
        raise InvalidRequest("1-64 characters", field="name")
    bad = [s for s in scopes if not _scope_ok(s)]
    if not scopes or bad:
        raise InvalidRequest(f"give scopes admin, host, host:<name>, tenant:<name> or prometheus (not {bad or 'none'})",
                             field="scope")
    if ttl_s is not None and ttl_s <= 0:
        raise InvalidRequest("must be positive", field="ttl")
    now = time.time() if now is None else now
    token = PREFIX + secrets.token_urlsafe(32)
    tid = secrets.token_hex(6)
    with store.write() as s:
        s.add(ApiToken(id=tid, name=name, sha256=digest(token), scopes=sorted(set(scopes)), created=now,
                       expires=now + ttl_s if ttl_s else None, revoked=None, changed=now, note=note[:200]))
    return NewToken(tid, token)


def revoke_tokens(store: Store, *, token_id: str | None = None, name: str | None = None,
                  now: float | None = None) -> list[str]:
    """Revoke one token by id, or every active token of a principal; the ids revoked."""
    if not token_id and not name:
        raise InvalidRequest("give a token id or --name", field="id")
    now = time.time() if now is None else now
    with store.write() as s:
        q = select(ApiToken.id).where(ApiToken.revoked.is_(None))
        q = q.where(ApiToken.id == token_id) if token_id else q.where(ApiToken.name == name)
        ids = list(s.scalars(q).all())
        if ids:
            s.execute(update(ApiToken).where(ApiToken.id.in_(ids)).values(revoked=now, changed=now))
    return ids


def list_tokens(store: Store) -> list[ApiToken]:
    with store.read() as s:
        return list(s.scalars(select(ApiToken).order_by(ApiToken.name, ApiToken.created)).all())


def _scope_ok(s: str) -> bool:
    kind, _, arg = s.partition(":")
    return (s in ("admin", "host", "prometheus")) or (kind in ("host", "tenant") and 0 < len(arg) <= 64)
