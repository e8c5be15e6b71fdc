"""Tokens in the database, through `scheduler token` and two real `scheduler serve`
replicas on one SQLite file: a token works on both, expires, two tokens of one principal
work side by side (rotation), and a revocation made with the CLI stops the token on the
other replica within auth.refresh_s (1 s here) while its sibling keeps working."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from tools.dev.procs import REPO, Scheduler, free_port

from sched_helpers import token_config

# xdist: own scheduler process: not the machine group
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("sched-tokens")]
REFRESH_S = 1.0


def cli(cfg: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scheduler.cli", "token", *args, "--config", str(cfg)],
                          capture_output=True, text=True, cwd=REPO, timeout=60)


def create(cfg: Path, *args: str) -> tuple[str, str]:
    r = cli(cfg, "create", *args)
    assert r.returncode == 0, r.stderr
    out = dict(line.split(" ", 1) for line in r.stdout.splitlines()[:2])
    return out["id"], out["token"]


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """The replicas' config, its database at the schema's head (what `serve` does first)."""
    toks = "".join(f'[[auth.tokens]]\nname = "{t["name"]}"\nsha256 = "{t["sha256"]}"\n'
                   f'scopes = ["{t["scopes"][0]}"]\n' for t in token_config())
    cfg = tmp_path / "scheduler.toml"
    cfg.write_text(f'log_level = "WARNING"\n[server]\nplaintext = true\n[db]\nurl = "sqlite:///{tmp_path}/s.db"\n'
                   f'[dispatch]\nenabled = false\n[reconcile]\ninterval_s = 0\n'
                   f'[auth]\nrefresh_s = {REFRESH_S}\n{toks}')
    r = subprocess.run([sys.executable, "-m", "scheduler.cli", "db", "upgrade", "--config", str(cfg)],
                       capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 0, r.stderr
    return cfg


@pytest.fixture
def replicas(config: Path, tmp_path: Path):
    cfg = config
    servers = [Scheduler(cfg, free_port(), dict(os.environ), tmp_path / f"s{i}.log") for i in range(2)]
    try:
        for s in servers:
            s.start()
        yield cfg, servers
    finally:
        for s in servers:
            s.stop()


def status(s: Scheduler, token: str) -> int:
    return httpx.get(f"{s.url}/v1/vms", headers={"Authorization": f"Bearer {token}"}, timeout=10).status_code


def test_create_rotate_revoke_expire(replicas) -> None:
    cfg, (a, b) = replicas
    old_id, old = create(cfg, "--name", "ops", "--scope", "admin", "--note", "rotation test")
    new_id, new = create(cfg, "--name", "ops", "--scope", "admin")
    assert old.startswith("hyb_") and old != new
    assert [status(s, t) for s in (a, b) for t in (old, new)] == [200] * 4
    listed = cli(cfg, "list").stdout
    assert old_id in listed and new_id in listed and "expires never" in listed and old not in listed

    r = cli(cfg, "revoke", old_id)
    assert r.returncode == 0 and r.stdout.strip() == f"revoked {old_id}"
    # b looks at the book again on its first request past refresh_s: that request is
    # refused, however long the machine's other work makes it (a loop bounded by the wall
    # clock counted that work too)
    time.sleep(REFRESH_S)
    assert status(b, old) == 401, "the revocation did not reach the other replica"
    assert status(a, old) == 401 and status(b, new) == 200 and status(a, new) == 200
    assert f"{old_id}  ops" in cli(cfg, "list").stdout and "revoked" in cli(cfg, "list").stdout

    _, short = create(cfg, "--name", "ci", "--scope", "tenant:a", "--ttl", "2s")
    assert status(a, short) == 200
    time.sleep(2.1)
    r = httpx.get(f"{a.url}/v1/vms", headers={"Authorization": f"Bearer {short}"}, timeout=10)
    assert r.status_code == 401 and "expired" in r.json()["error"]["message"]


@pytest.mark.parametrize("args, field", [(["--name", "x", "--scope", "root"], "scope"),
                                         (["--name", "x"], "scope"),
                                         (["--scope", "admin"], "name"),
                                         (["--name", "x", "--scope", "admin", "--ttl", "soon"], "--ttl")])
def test_bad_token_requests_name_the_field_and_create_nothing(config, args, field) -> None:
    """The CLI against the store alone: no replica needs to run for it."""
    cfg = config
    r = cli(cfg, "create", *args)
    assert r.returncode != 0 and f"[{field}]" in r.stderr, r.stderr
    assert cli(cfg, "list").stdout.strip() == ""
    r = cli(cfg, "revoke", "nosuchid")
    assert r.returncode == 1 and "nothing" in r.stdout
