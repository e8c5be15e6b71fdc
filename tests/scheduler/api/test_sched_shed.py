"""Load shedding against a real `scheduler serve` (issue 39): the process is stopped
(SIGSTOP) for 1.5 s, as a CPU taken by a hog or stolen by the hypervisor would leave it,
and then: a beat is answered 503 ``hyb.scheduler.overloaded`` with a Retry-After and
still counts (the host's last heartbeat moves), a create and a registration get 503 and
a Retry-After with nothing recorded, ``/readyz`` says it sheds, no host is marked down
meanwhile, and once the loop is on time again everything is served. hostd's heartbeat
client (``Registrar``, over real HTTP) waits the Retry-After and at most half as long
again, and after failures without one backs off with jitter, never longer than its
interval, keeping its registration."""

from __future__ import annotations

import os
import random
import signal
import socket
import time
from pathlib import Path

import httpx
import pytest
from tools.dev.procs import Scheduler, free_port

from api.rest import RestClient
from hostd.rpc.register import Registrar
from sched_helpers import ADM, HOST, TA, host_body, vm_body
from scheduler.liveness_rule import beat_retry_after
from test_sched_tls import config

# xdist: own scheduler process: not the machine group
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("sched-shed")]

TIMEOUT_S, PERIOD_S, FLUSH_S = 6.0, 1.0, 0.2
RETRY_S = beat_retry_after(timeout_s=TIMEOUT_S, period_s=PERIOD_S, flush_s=FLUSH_S, jitter=0.5)  # 2 s


def _config(tmp: Path) -> Path:
    path = config(tmp, None, plaintext=True, shed_loop_lag_s=0.4, shed_hold_s=2.5)
    path.write_text(path.read_text() + f"""
[placement]
heartbeat_timeout_s = {TIMEOUT_S}
heartbeat_period_s = {PERIOD_S}
heartbeat_min_interval_s = 0
[stats]
heartbeat_flush_s = {FLUSH_S}
[liveness]
check_s = 0.5
grace_s = 1
""")
    return path


def _stall(s: Scheduler, seconds: float) -> None:
    """The process gets no CPU for ``seconds`` (its event loop's timers fire late after)."""
    assert s.proc is not None
    s.proc.send_signal(signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        s.proc.send_signal(signal.SIGCONT)
    time.sleep(0.3)  # the loop runs its late timer


def test_an_overloaded_scheduler_sheds_with_retry_after_and_marks_nobody(tmp_path: Path) -> None:
    s = Scheduler(_config(tmp_path), free_port(), dict(os.environ), tmp_path / "s.log").start()
    c = httpx.Client(base_url=s.url, timeout=10)
    try:
        for i in range(3):
            assert c.post("/v1/hosts", json=host_body(f"oss-{i}"), headers=HOST).status_code == 201
        for i in range(3):
            assert c.post(f"/v1/hosts/oss-{i}/heartbeat", headers=HOST).status_code == 200
        assert c.get("/readyz").status_code == 200
        _stall(s, 1.5)
        t0 = time.time()
        r = c.post("/v1/hosts/oss-0/heartbeat", json={"stats": None}, headers=HOST)
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "hyb.scheduler.overloaded"
        assert "beat counted" in r.json()["error"]["message"]
        assert r.headers["retry-after"] == str(RETRY_S)
        shown = c.get("/v1/hosts/oss-0", headers=ADM).json()
        assert shown["last_heartbeat"] >= t0 - 0.01 and shown["state"] == "active"  # the shed beat counted
        r = c.post("/v1/vms", json=vm_body("web-1", vcpus=1, memory_mib=128), headers=TA | {"Idempotency-Key": "k1"})
        assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
        r = c.post("/v1/hosts", json=host_body("oss-9"), headers=HOST)
        assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
        ready = c.get("/readyz")
        assert ready.status_code == 503 and "shed" in ready.json()["error"]["message"], ready.text
        assert "hyb_sched_shed_total" in c.get("/metrics", headers=ADM).text
        # the hosts beat on, at the Retry-After they were given; silent past the timeout
        # only as the replica saw it while it shed: nobody is marked
        deadline = time.monotonic() + 2 * TIMEOUT_S
        served = 0
        while time.monotonic() < deadline:
            for i in range(3):
                got = c.post(f"/v1/hosts/oss-{i}/heartbeat", headers=HOST).status_code
                assert got in (200, 503)
                served += got == 200
            time.sleep(RETRY_S)
        assert served >= 3  # the loop is on time again: served
        assert c.get("/v1/vms", headers=TA).json()["items"] == []  # the shed create recorded nothing
        assert c.get("/v1/hosts/oss-9", headers=ADM).status_code == 404
        r = c.post("/v1/vms", json=vm_body("web-1", vcpus=1, memory_mib=128), headers=TA | {"Idempotency-Key": "k1"})
        assert r.status_code == 202, r.text
        downs = c.get("/v1/audit?action=host.down", headers=ADM).json()["items"]
        assert downs == []
        assert all(c.get(f"/v1/hosts/oss-{i}", headers=ADM).json()["state"] == "active" for i in range(3))
    finally:
        c.close()  # its pooled connection, else a ResourceWarning in whichever test runs GC next
        s.stop()


def test_hostds_heartbeat_client_waits_the_retry_after_with_jitter(tmp_path: Path) -> None:
    """Over real HTTP: beats every second (less up to a tenth); the scheduler stalled,
    the next beat is shed (503, Retry-After 2): the one after comes 2-3 s later, then one
    a second again; the registration is kept (one POST /v1/hosts in all)."""
    s = Scheduler(_config(tmp_path), free_port(), dict(os.environ), tmp_path / "s.log").start()
    sent: list[tuple[float, str, int]] = []
    reg = Registrar(s.url, "hst", host_body("oss-1"), interval_s=1.0, rng=random.Random(7))
    post = reg.client.post

    def traced(url: str, **kw):  # type: ignore[no-untyped-def]
        r = post(url, **kw)
        sent.append((time.monotonic(), url.rsplit("/", 1)[1], r.status_code))
        return r
    reg.client.post = traced  # type: ignore[method-assign]
    try:
        t = reg.start()
        time.sleep(3)
        _stall(s, 1.5)
        time.sleep(6)
        reg.stop()
        t.join(5)
        shed = [i for i, x in enumerate(sent) if x[2] == 503]
        assert shed, sent
        first = shed[0]
        gap = sent[first + 1][0] - sent[first][0]
        assert RETRY_S <= gap <= RETRY_S * 1.5 + 0.3, (gap, sent)
        for a, b in zip(sent[first + 1:], sent[first + 2:]):
            if a[2] == 200:
                assert 0.85 <= b[0] - a[0] <= 1.3, sent
        assert [x[1] for x in sent].count("hosts") == 1, sent  # registered once
        assert sum(x[2] == 200 for x in sent[first + 1:]) >= 2
        with httpx.Client(base_url=s.url, timeout=10) as c:
            assert c.get("/v1/audit?action=host.down", headers=ADM).json()["items"] == []
    finally:
        reg.stop()
        s.stop()


def test_an_unreachable_scheduler_is_retried_with_capped_jittered_backoff() -> None:
    """A port nobody listens on (connections refused): each wait is half to all of
    1, 2, 4 ... s, never over the interval; the registration is not dropped."""
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]  # closed when the block ends: refused from then on
    reg = Registrar(f"http://127.0.0.1:{port}", "hst", host_body("oss-1"), interval_s=5.0, rng=random.Random(3))
    reg.registered = True  # registered before the scheduler went away
    try:
        waits = []
        for _ in range(6):
            reg.attempt()
            waits.append(reg.next_wait())
        assert reg.registered and reg.failures == 6
        for n, w in enumerate(waits):
            cap = min(5.0, 2.0 ** n)
            assert cap / 2 <= w <= cap, (n, waits)
    finally:
        reg.stop()


def test_the_operators_client_sends_a_shed_request_again_after_its_retry_after(tmp_path: Path) -> None:
    """hybctl's and fleet-rollout's REST client (api.rest): a create shed by the stalled
    scheduler (503 overloaded, Retry-After 1, nothing recorded) is sent again after the
    Retry-After and up to half as long again, until it is served; one VM is placed."""
    s = Scheduler(_config(tmp_path), free_port(), dict(os.environ), tmp_path / "s.log").start()
    sent: list[tuple[float, int]] = []
    try:
        with RestClient(s.url, "hst", timeout_s=10) as host:
            host.request("POST", "/v1/hosts", json=host_body("oss-0"))
        with RestClient(s.url, "ta", timeout_s=10) as c:
            send = c.http.request

            def traced(*a, **kw):  # type: ignore[no-untyped-def]
                r = send(*a, **kw)
                sent.append((time.monotonic(), r.status_code))
                return r
            c.http.request = traced  # type: ignore[method-assign]
            _stall(s, 1.5)
            vm = c.request("POST", "/v1/vms", json=vm_body("web-1", vcpus=1, memory_mib=128),
                           headers={"Idempotency-Key": "k-shed"})
            assert vm["name"] == "web-1", vm
            assert [st for _, st in sent][0] == 503 and sent[-1][1] == 202, sent
            assert all(st == 503 for _, st in sent[:-1]), sent
            for (a, _), (b, _) in zip(sent, sent[1:]):
                assert 1.0 <= b - a <= 1.5 + 0.5, sent  # Retry-After 1 s, jitter up to half of it
            assert [v["name"] for v in c.request("GET", "/v1/vms")["items"]] == ["web-1"]
    finally:
        s.stop()
