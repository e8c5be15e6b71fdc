"""The rollouts' store on a filesystem that fills up mid-rollout: a real `scheduler
serve` whose SQLite database is on a real tmpfs mounted for the test (root), filled by a
real file right after the canary's cordon. The run stops with one line naming the
scheduler and its database's cause, the canary stays held by the rollout (not lost), and
after space is freed `resume` continues from the last transition that was written and
finishes, every host carved once."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakefleet import FakeFleet
from test_engine import NAMES, OPTS, SPEC

from tools.dev.procs import Scheduler as SchedulerProc
from tools.dev.procs import free_port
from tools.dev.smallfs import small_tmpfs
from tools.dev.sched_inproc import token_config
from tools.fleet_rollout.cli import main as rollout_cli
from tools.fleet_rollout.clients import Scheduler
from tools.fleet_rollout.engine import Engine
from tools.fleet_rollout.inventory import Host
from tools.fleet_rollout.plan import make_plan
from tools.fleet_rollout.spec import parse_spec
from tools.fleet_rollout.store import Store, StoreUnavailable

# root (mount), but only its own tmpfs and scheduler: not the machine group
pytestmark = [pytest.mark.root, pytest.mark.xdist_group("rollout-full-disk")]
ADMIN = "full-disk-admin-token"


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path / "fs", "4m") as mnt:
        yield mnt


@pytest.fixture
def scheduler_on(small_fs: Path, tmp_path: Path) -> Iterator[str]:
    t = token_config({ADMIN: ["admin"]})[0]
    cfg = tmp_path / "scheduler.toml"
    cfg.write_text(f'log_level = "WARNING"\n[server]\nplaintext = true\n[db]\nurl = "sqlite:///{small_fs}/s.db"\n'
                   f'[[auth.tokens]]\nname = "ops"\nsha256 = "{t["sha256"]}"\nscopes = ["admin"]\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOSTD_", "HYB_SCHED_"))}
    s = SchedulerProc(cfg, free_port(), env, tmp_path / "scheduler.log")
    try:
        s.start()
        yield s.url
    finally:
        s.stop()


def fill(where: Path) -> Path:
    """Write a file until the filesystem refuses (ENOSPC) even one byte: nothing is left."""
    filler = where / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        size = 1 << 16
        while size:
            try:
                os.write(fd, b"\0" * size)
            except OSError as e:
                assert e.errno == errno.ENOSPC
                size //= 2
    finally:
        os.close(fd)
    return filler


def test_a_full_disk_stops_the_run_with_one_line_and_resume_finishes(small_fs: Path, scheduler_on: str,
                                                                     tmp_path: Path, capsys) -> None:
    api = Scheduler(scheduler_on, ADMIN)
    fleet = FakeFleet(NAMES)
    store = Store(api, retry_s=1.0)  # the default holder: user@host:pid, as `fleet-rollout run` has
    spec = parse_spec(SPEC)
    store.create(spec, make_plan([Host(n, f"{n}:7443", f"r{i % 3}") for i, n in enumerate(NAMES)], spec))
    canary = store.hosts("r1", wave=0)[0].name
    cordon = fleet.set_state
    filler: list[Path] = []

    def cordon_then_fill(name: str, state: str, **kw) -> None:  # type: ignore[no-untyped-def]
        cordon(name, state, **kw)
        if state == "cordoned" and not filler:
            filler.append(fill(small_fs))
    fleet.set_state = cordon_then_fill  # type: ignore[method-assign]

    with pytest.raises(StoreUnavailable) as e:
        Engine(store, "r1", fleet, fleet, OPTS).run()  # type: ignore[arg-type]
    msg = str(e.value)
    assert msg.startswith(f"rollout state at {scheduler_on}: scheduler POST /v1/rollouts/r1/") and "\n" not in msg
    assert msg.endswith("hyb.store.unavailable: the scheduler's database: database or disk is full"), msg
    assert fleet.admin[canary] == "cordoned"  # held by the rollout, and it knows it (below)
    # the command line says the same in one line, exits 3 (stopped short) and changes nothing
    token = tmp_path / "admin.token"
    token.write_text(ADMIN)
    cli = ["--scheduler-url", scheduler_on, "--token-file", str(token), "--plaintext"]
    assert rollout_cli([*cli, "pause", "r1"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "database or disk is full; the rollout stays where it was" in err, err

    os.unlink(filler[0])
    assert store.host("r1", canary).state == "baselined"  # the last transition written
    assert Engine(store, "r1", fleet, fleet, OPTS).run() == "done"  # type: ignore[arg-type]
    assert {h.state for h in store.hosts("r1")} == {"verified"}
    assert all(h.carves == 1 for h in fleet.hosts.values()) and set(fleet.admin.values()) == {"active"}
    assert store.lease("r1") is None
    api.close()
