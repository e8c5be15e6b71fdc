#!/usr/bin/env python3
"""What InnoDB's doublewrite buffer costs: MariaDB + sysbench oltp_read_write, doublewrite ON
(the baseline) vs OFF, same run, same data, same device (root).

The saving a disk with an atomic write unit >= the InnoDB page size buys (issue #41): with
such a disk the guest profile turns doublewrite off (guestimages/common/hyb-innodb-atomic).
This bench measures the cost saved, NOT safety: with doublewrite OFF on a device without an
atomic unit (this machine's loop device, its virtio disk) a power loss can tear a page.

Setup (all in a temp dir, cleaned up; a system MariaDB is never touched): a file-backed
loop device opened with direct IO (so the device's counters are only the database's and
the host page cache does not absorb its reads), ext4 on it, the datadir there; Debian's
mariadbd as its own instance (own datadir, socket, port, pid file; started with
--no-defaults, stopped by its PID); a data set several times the buffer pool (default
64 MiB pool, ~300 MB of tables: IO-bound). Then rounds of ON and OFF (mariadbd restarted
with --innodb-doublewrite=ON|OFF on the same datadir), each a warm-up then a measured
sysbench run; per run: TPS, p95 latency, and bytes written to the device per transaction
(/sys/block/<loop>/stat, write sectors x 512, over the measured run only). InnoDB's own
Innodb_dblwr_pages_written proves which mode ran.

    python3 bench/atomic_writes.py              # ~4 min: 1 round of 60 s per mode
    python3 bench/atomic_writes.py --long       # 3 rounds of 180 s, ~6x the pool
    python3 bench/atomic_writes.py --seconds 20 --rows 100000 --json
    python3 bench/atomic_writes.py --short --json   # ~30 s: the mechanism only (tests/bench/)

Missing packages (mariadb-server, sysbench) are installed by tools/dev/install-bench-db.sh.
Ratios are OFF against ON measured in the same run, printed beside the published
+28 % TPS, -39 % latency and -53 % write bytes (sysbench OLTP, IO-bound / cached).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tools.dev.procs import free_port  # noqa: E402

INSTALL = REPO / "tools/dev/install-bench-db.sh"
# Published by others (sysbench OLTP read-write, doublewrite off on an atomic-write device).
PUBLISHED = {"tps": +28.0, "p95_ms": -39.0, "write_bytes_per_trx": -53.0}
MODES = ("ON", "OFF")  # ON is the baseline
SECTOR = 512


# -- parsing and accounting (pure; tests/bench/test_atomic_writes_bench.py) ----

def parse_sysbench(text: str) -> dict[str, float]:
    """transactions, tps, p95_ms, errors from sysbench 1.0's run summary."""
    def grab(pattern: str) -> re.Match[str]:
        m = re.search(pattern, text, re.M)
        if m is None:
            raise ValueError(f"sysbench output has no {pattern!r}: {text[-800:]!r}")
        return m
    trx = grab(r"^\s*transactions:\s+(\d+)\s+\(([\d.]+) per sec\.\)")
    p95 = grab(r"^\s*95th percentile:\s+([\d.]+)")
    err = grab(r"^\s*ignored errors:\s+(\d+)")
    return {"transactions": float(trx.group(1)), "tps": float(trx.group(2)), "p95_ms": float(p95.group(1)),
            "errors": float(err.group(1))}


def parse_disk_stat(text: str) -> dict[str, int]:
    """/sys/block/<dev>/stat: the counters this bench uses (Documentation/block/stat.rst)."""
    f = [int(x) for x in text.split()]
    if len(f) < 11:
        raise ValueError(f"not a block stat line (want >= 11 fields): {text!r}")
    return {"write_ios": f[4], "write_sectors": f[6], "read_ios": f[0], "read_sectors": f[2]}


def per_trx(before: dict[str, int], after: dict[str, int], transactions: float) -> dict[str, float]:
    """Device bytes and IOs per transaction between two stat snapshots."""
    if transactions <= 0:
        raise ValueError("no transactions: nothing to divide by")
    w = (after["write_sectors"] - before["write_sectors"]) * SECTOR
    r = (after["read_sectors"] - before["read_sectors"]) * SECTOR
    return {"write_bytes_per_trx": w / transactions, "write_ios_per_trx": (after["write_ios"] - before["write_ios"])
            / transactions, "read_bytes_per_trx": r / transactions, "write_bytes": float(w)}


def summarize(runs: list[dict[str, float | str]]) -> dict[str, dict[str, float]]:
    """Median of each metric per mode."""
    out: dict[str, dict[str, float]] = {}
    for mode in MODES:
        rs = [r for r in runs if r["mode"] == mode]
        if rs:
            out[mode] = {k: statistics.median(float(r[k]) for r in rs) for k in rs[0] if k != "mode"}
    return out


def change_pct(base: float, other: float) -> float:
    return (other / base - 1.0) * 100.0 if base else float("nan")


def report_lines(summary: dict[str, dict[str, float]], conditions: str) -> list[str]:
    on, off = summary["ON"], summary["OFF"]
    lines = [f"atomic_writes: {conditions}",
             f"{'metric':<22}{'ON (baseline)':>16}{'OFF':>14}{'OFF vs ON':>12}{'published':>12}"]
    rows = [("tps", "TPS", "{:.1f}"), ("p95_ms", "p95 latency ms", "{:.1f}"),
            ("write_bytes_per_trx", "write bytes/trx", "{:.0f}"), ("write_ios_per_trx", "write IOs/trx", "{:.2f}"),
            ("read_bytes_per_trx", "read bytes/trx", "{:.0f}"), ("dblwr_pages", "dblwr pages", "{:.0f}")]
    for key, label, fmt in rows:
        pub = f"{PUBLISHED[key]:+.0f} %" if key in PUBLISHED else ""
        lines.append(f"{label:<22}{fmt.format(on[key]):>16}{fmt.format(off[key]):>14}"
                     f"{change_pct(on[key], off[key]):>+11.1f}%{pub:>12}")
    return lines


# -- the machine ----------------------------------------------------------------

def ensure_installed() -> None:
    if subprocess.run(["bash", str(INSTALL)]).returncode != 0:
        raise SystemExit("atomic_writes: mariadb-server/sysbench missing and could not be installed")


def loop_ext4(st: ExitStack, work: Path, size: int) -> tuple[str, Path]:
    img = work / "db.img"
    with open(img, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, size)  # real extents: direct IO goes to the disk
    dev = subprocess.run(["losetup", "--find", "--show", "--direct-io=on", str(img)], check=True,
                         capture_output=True, text=True).stdout.strip()
    st.callback(subprocess.run, ["losetup", "-d", dev], check=False)
    subprocess.run(["mkfs.ext4", "-q", "-E", "lazy_itable_init=0,lazy_journal_init=0", dev], check=True)
    mnt = work / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-o", "noatime", dev, str(mnt)], check=True)
    st.callback(subprocess.run, ["umount", str(mnt)], check=False)
    return dev, mnt


class MariaDB:
    """One mariadbd of our own: --no-defaults, datadir/socket/port/pid in the work dir."""

    def __init__(self, work: Path, datadir: Path, pool_mib: int):
        self.work, self.datadir, self.pool_mib = work, datadir, pool_mib
        self.socket = work / "mysqld.sock"
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    def install(self) -> None:
        subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={self.datadir}", "--user=root",
                        "--auth-root-authentication-method=socket", "--skip-test-db"],
                       check=True, capture_output=True, text=True)

    def start(self, doublewrite: str) -> None:
        argv = ["mariadbd", "--no-defaults", "--user=root", f"--datadir={self.datadir}",
                f"--socket={self.socket}", f"--port={self.port}", "--bind-address=127.0.0.1",
                f"--pid-file={self.work / 'mysqld.pid'}", f"--log-error={self.work / 'mysqld.err'}",
                f"--innodb-buffer-pool-size={self.pool_mib}M", f"--innodb-doublewrite={doublewrite}",
                "--innodb-flush-method=O_DIRECT", "--skip-log-bin", "--max-connections=64"]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 120:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mariadbd exited {self.proc.returncode}: "
                                   f"{(self.work / 'mysqld.err').read_text()[-1500:]}")
            if self.socket.exists() and subprocess.run(self._client("SELECT 1"), capture_output=True).returncode == 0:
                return
            time.sleep(0.3)
        raise RuntimeError("mariadbd did not answer within 120 s")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)  # clean shutdown: InnoDB flushes, by our own PID
        try:
            self.proc.wait(timeout=180)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def _client(self, sql: str) -> list[str]:
        return ["mariadb", "--no-defaults", "-uroot", f"--socket={self.socket}", "-N", "-B", "-e", sql]

    def query(self, sql: str) -> str:
        return subprocess.run(self._client(sql), check=True, capture_output=True, text=True).stdout.strip()

    def status(self, name: str) -> int:
        return int(self.query(f"SHOW GLOBAL STATUS LIKE '{name}'").split()[1])

    def sysbench(self, *args: str) -> list[str]:
        return ["sysbench", "oltp_read_write", "--db-driver=mysql", "--mysql-user=root",
                f"--mysql-socket={self.socket}", "--mysql-db=sbtest", *args]


def data_bytes(db: MariaDB) -> int:
    return int(db.query("SELECT SUM(data_length + index_length) FROM information_schema.tables "
                        "WHERE table_schema = 'sbtest'") or 0)


def run(args: argparse.Namespace) -> tuple[list[dict[str, float | str]], dict[str, float | str]]:
    ensure_installed()
    runs: list[dict[str, float | str]] = []
    with ExitStack() as st:
        work = Path(tempfile.mkdtemp(prefix="hyb-atomic-bench-", dir=args.workdir))
        st.callback(subprocess.run, ["rm", "-rf", str(work)], check=False)
        dev, mnt = loop_ext4(st, work, args.disk_mib << 20)
        stat = Path("/sys/block") / Path(dev).name / "stat"
        db = MariaDB(work, mnt / "data", args.pool_mib)
        st.callback(db.stop)
        db.install()
        db.start("ON")
        db.query("CREATE DATABASE sbtest")
        common = [f"--tables={args.tables}", f"--table-size={args.rows}", f"--threads={args.threads}"]
        t0 = time.monotonic()
        subprocess.run(db.sysbench(*common, "prepare"), check=True, capture_output=True, text=True)
        prep_s = time.monotonic() - t0
        size = data_bytes(db)
        info: dict[str, float | str] = {"device": dev, "data_mib": size / 2**20, "pool_mib": args.pool_mib,
                                        "prepare_s": prep_s, "data_over_pool": size / (args.pool_mib << 20)}
        print(f"atomic_writes: {args.tables} x {args.rows} rows = {size / 2**20:.0f} MiB "
              f"({info['data_over_pool']:.1f}x the {args.pool_mib} MiB pool), prepared in {prep_s:.0f} s on {dev}",
              file=sys.stderr)
        db.stop()
        for rnd in range(args.rounds):
            for mode in MODES:
                db.start(mode)
                if args.warmup:
                    subprocess.run(db.sysbench(*common, f"--time={args.warmup}", "run"), check=True,
                                   capture_output=True, text=True)
                dblwr0 = db.status("Innodb_dblwr_pages_written")
                before_text = stat.read_text()
                before = parse_disk_stat(before_text)
                out = subprocess.run(db.sysbench(*common, f"--time={args.seconds}", "--percentile=95", "run"),
                                     check=True, capture_output=True, text=True).stdout
                after_text = stat.read_text()
                after = parse_disk_stat(after_text)
                if args.raw:  # what the numbers were computed from (tests/data/bench/ keeps one)
                    Path(args.raw).mkdir(parents=True, exist_ok=True)
                    Path(args.raw, f"round{rnd + 1}-{mode}.sysbench.txt").write_text(out)
                    Path(args.raw, f"round{rnd + 1}-{mode}.stat.txt").write_text(
                        before_text + after_text)
                res = parse_sysbench(out)
                r: dict[str, float | str] = {"mode": mode, **res, **per_trx(before, after, res["transactions"]),
                                             "dblwr_pages": db.status("Innodb_dblwr_pages_written") - dblwr0}
                if (mode == "ON") != (r["dblwr_pages"] > 0):
                    raise RuntimeError(f"doublewrite {mode} but Innodb_dblwr_pages_written grew by {r['dblwr_pages']}")
                runs.append(r)
                print(f"atomic_writes: round {rnd + 1} {mode}: {res['tps']:.1f} TPS, p95 {res['p95_ms']:.1f} ms, "
                      f"{r['write_bytes_per_trx']:.0f} B/trx written", file=sys.stderr)
                db.stop()
    return runs, info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=int, help="measured sysbench run per mode and round (default 60; --long 180)")
    p.add_argument("--warmup", type=int, help="discarded sysbench run after each restart (default 15; --long 30)")
    p.add_argument("--rounds", type=int, help="rounds of ON then OFF (default 1; --long 3)")
    p.add_argument("--tables", type=int, default=4)
    p.add_argument("--rows", type=int, help="rows per table (default 300000 ~ 4.5x the pool; --long 400000)")
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--pool-mib", type=int, default=64, help="innodb_buffer_pool_size")
    p.add_argument("--disk-mib", type=int, default=2048, help="the loop device's size")
    p.add_argument("--workdir", default="/var/tmp", help="where the temp dir and the loop file go")
    p.add_argument("--long", action="store_true")
    p.add_argument("--short", action="store_true", help="2 x 20000 rows, 8 MiB pool, 8 s per mode: the "
                   "mechanism (dblwr pages ON only, bytes counted), not the numbers")
    p.add_argument("--raw", help="keep each sysbench output and device stat snapshot in this directory")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.short and args.long:
        p.error("--short or --long, not both")
    if args.short:
        args.tables, args.pool_mib, args.disk_mib = 2, 8, 512
    for k, dflt, short, long_ in (("seconds", 60, 8, 180), ("warmup", 15, 2, 30), ("rounds", 1, 1, 3),
                                  ("rows", 300_000, 20_000, 400_000)):
        if getattr(args, k) is None:
            setattr(args, k, long_ if args.long else short if args.short else dflt)
    for k in ("seconds", "rounds", "tables", "rows", "threads", "pool_mib"):
        if getattr(args, k) < 1:
            p.error(f"--{k.replace('_', '-')} must be >= 1")
    if os.geteuid() != 0:
        print("atomic_writes: needs root (loop device, mount)", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the cleanups run on kill <pid> too
    runs, info = run(args)
    summary = summarize(runs)
    if args.json:
        print(json.dumps({"info": info, "runs": runs, "summary": summary}, indent=1))
        return 0
    cond = (f"{info['data_mib']:.0f} MiB data, {args.pool_mib} MiB pool ({info['data_over_pool']:.1f}x), "
            f"{args.threads} threads, {args.rounds} x {args.seconds} s per mode, loop device {info['device']} "
            "(direct IO, ext4); medians")
    print("\n".join(report_lines(summary, cond)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
