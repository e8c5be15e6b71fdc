"""deploy/prometheus/: the shipped Prometheus config passes `promtool check config`, and a
real Prometheus (Debian's /usr/bin/prometheus) run with it finds three real `hostd serve`
processes through the scheduler's http_sd endpoint (HTTPS from the dev CA, a token of
scope ``prometheus``) and scrapes them: every target up, labelled with its host and rack,
and a hostd IO-health metric answered for each host.

The config Prometheus runs is the shipped one with this run's scheduler URL, token and
CA files, 1 s intervals and the rule file's path in the checkout; nothing else changed."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tools.dev.fleetsim import SimFleet, SimHost, dev_certs, sha256, write_scheduler_config
from tools.dev.procs import REPO, Scheduler, free_port

PROMETHEUS, PROMTOOL = Path("/usr/bin/prometheus"), Path("/usr/bin/promtool")
SHIPPED = REPO / "deploy/prometheus/prometheus.yml"
ADMIN, HOST_TOKEN, PROM_TOKEN = "sd-admin-token", "sd-host-token", "sd-prometheus-token"
N = 3


def need(binary: Path) -> None:
    """Fail, not skip: a checkout without Prometheus cannot show that discovery works."""
    if not binary.exists():
        pytest.fail(f"{binary} is missing: tools/dev/install-deps.sh installs Debian's prometheus package")


def test_shipped_config_passes_promtool() -> None:
    need(PROMTOOL)
    r = subprocess.run([str(PROMTOOL), "check", "config", SHIPPED.name], cwd=SHIPPED.parent,
                       capture_output=True, text=True, timeout=60)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "SUCCESS: 1 rule files found" in out and "SUCCESS: 6 rules found" in out, out


class MetricsFleet(SimFleet):
    """A SimFleet whose hostd processes serve /metrics, each on a port of its own."""

    def _write_config(self, h: SimHost) -> None:
        super()._write_config(h)
        text = h.config_path.read_text()
        assert 'metrics_listen = ""\n' in text
        h.config_path.write_text(text.replace('metrics_listen = ""\n', f'metrics_listen = "127.0.0.1:{free_port()}"\n'))


def prometheus_config(path: Path, *, url: str, token: Path, ca: Path) -> Path:
    cfg = yaml.safe_load(SHIPPED.read_text())
    cfg["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
    cfg["rule_files"] = [str((SHIPPED.parent / f).resolve()) for f in cfg["rule_files"]]
    (job,) = cfg["scrape_configs"]
    (sd,) = job["http_sd_configs"]
    sd.update(url=f"{url}/v1/prometheus/targets", refresh_interval="1s")
    sd["authorization"]["credentials_file"] = str(token)
    sd["tls_config"]["ca_file"] = str(ca)
    path.write_text(yaml.safe_dump(cfg))
    return path


def query(api: str, q: str) -> list[dict]:
    r = httpx.get(f"{api}/api/v1/query", params={"query": q}, timeout=5)
    r.raise_for_status()
    return r.json()["data"]["result"]


@pytest.mark.slow
@pytest.mark.xdist_group("prometheus-sd")
def test_prometheus_discovers_and_scrapes_hostd_through_the_scheduler(tmp_path: Path) -> None:
    need(PROMETHEUS)
    certs = dev_certs(tmp_path / "tls")
    port = free_port()
    write_scheduler_config(tmp_path / "scheduler.toml", port=port, certs=certs, db=tmp_path / "scheduler.db",
                           admin_token=ADMIN, host_token=HOST_TOKEN,
                           extra=f'[[auth.tokens]]\nname = "prometheus"\nsha256 = "{sha256(PROM_TOKEN)}"\n'
                                 'scopes = ["prometheus"]\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOSTD_", "HYB_SCHED_"))}
    sched = Scheduler(tmp_path / "scheduler.toml", port, env, tmp_path / "scheduler.log", ca=certs / "ca.crt")
    token = tmp_path / "prometheus.token"
    token.write_text(PROM_TOKEN + "\n")
    cfg = prometheus_config(tmp_path / "prometheus.yml", url=sched.url, token=token, ca=certs / "ca.crt")
    web = f"http://127.0.0.1:{free_port()}"
    prom: subprocess.Popen | None = None
    fleet = MetricsFleet(tmp_path / "fleet", N, N, scheduler_url=sched.url, host_token=HOST_TOKEN, certs=certs,
                         admin_token=ADMIN, heartbeat_s=1.0, probe=False)
    try:
        sched.start()
        fleet.start(timeout_s=60)
        with open(tmp_path / "prometheus.log", "w") as log:  # the child keeps its own descriptor
            prom = subprocess.Popen([str(PROMETHEUS), f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                     f"--web.listen-address={web.removeprefix('http://')}"],
                                    stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
        names = {h.name: h.rack for h in fleet.hosts}
        deadline, targets, series = time.monotonic() + 30, [], []
        while time.monotonic() < deadline:
            assert prom.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
            try:
                targets = httpx.get(f"{web}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
                series = query(web, 'hostd_io_cpu_busy_ratio{job="hostd"}')
            except (httpx.HTTPError, ValueError, KeyError):
                targets, series = [], []
            if (len(targets) == N and all(t["health"] == "up" for t in targets)
                    and len(series) == N and len(query(web, 'up{job="hostd"} == 1')) == N):
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"Prometheus did not scrape {N} hosts in 30 s: targets {targets}, series {series}\n"
                                 + (tmp_path / "prometheus.log").read_text()[-3000:])
        for t in targets:
            labels = t["labels"]
            assert names.get(labels["host"]) == labels["rack"] and labels["instance"] == labels["host"], t
            # not carved: carved_policy "", which Prometheus keeps as no label at all
            assert labels["state"] == "active" and "carved_policy" not in labels and labels["hostd_version"], t
            assert t["scrapeUrl"].startswith("http://127.0.0.1:") and t["scrapeUrl"].endswith("/metrics"), t
        assert {s["metric"]["host"] for s in series} == set(names)
    finally:
        if prom is not None and prom.poll() is None:
            prom.send_signal(signal.SIGTERM)
            try:
                prom.wait(15)
            except subprocess.TimeoutExpired:
                prom.kill()
                prom.wait()
        fleet.stop()
        sched.stop()


def test_a_missing_prometheus_fails_naming_the_installer(tmp_path: Path) -> None:
    with pytest.raises(pytest.fail.Exception, match="tools/dev/install-deps.sh"):
        need(tmp_path / "prometheus")
