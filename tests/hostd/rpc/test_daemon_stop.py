"""A daemon stopping while its domains change state: libvirt's lifecycle events must not
reach the ledger once it is closed ("Cannot operate on a closed database" in a thread).
The daemon stops events (the callback deregistered, the calls in flight finished)
before it closes the ledger. On libvirt's test driver, in-process (treehost.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tools.dev.hostd_inproc import dev_certs
from treehost import UPGRADE, Host, carve, create_vm

ROUNDS = 5


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    return dev_certs(tmp_path_factory.mktemp("ca"))


@pytest.fixture
def thread_errors(monkeypatch) -> Iterator[list[str]]:
    """Every exception a thread dies of during the test."""
    seen: list[str] = []
    monkeypatch.setattr(threading, "excepthook",
                        lambda a: seen.append(f"{a.thread.name if a.thread else '?'}: {a.exc_type.__name__}: "
                                              f"{a.exc_value}"))
    yield seen


def flip(host: Host, vm_ids: list[str], stop: threading.Event) -> None:
    """Stop and start the domains, as fast as the driver goes: a lifecycle event each."""
    assert host.hypervisor is not None
    doms = [host.hypervisor.lookupByUUIDString(v) for v in vm_ids]
    while not stop.is_set():
        for d in doms:
            if d.isActive():
                d.destroy()
            else:
                d.create()


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_stopping_hostd_while_domains_change_state_writes_nothing_after_the_ledger_closed(
        tmp_path: Path, certs: Path, thread_errors: list[str]) -> None:
    host = Host(tmp_path, certs).start()
    try:
        carve(host.stub(), UPGRADE)  # 128 pages: two VMs of 64
        vm_ids = [create_vm(host.stub("scheduler"), f"rc-stop-{i}").vm_id for i in range(2)]
        for _ in range(ROUNDS):
            assert host.d is not None
            ledger = host.d.manager.ledger
            stop = threading.Event()
            flipper = threading.Thread(target=flip, args=(host, vm_ids, stop), name="flipper")
            flipper.start()
            try:
                time.sleep(0.05)  # events are flowing
                host.d.stop(0)  # ... while hostd stops
                host.d = None
                time.sleep(0.2)  # ... and after: nothing may reach the closed ledger
            finally:
                stop.set()
                flipper.join()
            time.sleep(0.1)  # the last event's handler, had one been started
            with pytest.raises(Exception, match="closed database"):
                ledger.list()  # it is closed indeed
            assert thread_errors == []
            host.start()  # the next round: reconcile adopts the states the events left
    finally:
        host.stop()
    assert thread_errors == []
