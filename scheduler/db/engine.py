"""Engine and transactions. SQLite: WAL, busy timeout, and ``BEGIN IMMEDIATE`` for
write transactions (the writer lock is taken up front, so a claim never fails late
with SQLITE_BUSY on upgrade from a read lock). PostgreSQL: READ COMMITTED plus the host
generation check (``UPDATE ... WHERE generation = :seen``)."""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker


log = logging.getLogger(__name__)

RAW = "hyb_raw"  # session.info key: the session's driver connection, when it has one for life


def driver(session: Session) -> Any:
    """The DBAPI connection under ``session``'s transaction (sqlite3 or psycopg)."""
    raw = session.info.get(RAW)  # a claim batch's session, bound to one connection (batch_write)
    return raw if raw is not None else session.connection().connection.driver_connection


def make_engine(url: str, *, busy_timeout_ms: int = 10000, pool_size: int = 8) -> Engine:
    """Pools hand out the most recently returned connection (LIFO). With SQLAlchemy's
    default FIFO, a process whose pool has grown (32 concurrent registrations open 18
    connections) cycles every batch through all of them: each PostgreSQL backend, its
    plan and catalog caches and psycopg's prepared statements go cold between uses,
    and each SQLite connection has its own page cache. Measured on the placement bench
    (PostgreSQL, the replicas that registered the fleet then place, two pairs): LIFO
    1,235/1,230 placed/s against FIFO 837/825, database server CPU 0.27 against 0.37 ms
    per request. Idle connections at the bottom of the stack stay idle
    (``pool_pre_ping`` still checks each one handed out)."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[1] if "///" in url else ""
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        pool = {} if path in ("", ":memory:") else {"pool_size": pool_size, "max_overflow": pool_size * 4,
                                                    "pool_use_lifo": True}
        engine = create_engine(url, connect_args={"timeout": busy_timeout_ms / 1000,
                                                  "check_same_thread": False}, **pool)

        @event.listens_for(engine, "connect")
        def _connect(dbapi_conn, _rec):  # type: ignore[no-untyped-def]
            dbapi_conn.isolation_level = None  # we emit BEGIN ourselves (below)
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            if path and path != ":memory:":
                # checkpoints run beside the writers, not inside a commit (Checkpointer);
                # a WAL file a busy spell made large is cut back to 64 MiB when reused
                cur.execute("PRAGMA wal_autocheckpoint=0")
                cur.execute("PRAGMA journal_size_limit=67108864")
            cur.close()

        @event.listens_for(engine, "begin")
        def _begin(conn):  # type: ignore[no-untyped-def]
            mode = "IMMEDIATE" if conn.get_execution_options().get("hyb_write") else "DEFERRED"
            conn.exec_driver_sql(f"BEGIN {mode}")
        return engine
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://"):]
    return create_engine(url, pool_size=pool_size, max_overflow=pool_size * 4, pool_pre_ping=True,
                         pool_use_lifo=True)


class _WriterLock:
    """SQLite allows one writer; when several wait, its busy handler sleeps in growing steps
    (1, 2, 5, 10 ... 100 ms), which under 32 concurrent claims from two processes turned a
    2 ms claim into seconds at p99. Writers queue here instead: a thread lock inside the
    process, then ``flock`` on ``<db>.writer-lock`` across processes; the kernel wakes the
    next waiter the moment the lock is released. The database's own locking still guards
    correctness (a process that does not use this lock is only slower, never unsafe)."""

    def __init__(self, path: Path):
        self._thread = threading.RLock()
        self._path = path
        self._fd: int | None = None
        self._depth = 0

    @contextmanager
    def held(self) -> Iterator[None]:
        with self._thread:
            if self._fd is None:
                self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
            if self._depth == 0:
                fcntl.flock(self._fd, fcntl.LOCK_EX)
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class Checkpointer:
    """SQLite's WAL copied back into the database file beside the writers, never inside
    one. By default SQLite checkpoints from the commit that takes the WAL past 1,000
    pages, in that commit's own call: under the writer lock (``_WriterLock``) every
    replica queues on, and a checkpoint ends with an fsync of the database file. On this
    machine's shared disk that fsync took up to 2.5 s, and for that long no replica
    wrote anything: a claim's p99 went from ~30 ms to 4.2 s in one 5 s window of the
    pulse bench, and both replicas' liveness rows were 2.49 s late. So every connection
    of a file database has ``wal_autocheckpoint`` off, and this thread, one per
    ``Store`` that writes, runs a PASSIVE checkpoint every ``every_s`` on a connection
    of its own: it copies what no reader still needs, waits for no one, and does
    nothing (no fsync) when nothing was written since the last. Writers go on appending
    meanwhile, and once one has finished, the next writer starts the WAL from its
    beginning again. Replicas each run one; SQLite lets one checkpoint run at a time
    and the other's call returns busy."""

    def __init__(self, path: str, *, every_s: float = 1.0):
        self._path, self._every_s = path, every_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start = threading.Lock()
        self.runs = 0  # checkpoints that copied pages
        self.observe: Callable[[float], None] | None = None  # each one's seconds (the replica's metrics)

    def wake(self) -> None:
        """Starts the thread on the first write (a read-only user of the store has none)."""
        if self._thread is None and not self._stop.is_set():
            with self._start:
                if self._thread is None and not self._stop.is_set():
                    self._thread = threading.Thread(target=self._run, name="hyb-checkpoint", daemon=True)
                    self._thread.start()

    def _run(self) -> None:
        import sqlite3  # noqa: PLC0415

        try:
            # mode=rw: a database file that went is not made again, empty
            conn = sqlite3.connect(Path(self._path).resolve().as_uri() + "?mode=rw", uri=True, timeout=0,
                                   isolation_level=None, check_same_thread=False)
        except sqlite3.Error as e:
            log.warning("sqlite checkpoints stopped: %s", e)
            return
        try:
            copied_before = 0
            while not self._stop.wait(self._every_s):
                t = time.monotonic()
                try:
                    _busy, frames, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                except sqlite3.OperationalError as e:
                    if "locked" in str(e) or "busy" in str(e):
                        continue  # another replica's checkpoint is running: it copies
                    log.warning("sqlite checkpoints stopped: %s", e)
                    return
                if copied > 0 and copied != copied_before:
                    if self.observe is not None:
                        self.observe(time.monotonic() - t)
                    self.runs += 1
                copied_before = copied if frames > 0 else 0
        finally:
            conn.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


# What a database says when it cannot store a write: the disk or its quota is full, the
# file system went read-only. SQLite words them so; PostgreSQL's SQLSTATE class 53
# (insufficient resources: disk full, out of memory) and 25006 (read-only transaction).
_CANNOT_WRITE = ("database or disk is full", "disk i/o error", "readonly database", "no space left")
_CANNOT_WRITE_SQLSTATE = ("53", "25006")


def cannot_write(e: BaseException) -> bool:
    """Whether ``e`` says the database cannot store writes (as opposed to a lock not granted
    in time or a lost connection, which the next transaction may not meet)."""
    if not isinstance(e, OperationalError):
        return False
    state = getattr(e.orig, "sqlstate", None) or ""
    return any(state.startswith(c) for c in _CANNOT_WRITE_SQLSTATE) or \
        any(w in str(e.orig).lower() for w in _CANNOT_WRITE)


class WriteHealth:
    """Whether the last write transaction that ended could be stored. ``/readyz`` reads it:
    a replica whose database refuses writes (a full disk) answers reads but fails every
    change, and a load balancer should send its traffic elsewhere. A refusal stands until
    a write commits again (the replica's own liveness flush, or readiness's probe)."""

    def __init__(self) -> None:
        self.refused: tuple[float, str] | None = None  # (when, the database's words)

    def failed(self, e: BaseException, now: float) -> None:
        if cannot_write(e):
            self.refused = (now, str(getattr(e, "orig", e)).splitlines()[0])

    def stored(self) -> None:
        self.refused = None


class Store:
    """The database: ``read()``/``write()`` give one transaction each (commit on success,
    rollback on any exception). Repo functions take the session and never commit."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.sqlite = engine.dialect.name == "sqlite"
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        db = engine.url.database if self.sqlite else None
        self._writer = _WriterLock(Path(f"{db}.writer-lock")) if db and db != ":memory:" else None
        self.checkpointer = Checkpointer(db) if self._writer is not None else None
        self._kept = threading.local()  # the connection a claim thread keeps (batch_write)
        self._kept_all: list[Connection] = []
        self._kept_lock = threading.Lock()
        self.health = WriteHealth()

    @classmethod
    def from_url(cls, url: str, **kw) -> "Store":  # type: ignore[no-untyped-def]
        return cls(make_engine(url, **kw))

    @contextmanager
    def write(self) -> Iterator[Session]:
        with self._watched():
            if self._writer is None:
                with self._write() as s:
                    yield s
                return
            self.checkpointer.wake()  # type: ignore[union-attr]
            with self._writer.held(), self._write() as s:
                yield s

    @contextmanager
    def _watched(self) -> Iterator[None]:
        """Records in ``health`` whether the write transaction inside could be stored."""
        try:
            yield
        except BaseException as e:
            self.health.failed(e, time.time())
            raise
        self.health.stored()

    def probe_write(self) -> None:
        """A write transaction that stores one page (the schema version, rewritten as it
        is): raises what the database says when it cannot store writes."""
        with self.write() as s:
            s.execute(text("UPDATE alembic_version SET version_num = version_num"))

    @contextmanager
    def batch_write(self) -> Iterator[Session]:
        """``write()`` for the claim thread's batches: on a connection the calling thread
        keeps between batches, with a session bound to it for the batch (SQLite: under
        the writer lock). The session-per-transaction of ``write()`` (a session, a pool
        checkout, the begin and commit through the session's transaction) cost 135 us
        per batch on SQLite against 30 us this way, measured in process, spent holding
        the writer lock the other replicas queue on; on PostgreSQL each checkout also
        pings the server (``pool_pre_ping``). At 1,000 requests/s a batch holds one or
        two VMs. The driver connection is in ``session.info`` (``driver``). A kept
        connection is not pinged: one that died (a restarted server) fails its batch,
        which is then redone one request at a time on pooled connections, and is
        dropped."""
        conn = getattr(self._kept, "conn", None)
        if conn is None:
            conn = self.engine.connect().execution_options(hyb_write=True)
            self._kept.conn = conn
            with self._kept_lock:
                self._kept_all.append(conn)
        if self.checkpointer is not None:
            self.checkpointer.wake()
        try:
            with self._watched(), self._writer.held() if self._writer is not None else nullcontext(), conn.begin():
                s = Session(bind=conn, join_transaction_mode="rollback_only", expire_on_commit=False,
                            info={RAW: conn.connection.driver_connection})
                try:
                    yield s
                finally:
                    s.close()
        except BaseException:
            # a connection that failed mid-batch is not kept, nor pooled (it may be broken)
            self._kept.conn = None
            with self._kept_lock:
                self._kept_all.remove(conn)
            conn.invalidate()
            conn.close()
            raise

    @contextmanager
    def _write(self) -> Iterator[Session]:
        with self._sessions() as s:
            s.connection(execution_options={"hyb_write": True})
            with _tx(s):
                yield s

    @contextmanager
    def snapshot(self) -> Iterator[Session]:
        """A read transaction whose statements all see one snapshot (SQLite's read
        transactions already do; PostgreSQL needs REPEATABLE READ)."""
        with self._sessions() as s:
            if not self.sqlite:
                s.connection(execution_options={"isolation_level": "REPEATABLE READ"})
            with _tx(s):
                yield s

    @contextmanager
    def feed_read(self) -> Iterator[Session]:
        """The placement index's change-feed read: SQLite, a read transaction (a snapshot);
        PostgreSQL, autocommit (the feed is one statement, and one statement sees one
        snapshot: no BEGIN, COMMIT or REPEATABLE READ round trips)."""
        if self.sqlite:
            with self.snapshot() as s:
                yield s
            return
        with self._sessions() as s:
            s.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
            yield s

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self._sessions() as s, _tx(s):
            yield s

    def dispose(self) -> None:
        with self._kept_lock:
            kept, self._kept_all = self._kept_all, []
        for c in kept:
            c.close()
        if self.checkpointer is not None:
            self.checkpointer.close()
        self.engine.dispose()
        if self._writer is not None:
            self._writer.close()


@contextmanager
def _tx(s: Session) -> Iterator[None]:
    try:
        yield
        s.commit()
    except BaseException:
        s.rollback()
        raise
