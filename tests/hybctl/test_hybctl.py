"""hybctl against a real scheduler (`scheduler serve`, SQLite, HTTPS from a dev CA) with a
simulated fleet of two real hostd processes (libvirt's test driver) and history whose
numbers are known: each command's output is checked against the REST API's own answer.
Most calls run hybctl's ``main`` in this process; the exit codes, the missing traceback
of a server that is down, --watch and shell completion run the installed command."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml
from tools.dev.fleetsim import SimFleet, dev_certs, fleet_scheduler
from tools.dev.procs import REPO, free_port

from tools.hybctl.cli import main

pytestmark = pytest.mark.slow
ADMIN, HOST, WEB, DB = "hyb-admin-token", "hyb-host-token", "hyb-web-token", "hyb-db-token"
BIN = str(REPO / ".venv/bin/hybctl")
TODAY = dt.date.today()
DAY, BEFORE = (TODAY - dt.timedelta(days=5)).isoformat(), (TODAY - dt.timedelta(days=40)).isoformat()
# peak CPUs in use (io, vms, other) of each host's CPUs, on DAY; BEFORE: half the VMs
PEAK = {"hyb-0000": (1.0, 2.0, 0.5), "hyb-0001": (0.5, 0.25, 0.0)}


def day_body(day: str, cpus: int, io: float, vms: float, other: float) -> dict:
    return {"day": day, "utc_offset_min": 0, "cpus": cpus, "samples": 86400,
            "peak": {"start": "21:00", "end": "22:00", "samples": 3600, "io": io, "vms": vms, "other": other},
            "hours": [20] * 24, "hist": [0] * 4 + [86400] + [0] * 15}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    w = tmp_path_factory.mktemp("hybctl")
    with fleet_scheduler(w, admin_token=ADMIN, host_token=HOST, tenants={WEB: "web", DB: "db"}) as s:
        f = SimFleet(w / "sim", 2, 2, scheduler_url=s["sched"].url, host_token=HOST, admin_token=ADMIN,
                     certs=s["certs"], prefix="hyb")
        try:
            f.start(timeout_s=180)
            tokens = {}
            for name, tok in (("admin", ADMIN), ("web", WEB), ("db", DB), ("host", HOST)):
                tokens[name] = w / f"{name}.token"
                tokens[name].write_text(tok + "\n")
            api = httpx.Client(base_url=s["sched"].url, verify=s["sched"].verify, timeout=30,
                               headers={"Authorization": f"Bearer {ADMIN}"})
            cpus = {}
            for name, (io, vms, other) in PEAK.items():
                h = api.get(f"/v1/hosts/{name}").json()
                cpus[name] = 4
                days = [day_body(DAY, 4, io, vms, other), day_body(BEFORE, 4, io, vms / 2, other)]
                r = api.post(f"/v1/hosts/{name}/days", json={"days": days},
                             headers={"Authorization": f"Bearer {HOST}"})
                assert r.status_code == 202, r.text
                assert h["name"] == name
            deadline = time.monotonic() + 30  # the scheduler writes days with its next flush (1 s)
            while api.get("/v1/fleet/utilization", params={"day": DAY, "compare": BEFORE}).json()["compare"][
                    "hosts_included"] < len(PEAK):
                assert time.monotonic() < deadline, "the days sent were not written within 30 s"
                time.sleep(0.2)
            yield {"url": s["sched"].url, "ca": s["certs"] / "ca.crt", "tokens": tokens, "api": api, "dir": w,
                   "fleet": f, "certs": s["certs"]}
            api.close()
        finally:
            f.stop()


def run(env: dict, *argv: str, who: str = "admin", capsys=None) -> tuple[int, str, str]:  # type: ignore[no-untyped-def]
    """hybctl ARGV in this process, as ``who``; (exit code, stdout, stderr)."""
    base = ["--server", env["url"], "--ca", str(env["ca"]), "--token-file", str(env["tokens"][who])]
    capsys.readouterr()
    code = main([*base, *argv])
    got = capsys.readouterr()
    return code, got.out, got.err


def cli(env: dict, *argv: str, who: str = "admin", extra_env: dict | None = None, **kw):  # type: ignore[no-untyped-def]
    """The installed hybctl, with its settings in HYBCTL_* variables."""
    e = {**os.environ, "HYBCTL_SERVER": env["url"], "HYBCTL_CA": str(env["ca"]),
         "HYBCTL_TOKEN_FILE": str(env["tokens"][who]), "HYBCTL_CONFIG": str(env["dir"] / "none.yaml"),
         "COLUMNS": "200", **(extra_env or {})}
    return subprocess.run([BIN, *argv], env=e, text=True, capture_output=True, timeout=60, **kw)


def web_vm(env: dict, name: str = "web-1", **over) -> dict:  # type: ignore[no-untyped-def]
    path = env["dir"] / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "vcpus": 1, "memory_mib": 128, "image": "smoke", **over}))
    return {"path": path}


@pytest.fixture(scope="module")
def vms(env: dict) -> dict[str, dict]:
    """web-1 (tenant web) and db-1 (tenant db), created through hybctl and waited for."""
    got = {}
    e = {**os.environ, "HYBCTL_SERVER": env["url"], "HYBCTL_CA": str(env["ca"]),
         "HYBCTL_CONFIG": str(env["dir"] / "none.yaml")}
    procs = {name: subprocess.Popen([BIN, "vm", "create", "-f", str(web_vm(env, name)["path"]), "--wait", "-o", "json"],
                                    env={**e, "HYBCTL_TOKEN_FILE": str(env["tokens"][who])}, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for name, who in (("web-1", "web"), ("db-1", "db"))}  # both at once: each waits until it runs
    for name, p in procs.items():
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        got[name] = json.loads(out)
        assert got[name]["status"] == "running", got[name]
    return got


def test_contexts_are_kept_in_the_users_config_dir(env, tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    for k in ("HYBCTL_CONFIG", "HYBCTL_SERVER", "HYBCTL_TOKEN_FILE", "HYBCTL_TOKEN", "HYBCTL_CA", "HYBCTL_CONTEXT"):
        monkeypatch.delenv(k, raising=False)
    assert main(["config", "set-context", "lab", "--server", env["url"], "--token-file",
                 str(env["tokens"]["admin"]), "--ca", str(env["ca"])]) == 0
    assert main(["config", "set-context", "tenant", "--server", env["url"], "--token-file",
                 str(env["tokens"]["web"]), "--ca", str(env["ca"])]) == 0
    conf = yaml.safe_load((tmp_path / "xdg/hybctl/config.yaml").read_text())
    assert conf["current-context"] == "lab" and set(conf["contexts"]) == {"lab", "tenant"}
    assert (tmp_path / "xdg/hybctl/config.yaml").stat().st_mode & 0o077 == 0
    capsys.readouterr()
    assert main(["host", "list", "-o", "json"]) == 0  # the current context: admin
    assert {h["name"] for h in json.loads(capsys.readouterr().out)["items"]} == set(PEAK)
    assert main(["config", "use-context", "tenant"]) == 0
    capsys.readouterr()
    assert main(["host", "list"]) == 1  # a tenant may not list hosts
    assert "hyb.auth.forbidden" in capsys.readouterr().err
    monkeypatch.setenv("HYBCTL_TOKEN_FILE", str(env["tokens"]["admin"]))  # a variable over the context
    assert main(["host", "list", "-o", "json"]) == 0
    capsys.readouterr()
    assert main(["--context", "nope", "vm", "list"]) == 1
    assert "context 'nope': not in" in capsys.readouterr().err


def test_vm_list_and_show_say_what_the_api_says(env, vms, capsys) -> None:  # type: ignore[no-untyped-def]
    api = env["api"]
    code, out, _ = run(env, "vm", "list", "-o", "json", capsys=capsys)
    assert code == 0 and json.loads(out)["items"] == api.get("/v1/vms").json()["items"]
    code, out, _ = run(env, "vm", "list", capsys=capsys)
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "NAME", "TENANT", "STATUS", "HOST", "AGE"]
    for v in vms.values():
        row = next(ln for ln in lines if ln.startswith(v["id"])).split()
        assert row[1:5] == [v["name"], v["tenant"], "running", v["host"]]
    code, out, _ = run(env, "vm", "list", "-o", "wide", capsys=capsys)
    assert "VCPUS" in out.splitlines()[0] and "128 MiB" in out
    # a tenant sees its own only, whatever it asks for
    code, out, _ = run(env, "vm", "list", "-o", "json", who="web", capsys=capsys)
    assert code == 0 and [v["name"] for v in json.loads(out)["items"]] == ["web-1"]
    code, out, _ = run(env, "vm", "list", "-o", "json", "--tenant", "db", who="web", capsys=capsys)
    assert code == 0 and [v["name"] for v in json.loads(out)["items"]] == ["web-1"]  # its own, whatever it asks
    vid = vms["db-1"]["id"]
    code, out, _ = run(env, "vm", "show", vid, "-o", "yaml", capsys=capsys)
    assert code == 0 and yaml.safe_load(out) == api.get(f"/v1/vms/{vid}").json()
    code, out, _ = run(env, "vm", "show", vid, capsys=capsys)
    row = next(ln for ln in out.splitlines() if ln.startswith("placement cpus"))
    assert row.split()[2] == ",".join(map(str, vms["db-1"]["placement"]["cpus"]))
    pages = vms["db-1"]["placement"]["hugepages"]  # 128 MiB: 64 pages of 2 MiB
    row = next(ln for ln in out.splitlines() if ln.startswith("hugepages"))
    assert row.split(None, 1)[1].strip() == ", ".join(f"{h['count']}x{h['size_kb']}K@{h['node']}" for h in pages)
    assert "{" not in out and "'" not in out  # no Python repr of the API's objects
    code, _, err = run(env, "vm", "show", vid, who="web", capsys=capsys)  # another tenant's: not found
    assert code == 1 and "hyb.vm.not_found" in err
    code, _, err = run(env, "vm", "show", "no-such-vm", capsys=capsys)
    assert code == 1 and err.startswith("error: scheduler GET /v1/vms/no-such-vm: hyb.") and "\n" == err[-1]


def test_why_shows_the_dry_runs_counts_and_creates_nothing(env, vms, capsys) -> None:  # type: ignore[no-untyped-def]
    api = env["api"]
    body = env["dir"] / "huge.json"
    body.write_text(json.dumps({"name": "huge", "vcpus": 64, "memory_mib": 128, "image": "smoke"}))
    before = api.get("/v1/vms").json()["items"]
    code, out, _ = run(env, "why", "-f", str(body), "-o", "json", capsys=capsys)
    got = json.loads(out)
    direct = api.post("/v1/vms", params={"dry_run": "true"}, headers={"Idempotency-Key": "direct"},
                      json=json.loads(body.read_text())).json()
    assert code == 0 and got["fits"] is False and got["rejections"] == direct["rejections"]
    assert sum(direct["rejections"].values()) == len(PEAK)
    code, out, _ = run(env, "why", "-f", str(body), capsys=capsys)
    assert "fits nowhere: 2 hosts examined" in out
    for res, n in direct["rejections"].items():
        assert any(ln.split() == [res, str(n)] for ln in out.splitlines()), out
    small = web_vm(env, "small")["path"]
    code, out, _ = run(env, "vm", "create", "-f", str(small), "--dry-run", capsys=capsys)
    assert code == 0 and "fits: hyb-" in out and "best hosts" in out
    assert api.get("/v1/vms").json()["items"] == before


def test_the_fleet_histogram_is_the_apis(env, capsys) -> None:  # type: ignore[no-untyped-def]
    api = env["api"]
    code, out, _ = run(env, "fleet", "--day", DAY, "--compare", BEFORE, "-o", "json", capsys=capsys)
    want = api.get("/v1/fleet/utilization", params={"day": DAY, "compare": BEFORE}).json()
    assert code == 0 and json.loads(out) == want
    # vms: 2/4 = 50 % and 0.25/4 = 6.25 %; io: 25 % and 12.5 %; other 12.5 % and 0
    counts = {g: [b["counts"].get(g, 0) for b in want["day"]["bins"]] for g in ("io", "vms", "other")}
    assert counts["vms"][10] == 1 and counts["vms"][1] == 1 and counts["io"][5] == 1 and counts["io"][2] == 1
    code, out, _ = run(env, "fleet", "--day", DAY, capsys=capsys)
    assert f"{DAY}: 2 hosts included, 0 missing" in out
    rows = {ln.split()[0]: ln for ln in out.splitlines() if ln.strip() and ln.split()[0][:1].isdigit()
            and ln.split()[1:2] == ["%"]}
    assert "1" in rows.get("50-55", "").split() and "1" in rows.get("5-10", "").split(), out
    code, out, _ = run(env, "fleet", "--day", DAY, "--by", "rack", "-o", "json", capsys=capsys)
    assert set(json.loads(out)["day"]["groups"]) == {"r00", "r01"}
    code, out, _ = run(env, "fleet", "--day", DAY, "--window", "0-24", "--by", "state", capsys=capsys)
    assert "active" in out and "20.0 %" in out  # every hour 20 %
    code, _, err = run(env, "fleet", "--day", DAY, "--bins", "10000", capsys=capsys)
    assert code == 1 and "[bins]" in err


def test_cordon_drain_and_the_audit(env, capsys) -> None:  # type: ignore[no-untyped-def]
    api = env["api"]
    code, out, _ = run(env, "host", "cordon", "hyb-0001", "--reason", "disk swap", capsys=capsys)
    assert code == 0 and "hyb-0001: cordoned by ops" in out  # the token's principal: the scheduler derives it
    code, _, err = run(env, "host", "uncordon", "hyb-0001", "--force", capsys=capsys)
    assert code == 2 and "--force" in err, err  # it names the hold it overrides
    code, _, err = run(env, "host", "uncordon", "hyb-0001", "--force", "alice", capsys=capsys)
    assert code == 1 and "hyb.host.admin_stale" in err and "held by ops since" in err, err
    assert api.get("/v1/hosts/hyb-0001").json()["admin_owner"] == "ops"
    code, out, _ = run(env, "host", "list", capsys=capsys)
    assert "cordoned (ops)" in next(ln for ln in out.splitlines() if ln.startswith("hyb-0001"))
    code, out, _ = run(env, "host", "show", "hyb-0001", capsys=capsys)
    assert "cordoned by ops: disk swap" in out and "NUMA nodes" in out
    code, out, _ = run(env, "audit", "--action", "host.", "--target", "hyb-0001", "-o", "json", capsys=capsys)
    assert [a["action"] for a in json.loads(out)["items"]][:1] == ["host.cordoned"]
    code, out, _ = run(env, "audit", "--since", "10m", capsys=capsys)
    assert any(ln.split()[3:6] == ["ops", "host.cordoned", "hyb-0001"] for ln in out.splitlines()), out
    code, _, err = run(env, "audit", "--since", "yesterday", capsys=capsys)
    assert code == 2 and "--since" in err
    assert run(env, "host", "uncordon", "hyb-0001", capsys=capsys)[0] == 0
    # a drain asks first; with no terminal to ask on, nothing happens
    r = cli(env, "host", "drain", "hyb-0001", stdin=subprocess.DEVNULL)
    assert r.returncode == 1 and "refused without --yes" in r.stderr
    assert api.get("/v1/hosts/hyb-0001").json()["admin_state"] == "active"
    code, out, _ = run(env, "host", "drain", "hyb-0001", "--yes", "-o", "json", capsys=capsys)
    assert code == 0 and json.loads(out)["admin_state"] == "draining"
    code, _, _ = run(env, "host", "uncordon", "hyb-0001", "--force", "ops", "--reason", "done", capsys=capsys)
    assert code == 0 and api.get("/v1/hosts/hyb-0001").json()["admin_state"] == "active"


def test_vm_lifecycle_and_bad_input(env, vms, capsys) -> None:  # type: ignore[no-untyped-def]
    api = env["api"]
    code, _, err = run(env, "vm", "create", "-f", str(web_vm(env, "bad", vcpus=0)["path"]), capsys=capsys)
    assert code == 1 and "[vcpus]" in err
    assert not [v for v in api.get("/v1/vms").json()["items"] if v["name"] == "bad"]
    code, _, err = run(env, "vm", "create", "-f", str(env["dir"] / "missing.yaml"), capsys=capsys)
    assert code == 1 and "--filename" in err
    vid = vms["web-1"]["id"]
    code, _, err = run(env, "vm", "io-limits", vid, "--disk", "nope", "--set", "total_iops_sec=100", capsys=capsys)
    assert code == 1 and "[disks" in err, err
    code, _, err = run(env, "vm", "io-limits", vid, "--set", "total_iops_sec=100", capsys=capsys)
    assert code == 2 and "needs --disk" in err
    # a start of a running VM is the VM as it is (a stopped one: tests/scheduler/test_sched_drain_loop.py)
    code, out, _ = run(env, "vm", "start", vid, "--wait", "-o", "json", capsys=capsys)
    assert code == 0 and json.loads(out) == api.get(f"/v1/vms/{vid}").json()
    code, _, err = run(env, "vm", "start", "no-such-vm", capsys=capsys)
    assert code == 1 and "hyb.vm.not_found" in err, err
    path = web_vm(env, "gone")["path"]
    r = cli(env, "vm", "create", "-f", str(path), "--wait", "-o", "json", "--idempotency-key", "k-gone", who="web")
    assert r.returncode == 0, r.stderr
    v = json.loads(r.stdout)
    again = cli(env, "vm", "create", "-f", str(path), "-o", "json", "--idempotency-key", "k-gone", who="web")
    assert json.loads(again.stdout)["id"] == v["id"]  # the same key: the same VM
    r = cli(env, "vm", "delete", v["id"], who="web", stdin=subprocess.DEVNULL)
    assert r.returncode == 1 and api.get(f"/v1/vms/{v['id']}").json()["status"] == "running"
    code, out, _ = run(env, "vm", "delete", v["id"], "--yes", who="web", capsys=capsys)
    after = api.get(f"/v1/vms/{v['id']}")
    assert code == 0 and f"VM {v['id']} deleting" in out
    assert after.status_code == 404 or after.json()["status"] == "deleting", after.text


def rollout_of(name: str, *waves: list[str]) -> dict:
    """A rollout as fleet-rollout creates it (POST /v1/rollouts), over the given hosts."""
    def host(h: str) -> dict:
        return {"name": h, "address": f"{h}:7443", "rack": "r00", "host": {"name": h}}
    return {"name": name, "kind": "convert", "policy_digest": "ab" * 32, "spec": {"name": name},
            "waves": [[host(h) for h in w] for w in waves]}


def test_rollout_status_and_raw_calls(env, capsys) -> None:  # type: ignore[no-untyped-def]
    r = env["api"].post("/v1/rollouts", json=rollout_of("conv-1", ["hyb-0000"], ["hyb-0001"]))
    assert r.status_code == 201, r.text
    code, out, _ = run(env, "rollout", "status", "-o", "json", capsys=capsys)
    assert code == 0 and json.loads(out) == env["api"].get("/v1/rollouts").json()
    code, out, _ = run(env, "rollout", "status", capsys=capsys)
    row = next(ln for ln in out.splitlines() if ln.startswith("conv-1")).split()
    assert row[1:4] == ["convert", "running", "1/2"], row
    code, out, _ = run(env, "rollout", "status", "conv-1", capsys=capsys)
    assert code == 0 and "wave 1 of 2" in out
    hosts = {ln.split()[0]: ln.split() for ln in out.splitlines() if ln.startswith("hyb-")}
    assert hosts["hyb-0000"][1] == "0" and hosts["hyb-0001"][1] == "1"
    code, out, _ = run(env, "rollout", "pause", "conv-1", "--reason", "change freeze", capsys=capsys)
    assert code == 0 and "rollout conv-1: paused" in out
    assert env["api"].get("/v1/rollouts/conv-1").json()["state"] == "paused"
    code, _, err = run(env, "rollout", "pause", "conv-1", capsys=capsys)  # not running: the API's 409
    assert code == 1 and "hyb.rollout.bad_state" in err
    code, _, err = run(env, "rollout", "resume", "conv-1", "--expect", "running", capsys=capsys)  # moved since
    assert code == 1 and "hyb.rollout.stale_state" in err and "found paused (pause by ops at " in err, err
    r = cli(env, "rollout", "abort", "conv-1", stdin=subprocess.DEVNULL)  # asks first, with the state it replaces
    assert r.returncode == 1 and "refused without --yes" in r.stderr and "now paused" in r.stderr, r.stderr
    code, out, _ = run(env, "rollout", "abort", "conv-1", "--yes", "-o", "json", capsys=capsys)
    assert code == 0 and json.loads(out)["state"] == "aborting"
    code, _, err = run(env, "rollout", "status", "no-such", capsys=capsys)
    assert code == 1 and "hyb.rollout.not_found" in err
    code, out, _ = run(env, "api", "GET", "/v1/hosts?rack=r01", capsys=capsys)
    assert code == 0 and [h["name"] for h in json.loads(out)["items"]] == ["hyb-0001"]
    code, out, _ = run(env, "api", "POST", "/v1/hosts/hyb-0000/cordon", "-d", '{"owner": "alice"}', capsys=capsys)
    assert code == 1 and json.loads(out)["error"]["field"] == "owner"  # an owner is never the client's to name
    code, _, err = run(env, "api", "FETCH", "/v1/hosts", capsys=capsys)
    assert code == 2 and "METHOD" in err


def test_errors_are_one_line_with_the_right_exit_code(env, tmp_path) -> None:  # type: ignore[no-untyped-def]
    down = f"https://127.0.0.1:{free_port()}"
    r = cli(env, "vm", "list", extra_env={"HYBCTL_SERVER": down})
    assert r.returncode == 1 and "Traceback" not in r.stderr and "cannot connect" in r.stderr and down in r.stderr
    r = cli(env, "vm", "list", extra_env={"HYBCTL_CA": ""})  # the system's roots do not know the dev CA
    assert r.returncode == 1 and "TLS" in r.stderr and "Traceback" not in r.stderr
    other = dev_certs(tmp_path / "other-ca")  # a CA that did not sign the scheduler's certificate
    r = cli(env, "vm", "list", extra_env={"HYBCTL_CA": str(other / "ca.crt")})
    assert r.returncode == 1 and "TLS: the server's certificate is not trusted" in r.stderr, r.stderr
    bad = tmp_path / "bad.token"
    bad.write_text("nobody-knows-this")
    r = cli(env, "vm", "list", extra_env={"HYBCTL_TOKEN_FILE": str(bad)})
    assert r.returncode == 1 and r.stderr == (f"error: scheduler GET /v1/vms: the token of HYBCTL_TOKEN_FILE {bad} "
                                              "was refused: unknown or revoked token (hyb.auth.missing)\n")
    r = cli(env, "host", "list", who="web")
    assert r.returncode == 1 and "hyb.auth.forbidden" in r.stderr
    r = cli(env, "fleet", "--bins", "many")
    assert r.returncode == 2 and "--bins" in r.stderr
    assert r.stderr.count("Traceback") == 0


def test_watch_redraws_until_interrupted(env, vms) -> None:  # type: ignore[no-untyped-def]
    e = {**os.environ, "HYBCTL_SERVER": env["url"], "HYBCTL_CA": str(env["ca"]),
         "HYBCTL_TOKEN_FILE": str(env["tokens"]["admin"]), "COLUMNS": "200"}
    # SIGINT at its default, whatever this run inherited (a background `make test &`)
    p = subprocess.Popen(["env", "--default-signal=INT", BIN, "vm", "list", "-o", "json", "--watch", "--interval",
                          "0.3"], env=e, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines: list[str] = []
    shown = threading.Event()  # the first document is out: hybctl is in its watch loop

    def read() -> None:
        for line in p.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if "web-1" in line:
                shown.set()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if not shown.wait(30):
            p.kill()
            raise AssertionError(f"hybctl --watch printed no VM list within 30 s: {''.join(lines)!r} "
                                 f"{p.stderr.read()!r}")  # type: ignore[union-attr]
        os.kill(p.pid, signal.SIGINT)
        p.wait(timeout=10)
        reader.join(10)
        err = p.stderr.read()  # type: ignore[union-attr]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err
    assert "web-1" in "".join(lines) and "Traceback" not in err


def test_shell_completion_offers_the_commands(env) -> None:  # type: ignore[no-untyped-def]
    r = subprocess.run([BIN], env={**os.environ, "_HYBCTL_COMPLETE": "complete_bash", "COMP_WORDS": "hybctl vm ",
                                   "COMP_CWORD": "2"}, text=True, capture_output=True, timeout=30)
    assert r.returncode == 0 and {"create", "list", "show", "delete", "io-limits"} <= set(r.stdout.split()), r
    r = subprocess.run([BIN, "--show-completion", "bash"], env={**os.environ, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_"
                                                                              "DETECTION": "1"},
                       text=True, capture_output=True, timeout=30)
    assert r.returncode == 0 and "_HYBCTL_COMPLETE" in r.stdout, r
