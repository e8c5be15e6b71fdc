"""The rollout's state on a filesystem that fills up mid-rollout: a real tmpfs mounted
for the test (root), filled by a real file right after the canary's cordon. The run
stops with one line naming the database and the cause, the canary stays held by the
rollout (not lost), and after space is freed the next run resumes from the last
transition that was written and finishes, every host carved once."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakefleet import FakeFleet
from test_engine import NAMES, OPTS, SPEC

from tools.fleet_rollout.cli import main as rollout_cli
from tools.fleet_rollout.engine import Engine
from tools.fleet_rollout.inventory import Host
from tools.fleet_rollout.plan import make_plan
from tools.fleet_rollout.spec import parse_spec
from tools.fleet_rollout.store import Store, StoreError

pytestmark = pytest.mark.root


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "fs"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


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


def test_a_full_disk_stops_the_run_with_one_line_and_the_next_run_resumes(small_fs: Path, capsys) -> None:
    db = small_fs / "rollouts.db"
    fleet = FakeFleet(NAMES)
    store = Store(db)  # the default holder: user@host:pid, as `fleet-rollout run` has
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

    with pytest.raises(StoreError) as e:
        Engine(store, "r1", fleet, fleet, OPTS).run()  # type: ignore[arg-type]
    msg = str(e.value)
    assert msg == f"rollout state {db}: database or disk is full", msg
    assert fleet.admin[canary] == "cordoned"  # held by the rollout, and it knows it (below)
    # the command line says the same in one line, and changes nothing
    assert rollout_cli(["--db", str(db), "pause", "r1"]) == 1
    err = capsys.readouterr().err
    assert err == f"fleet-rollout: rollout state {db}: database or disk is full\n", err

    os.unlink(filler[0])
    store.close()
    again = Store(db)  # the lease could not be released on a full disk: the same holder takes it again
    assert again.host("r1", canary).state == "baselined"  # the last transition written
    assert Engine(again, "r1", fleet, fleet, OPTS).run() == "done"  # type: ignore[arg-type]
    assert {h.state for h in again.hosts("r1")} == {"verified"}
    assert all(h.carves == 1 for h in fleet.hosts.values()) and set(fleet.admin.values()) == {"active"}
    assert again.lease("r1") is None
    again.close()
