"""Scheduler fixtures: the same tests run on SQLite (a file in tmp_path) and on a real
PostgreSQL 15 server this fixture starts on loopback in a temp dir, as the `postgres`
user (PostgreSQL refuses root), and stops by PID even when tests fail."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

PG_BIN = Path("/usr/lib/postgresql/15/bin")
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """A throwaway PostgreSQL server; yields its base URL (no database name)."""
    if not (PG_BIN / "postgres").exists():
        pytest.skip("PostgreSQL 15 server binaries not installed")
    user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    pw = pwd.getpwnam(user)
    base = Path(tempfile.mkdtemp(prefix="hyb-sched-pg-"))
    os.chown(base, pw.pw_uid, pw.pw_gid)
    data = base / "data"
    as_user = {"user": pw.pw_uid, "group": pw.pw_gid} if os.geteuid() == 0 else {}
    proc = None
    try:
        subprocess.run([str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
                        "-E", "UTF8", "--no-sync"], check=True, capture_output=True, cwd=base, **as_user)
        port = _free_port()
        log = open(base / "pg.log", "wb")
        proc = subprocess.Popen([str(PG_BIN / "postgres"), "-D", str(data), "-p", str(port),
                                 "-h", "127.0.0.1", "-k", str(base), "-c", "fsync=off",
                                 "-c", "max_connections=300", "-c", "synchronous_commit=off"],
                                stdout=log, stderr=subprocess.STDOUT, cwd=base, **as_user)
        import psycopg
        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(f"host=127.0.0.1 port={port} user=postgres dbname=postgres",
                                connect_timeout=2).close()
                break
            except psycopg.OperationalError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("PostgreSQL did not start: " + (base / "pg.log").read_text()[-2000:])
                time.sleep(0.2)
        yield f"postgresql://postgres@127.0.0.1:{port}"
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # fast shutdown
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(base, ignore_errors=True)


def new_pg_database(base_url: str) -> str:
    import psycopg
    name = "t_" + uuid.uuid4().hex[:12]
    port = base_url.rsplit(":", 1)[1]
    with psycopg.connect(f"host=127.0.0.1 port={port} user=postgres dbname=postgres", autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    return f"{base_url}/{name}"


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/sched.db"
    return new_pg_database(request.getfixturevalue("pg_server"))
