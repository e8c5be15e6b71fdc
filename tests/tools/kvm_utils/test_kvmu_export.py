"""`kvm-utils export`: its pure parts (what an interval's counts add to the metrics, the
options' checks, closing a gone thread's counters), and live: the exporter counting the
tiny guest's exits while a real Prometheus (Debian's /usr/bin/prometheus) scrapes it,
the counts in Prometheus exact (a guest writing IA32_TSC_DEADLINE 3,000 times shows as
3,000 writes of that MSR, per VM by its name)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
import yaml

from kvmu_helpers import REPO, with_sigint
from tools.dev.procs import free_port
from tools.kvm_utils.bench import helper_argv
from tools.kvm_utils.errors import KvmUtilsError
from tools.kvm_utils.export import Metrics, drop_gone, parse_listen, parse_msrs
from tools.kvm_utils.live import Counters, Spec, Target

PROMETHEUS = Path("/usr/bin/prometheus")


def sample(m: Metrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def test_an_intervals_counts_become_labelled_counters() -> None:
    m = Metrics("perf", None)
    web, db = Target(101, -1, "web", 0, 100), Target(201, -1, "db", 0, 200)
    d = Counter({(web, Spec("exit", "kvm_exit(all)", 1, None)): 7, (web, Spec("user", "ALL", 2, None)): 3,
                 (db, Spec("event", "kvm_msr", 3, None)): 5, (db, Spec("msr", "IA32_TSC_DEADLINE", 3, "x")): 4,
                 (web, Spec("event", "kvm_vcpu_wakeup", 4, None)): 2, (db, Spec("event", "kvm_pio", 5, None)): 0})
    m.add(d)
    m.add(d)
    assert sample(m, "kvmu_exits_total", vm="web", reason="kvm_exit(all)") == 14
    assert sample(m, "kvmu_userspace_exits_total", vm="web", reason="ALL") == 6
    assert sample(m, "kvmu_events_total", vm="db", event="kvm_msr") == 10
    assert sample(m, "kvmu_msr_writes_total", vm="db", msr="IA32_TSC_DEADLINE") == 8
    assert sample(m, "kvmu_halt_wakeups_total", vm="web") == 4
    assert sample(m, "kvmu_events_total", vm="db", event="kvm_pio") is None  # nothing counted, no series
    m.set_threads([web, db, Target(102, -1, "web", 1, 100)])
    assert sample(m, "kvmu_vcpu_threads", vm="web") == 2
    m.set_threads([db])
    assert sample(m, "kvmu_vcpu_threads", vm="web") is None  # the VM went away: its gauge too


def test_bad_options_name_the_option() -> None:
    assert parse_listen("127.0.0.1:9745") == ("127.0.0.1", 9745)
    assert parse_listen("[::1]:9745") == ("::1", 9745)
    for bad in ("9745", "host:port", "h:0", "h:70000"):
        with pytest.raises(KvmUtilsError, match="--listen"):
            parse_listen(bad)
    assert parse_msrs(["0x6e0,0x830", "2096"]) == [0x6E0, 0x830]
    with pytest.raises(KvmUtilsError, match="--msr 'tsc'"):
        parse_msrs(["tsc"])


def test_the_counters_of_an_exited_thread_are_closed(tmp_path: Path) -> None:
    (tmp_path / "11").mkdir()
    live, gone = Target(11, -1, "a", 0, 10), Target(12, -1, "a", 1, 10)
    fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(2)]
    spec = Spec("exit", "x", 1, None)
    c = Counters([spec], fds={(live, spec): fds[0], (gone, spec): fds[1]}, last={(live, spec): 0, (gone, spec): 0},
                 targets=[live, gone])
    assert drop_gone(c, proc=tmp_path) == 1
    assert c.targets == [live] and list(c.fds) == [(live, spec)]
    with pytest.raises(OSError):
        os.fstat(fds[1])  # closed
    os.close(fds[0])


@pytest.mark.root
@pytest.mark.integration
def test_prometheus_scrapes_the_exact_counts(helper, kvm_events, tmp_path: Path) -> None:
    if "kvm_msr" not in kvm_events:
        pytest.skip("kvm_msr tracepoint missing")
    if not PROMETHEUS.exists():
        pytest.fail(f"{PROMETHEUS} is missing: tools/dev/install-deps.sh installs Debian's prometheus package")
    port, web = free_port(), f"127.0.0.1:{free_port()}"
    exporter = subprocess.Popen([*with_sigint(signal.SIG_DFL), sys.executable, "-m", "tools.kvm_utils", "export",
                                 "--listen", f"127.0.0.1:{port}", "-i", "0.3"], cwd=REPO, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(yaml.safe_dump({"global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                                   "scrape_configs": [{"job_name": "kvm-utils",
                                                       "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}]}))
    prom = None
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # serving
            assert exporter.poll() is None, exporter.communicate()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        with open(tmp_path / "prometheus.log", "w") as log:
            prom = subprocess.Popen([str(PROMETHEUS), f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                     f"--web.listen-address={web}"], stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
        # the guest starts after the exporter: its vCPU thread is picked up within an interval
        g = subprocess.run(helper_argv("wrmsr", 3000, name="kvmu-export", delay_ms=1200, linger_ms=1500),
                           capture_output=True, text=True, timeout=60)
        assert g.returncode == 0, g.stderr
        q = 'kvmu_msr_writes_total{vm="kvmu-export",msr="IA32_TSC_DEADLINE"}'
        deadline, got = time.monotonic() + 30, []
        while time.monotonic() < deadline:
            assert prom.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
            try:
                got = httpx.get(f"http://{web}/api/v1/query", params={"query": q}, timeout=2).json()["data"]["result"]
            except (httpx.HTTPError, ValueError, KeyError):
                got = []
            if got and float(got[0]["value"][1]) == 3000:
                break
            time.sleep(0.5)
        assert got and float(got[0]["value"][1]) == 3000, got
        ev = httpx.get(f"http://{web}/api/v1/query", params={"query": 'kvmu_events_total{vm="kvmu-export",'
                                                                      'event="kvm_msr"}'}, timeout=2).json()
        assert float(ev["data"]["result"][0]["value"][1]) == 3000
    finally:
        if prom is not None and prom.poll() is None:
            prom.terminate()
            try:
                prom.wait(15)
            except subprocess.TimeoutExpired:
                prom.kill()
                prom.wait()
        if exporter.poll() is None:
            exporter.send_signal(signal.SIGINT)
            try:
                exporter.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                exporter.kill()
                exporter.communicate()
    assert exporter.returncode == 0  # a stop signal ends it cleanly
