"""The web console's logins: server-side sessions in the database.

A login with a bearer token (the API's own tokens: config or ``scheduler token
create``) makes a session: a random cookie value whose sha256 is the row's key, the
token's sha256 (so revoking or expiring the token ends the session at the next
request), a CSRF token every state-changing request must carry, and an expiry. Logout
deletes the row, so a cookie replayed afterwards finds nothing. Nothing secret is
stored: the database holds hashes only (the CSRF token is not a credential without the
cookie)."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from scheduler.db.engine import Store
from scheduler.errors import SchedulerError
from scheduler.policies import Principal
from scheduler.repo import sessions as session_repo
from scheduler.service.tokens import TokenBook, digest


def _h(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


@dataclass(frozen=True)
class Session:
    principal: Principal
    csrf: str
    expires: float

    def csrf_ok(self, sent: str | None) -> bool:
        return bool(sent) and hmac.compare_digest(self.csrf, sent or "")


class SessionBook:
    def __init__(self, store: Store, tokens: TokenBook, *, ttl_s: float, clock: Callable[[], float]):
        self.store, self.tokens, self.ttl_s, self.clock = store, tokens, ttl_s, clock

    def open(self, token: str) -> tuple[str, Session]:
        """(the cookie's value, the session) for a valid token; Unauthenticated else."""
        e = self.tokens.lookup(token)
        cookie, csrf, now = secrets.token_urlsafe(32), secrets.token_urlsafe(32), self.clock()
        expires = now + self.ttl_s if e.expires is None else min(now + self.ttl_s, e.expires)
        with self.store.write() as s:
            session_repo.delete_expired(session=s, now=now)  # the expired ones go
            session_repo.insert_session(session=s, key=_h(cookie), token_sha256=digest(token), csrf=csrf,
                                        created=now, expires=expires)
        return cookie, Session(Principal(e.name, e.scopes), csrf, expires)

    def find(self, cookie: str | None) -> Session | None:
        """The live session of a cookie: None for no cookie, an unknown or ended one, an
        expired session, or a token revoked or expired since."""
        if not cookie or len(cookie) > 128:
            return None
        with self.store.read() as s:
            row = session_repo.find_session(session=s, key=_h(cookie))
        if row is None:
            return None
        token_sha, csrf, expires = row
        if expires <= self.clock():
            return None
        try:
            e = self.tokens.lookup_digest(token_sha)
        except SchedulerError:
            return None
        return Session(Principal(e.name, e.scopes), csrf, expires)

    def close(self, cookie: str | None) -> None:
        if cookie:
            with self.store.write() as s:
                session_repo.delete_session(session=s, key=_h(cookie))
