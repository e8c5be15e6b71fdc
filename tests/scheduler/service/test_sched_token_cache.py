"""The token book's memory of tokens by their text (``TokenBook._known``): a token found
is not hashed again, yet a database token revoked stops within ``refresh_s`` as before
(also when the revocation is read between a lookup and its remembering), an expired one
is refused at its expiry, an unknown one is never remembered, and the memory is bounded.
A real SQLite database, tokens made and revoked as ``scheduler token`` makes them."""

from __future__ import annotations

import secrets
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from scheduler.config import TokenConfig
from scheduler.db.engine import Store
from scheduler.db.migrate import upgrade
from scheduler.errors import Unauthenticated
from scheduler.service import tokens as tokens_mod
from scheduler.service.tokens import TokenBook, create_token, digest, revoke_tokens

REFRESH_S = 0.2


class Clock:
    def __init__(self) -> None:
        self.t = float(int(time.time()))  # whole seconds: a datetime keeps microseconds

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store.from_url(f"sqlite:///{tmp_path}/tokens.db")
    upgrade(s.engine)
    yield s
    s.dispose()


@pytest.fixture
def hashes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The tokens the book hashes (``tokens.digest``), in order."""
    seen: list[str] = []
    real = tokens_mod.digest

    def counted(token: str) -> str:
        seen.append(token)
        return real(token)
    monkeypatch.setattr(tokens_mod, "digest", counted)
    return seen


def refused(book: TokenBook, token: str) -> bool:
    try:
        book.lookup(token)
    except Unauthenticated:
        return True
    return False


def test_a_revoked_token_stops_within_refresh_s_through_the_memory(store, hashes) -> None:
    book = TokenBook([], store=store, refresh_s=REFRESH_S)
    old = create_token(store, name="hst", scopes=["host"], ttl_s=None)
    sibling = create_token(store, name="hst", scopes=["host"], ttl_s=None)
    hashes.clear()  # what making them hashed
    for _ in range(5):
        assert book.lookup(old.token).name == "hst" and book.lookup(sibling.token).name == "hst"
    assert hashes == [old.token, sibling.token]  # each hashed once, then found by its text

    revoke_tokens(store, token_id=old.id)
    # the book looks again on the first request past refresh_s since its last look: that
    # request is refused, however long the look takes (a wall-time bound on the look
    # failed a loaded CI run: 0.90 s against 0.7)
    time.sleep(REFRESH_S + 0.05)
    assert refused(book, old.token), "the first lookup past refresh_s still took the revoked token"
    for _ in range(3):  # and stays refused; its sibling works on
        assert refused(book, old.token)
        assert book.lookup(sibling.token).name == "hst"


def test_a_revocation_read_between_lookup_and_memory_is_not_undone(store) -> None:
    """Another thread's refresh reads the revocation after this lookup found the token
    and before it is remembered: the answer in flight may be the old one (as without
    the memory), but the token must not be remembered as valid."""
    book = TokenBook([], store=store, refresh_s=3600)
    tok = create_token(store, name="hst", scopes=["host"], ttl_s=None)
    book._refresh(force=True)
    real = book.lookup_digest

    def then_revoked(d: str):  # type: ignore[no-untyped-def]
        entry = real(d)
        revoke_tokens(store, token_id=tok.id)
        book._refresh(force=True)  # as another request's thread would, under the lock
        return entry
    book.lookup_digest = then_revoked  # type: ignore[method-assign]
    assert book.lookup(tok.token).name == "hst"  # the request in flight
    book.lookup_digest = real  # type: ignore[method-assign]
    assert refused(book, tok.token)


def test_an_expired_token_is_refused_from_the_memory(store, hashes) -> None:
    clock = Clock()
    conf = TokenConfig(name="boot", sha256=digest("boot-token"), scopes=["admin"],
                       expires=datetime.fromtimestamp(clock.t + 60, timezone.utc))
    book = TokenBook([conf], store=store, refresh_s=REFRESH_S, clock=clock)
    tok = create_token(store, name="hst", scopes=["host"], ttl_s=30, now=clock.t)
    hashes.clear()
    for _ in range(3):
        assert book.lookup(tok.token).name == "hst" and book.lookup("boot-token").name == "boot"
    assert len(hashes) == 2
    clock.t += 30
    with pytest.raises(Unauthenticated, match="expired"):
        book.lookup(tok.token)
    assert book.lookup("boot-token").name == "boot"
    clock.t += 30
    with pytest.raises(Unauthenticated, match="expired"):
        book.lookup("boot-token")


def test_unknown_tokens_are_never_remembered_and_the_memory_is_bounded(store) -> None:
    book = TokenBook([TokenConfig(name="boot", sha256=digest("boot-token"), scopes=["admin"])], store=store,
                     refresh_s=REFRESH_S, cache_max=4)
    for _ in range(2000):  # a client guessing
        assert refused(book, secrets.token_urlsafe(16))
    assert len(book._known) == 0
    # a valid token sent with blanks around it still works, and is not a key of its own
    for pad in (" boot-token", "boot-token ", "boot-token\t", "  boot-token  "):
        assert book.lookup(pad).name == "boot"
    assert len(book._known) == 0
    toks = [create_token(store, name=f"h{i}", scopes=["host"], ttl_s=None) for i in range(10)]
    time.sleep(REFRESH_S + 0.05)  # a new token is known within refresh_s
    for _ in range(3):
        for i, t in enumerate(toks):
            assert book.lookup(t.token).name == f"h{i}"
            assert len(book._known) <= 4
