"""The web console's logins (``console_sessions``). Keyword-only, take the session, never
commit. ``key`` is the sha256 of the cookie's value: the value itself is never stored."""

from __future__ import annotations

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from scheduler.db.models import ConsoleSession


def insert_session(*, session: Session, key: str, token_sha256: str, csrf: str, created: float,
                   expires: float) -> None:
    session.add(ConsoleSession(id=key, token_sha256=token_sha256, csrf=csrf, created=created, expires=expires))


def find_session(*, session: Session, key: str) -> tuple[str, str, float] | None:
    """(the token's sha256, the CSRF token, the expiry) of a login, None for none."""
    row = session.execute(select(ConsoleSession.token_sha256, ConsoleSession.csrf, ConsoleSession.expires)
                          .where(ConsoleSession.id == key)).first()
    return None if row is None else (row[0], row[1], row[2])


def delete_session(*, session: Session, key: str) -> None:
    session.execute(delete(ConsoleSession).where(ConsoleSession.id == key))


def delete_expired(*, session: Session, now: float) -> None:
    session.execute(delete(ConsoleSession).where(ConsoleSession.expires <= now))
