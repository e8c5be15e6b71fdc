"""A fleet whose utilisation is known, for the console's browser tests and its screenshots.

``populate`` registers N hosts through the scheduler's API (the host token; shapes and
racks as bench/placement.py's fleet) and sends each two days (``POST /v1/hosts/{name}/days``),
before and after a conversion, drawn from a seeded generator shaped like the source's
picture: before, the evening peak mostly under 10 % of the host's CPUs (the IO service
and the rest); after, VMs on the carved hosts add 20-60 %. ``Chromium`` is headless
Debian Chromium driven by Selenium through Debian's chromedriver, stopped with every
process it started (found by its own --user-data-dir).

    .venv/bin/python -m tools.dev.console_fleet OUT_DIR [--hosts 3000]

starts a scheduler on SQLite, populates it (and adds a rollout, two VMs and a cordon),
saves screenshots of every console page in OUT_DIR (docs/img/console-*.png come from
here: ``python -m tools.dev.console_fleet docs/img``), and stops all of it.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime as dt
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import httpx

from tools.dev.schedbench import fleet, register_body

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")


def day_of(day: str, cpus: int, io: float, vms: float, other: float, probe_p99_ms: float = 1.5) -> dict:
    total = min(100, round((io + vms + other) / cpus * 100))
    hist = [0] * 20
    hist[min(19, total // 5)] = 86400
    return {"day": day, "utc_offset_min": 0, "cpus": cpus, "samples": 86400,
            "peak": {"start": "21:00", "end": "22:00", "samples": 3600, "io": round(io, 3), "vms": round(vms, 3),
                     "other": round(other, 3)},
            "hours": [total] * 24, "hist": hist, "probe_p99_ms_max": round(probe_p99_ms, 3),
            "psi_some_avg10_max": 2.0, "foreign_cpu_s": 0.0, "probe_failed": 0}


def known_days(names: list[str], cpus: dict[str, int], before: str, after: str, seed: int = 7) -> dict[str, list]:
    """Per host, its before and after days. 85 % of the hosts are converted (VMs after);
    one in 50 of those has a slow IO probe after (p99 80 ms, over the alert rule's 50)."""
    rnd = random.Random(seed)
    out = {}
    for n in names:
        c = cpus[n]
        io = c * rnd.uniform(0.01, 0.07)
        other = c * rnd.uniform(0.0, 0.03)
        vms = c * rnd.uniform(0.2, 0.6) if rnd.random() < 0.85 else 0.0
        slow = vms > 0 and rnd.random() < 0.02
        out[n] = [day_of(before, c, io, 0.0, other), day_of(after, c, io, vms, other, 80.0 if slow else 1.5)]
    return out


def populate(url: str, verify, host_token: str, admin_token: str, n: int, *, before: str,  # type: ignore[no-untyped-def]
             after: str, workers: int = 8) -> dict[str, list]:
    """Register ``n`` hosts and send their days; returns the days sent, by host, once the
    scheduler shows them all (it writes days in batches, with its heartbeat flush)."""
    hosts = fleet(n)
    cpus = {name: shape.nodes * shape.cores_per_node * shape.smt for name, shape, _ in hosts}  # online CPUs
    days = known_days([h[0] for h in hosts], cpus, before, after)
    with httpx.Client(base_url=url, verify=verify, timeout=60, headers={"Authorization": f"Bearer {host_token}"},
                      limits=httpx.Limits(max_connections=workers)) as c:
        def one(h: tuple) -> None:
            name, shape, rack = h
            r = c.post("/v1/hosts", json=register_body(name, shape, rack))
            assert r.status_code in (200, 201), r.text
            r = c.post(f"/v1/hosts/{name}/days", json={"days": days[name]})
            assert r.status_code == 202, r.text
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            list(pool.map(one, hosts))
        deadline = time.monotonic() + 60
        while True:
            u = c.get("/v1/fleet/utilization", params={"day": after, "compare": before},
                      headers={"Authorization": f"Bearer {admin_token}"}).json()
            if u["day"]["hosts_included"] == n and u["compare"]["hosts_included"] == n:
                return days
            if time.monotonic() > deadline:
                raise AssertionError(f"days not all shown after 60 s: {u['day']['hosts_included']} of {n}")
            time.sleep(0.3)


class Chromium:
    """Headless Chromium under Selenium; ``quit`` leaves no process of it behind."""

    def __init__(self, work: Path, *, width: int = 1400, height: int = 1000):
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
        self.profile = Path(tempfile.mkdtemp(prefix="hyb-chromium-", dir=work))
        o = webdriver.ChromeOptions()
        o.binary_location = str(CHROMIUM)
        # as root Chromium needs --no-sandbox; the background services would knock on this
        # machine's closed network at every start; the dev CA is not in Chromium's store,
        # so its certificate errors are ignored (the scheduler is on loopback)
        for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-quic", "--ignore-certificate-errors", f"--user-data-dir={self.profile}",
                  f"--window-size={width},{height}"):
            o.add_argument(a)
        self.driver = webdriver.Chrome(options=o, service=Service(str(CHROMEDRIVER)))
        self.driver_pid = self.driver.service.process.pid  # chromedriver: its command line names no profile
        self.driver.set_page_load_timeout(60)

    def pids(self) -> list[int]:
        """Processes started with this browser's profile directory, or its driver."""
        out = []
        for p in Path("/proc").iterdir():
            if p.name.isdigit():
                try:
                    cmd = (p / "cmdline").read_bytes()
                except OSError:
                    continue
                if str(self.profile).encode() in cmd or (int(p.name) == self.driver_pid and b"chromedriver" in cmd):
                    out.append(int(p.name))
        return out

    def quit(self) -> None:
        """Idempotent."""
        if self.driver is None:
            return
        try:
            self.driver.quit()
        finally:
            self.driver = None
            deadline = time.monotonic() + 10
            while self.pids() and time.monotonic() < deadline:
                time.sleep(0.2)
            for pid in self.pids():  # ours by their profile directory
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            shutil.rmtree(self.profile, ignore_errors=True)


def login(b: Chromium, url: str, token: str, path: str = "/ui") -> None:
    from selenium.webdriver.common.by import By
    b.driver.get(f"{url}/ui/login?next={quote(path, safe='/')}")
    b.driver.find_element(By.ID, "token").send_keys(token)
    b.driver.find_element(By.ID, "login").click()
    wait_for(lambda: "/ui/login" not in b.driver.current_url)  # the click does not wait for the redirect


def wait_for(fn, timeout_s: float = 20.0):  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout_s
    while True:
        try:
            got = fn()
            if got:
                return got
        except Exception:  # noqa: BLE001 - the page is still loading
            if time.monotonic() > end:
                raise
        if time.monotonic() > end:
            raise AssertionError("the page did not get there in time")
        time.sleep(0.2)


PAGES = ("fleet", "hosts", "vms", "why", "rollouts", "audit")


def extras(url: str, verify, admin_token: str, host: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """What the pages beyond the fleet show: a convert rollout over two hosts (its policy
    named by its spec), two VMs, a cordon with a reason (an audit record). Returns the
    paths of the one-of pages: a host, a VM, the rollout."""
    with httpx.Client(base_url=url, verify=verify, timeout=60,
                      headers={"Authorization": f"Bearer {admin_token}"}) as c:
        waves = [[{"name": h, "address": f"{h}:7443", "rack": "r0000", "host": {"name": h}}]
                 for h in ("oss-00000", "oss-00001")]
        r = c.post("/v1/rollouts", json={"name": "conv-1", "kind": "convert", "policy_digest": "ab" * 32,
                                          "spec": {"name": "conv-1", "policy": "policies/storage-v2.toml"},
                                          "waves": waves})
        assert r.status_code == 201, r.text
        vm = ""
        for name, tenant in (("web-a", "web"), ("db-a", "db")):
            r = c.post("/v1/vms", json={"name": name, "vcpus": 2, "memory_mib": 2048, "image": "smoke",
                                        "tenant": tenant}, headers={"Idempotency-Key": name})
            assert r.status_code == 202, r.text
            vm = vm or r.json()["id"]
        r = c.post(f"/v1/hosts/{host}/cordon", json={"reason": "fan replaced, watching temperatures"})
        assert r.status_code == 200, r.text
    return {"host": f"/ui/hosts/{host}", "vm": f"/ui/vms/{vm}", "rollout": "/ui/rollouts/conv-1"}


def live_cost(url: str, verify, cookie: str, host: str, n: int = 20) -> None:  # type: ignore[no-untyped-def]
    """Prints what one poll of each live fragment costs beside its whole page: the median
    time of ``n`` requests back to back and the bytes answered (back to back, the fleet-wide
    reads of ``/ui/live/fleet`` and ``/ui/live/hosts`` are shared: ``routes.LIVE_TTL_S``)."""
    with httpx.Client(base_url=url, verify=verify, timeout=60, cookies={"hyb_session": cookie}) as c:
        pairs = ((host, host.replace("/ui/hosts/", "/ui/live/hosts/")), ("/ui/hosts", "/ui/live/hosts"),
                 ("/ui/fleet?day=" + (dt.date.today() - dt.timedelta(days=1)).isoformat(), "/ui/live/fleet"))
        for full, part in pairs:
            out = []
            for path in (full, part):
                took = []
                for _ in range(n):
                    t = time.perf_counter()
                    r = c.get(path)
                    took.append(time.perf_counter() - t)
                    assert r.status_code == 200, (path, r.status_code)
                out.append(f"{path}: {sorted(took)[n // 2] * 1000:.1f} ms, {len(r.content):,} B")
            print("live cost: " + "  vs  ".join(out), flush=True)


def main(argv: list[str] | None = None) -> int:
    from tools.dev.fleetsim import fleet_scheduler
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--hosts", type=int, default=3000)
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    today = dt.date.today()
    before, after = (today - dt.timedelta(days=30)).isoformat(), (today - dt.timedelta(days=1)).isoformat()
    with tempfile.TemporaryDirectory(prefix="hyb-console-") as tmp, \
            fleet_scheduler(Path(tmp), admin_token="shots-admin", host_token="shots-host") as s:
        t = time.monotonic()
        populate(s["sched"].url, s["sched"].verify, "shots-host", "shots-admin", a.hosts, before=before, after=after)
        print(f"{a.hosts} hosts registered with two days each in {time.monotonic() - t:.0f} s", flush=True)
        one = extras(s["sched"].url, s["sched"].verify, "shots-admin", "oss-00007")
        b = Chromium(Path(tmp), height=1200)
        try:
            login(b, s["sched"].url, "shots-admin")
            # whole-host use (split by state: every host is active here), then by class
            for group, name in (("state", "console-fleet.png"), ("class", "console-fleet-class.png")):
                b.driver.get(f"{s['sched'].url}/ui/fleet?day={after}&compare={before}&group={group}")
                time.sleep(2)  # the charts' entry animation
                b.driver.save_screenshot(str(a.out / name))
            for p in PAGES[1:]:
                b.driver.get(f"{s['sched'].url}/ui/{p}")
                b.driver.save_screenshot(str(a.out / f"console-{p}.png"))
            for name, path in one.items():
                b.driver.get(s["sched"].url + path)
                time.sleep(1)
                b.driver.save_screenshot(str(a.out / f"console-{name}.png"))
            b.driver.get(f"{s['sched'].url}/ui/hosts/no-such-host")
            b.driver.save_screenshot(str(a.out / "console-error.png"))
            live_cost(s["sched"].url, s["sched"].verify, b.driver.get_cookie("hyb_session")["value"], one["host"])
        finally:
            b.quit()
    print(f"screenshots in {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
