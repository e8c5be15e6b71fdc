"""bench/wrk/heartbeat.lua and its reader (tools/dev/schedbench.py): the report line is
found among wrk's own output, and the script, run by the real wrk against two small
HTTP servers, sends the Python beat()'s request (path, token, Content-Length: 0) for
each host in turn, each host to its replica, at the rate asked, and reports what it sent."""

from __future__ import annotations

import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tools.dev.schedbench import WRK, WrkRun, parse_wrk_report, start_wrk, stop_wrk, wait_wrk

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench/wrk/heartbeat.lua"


def test_the_report_is_the_marked_line_among_wrks_own() -> None:
    out = ("Running 3s test @ http://127.0.0.1:1\n  2 threads and 8 connections\n"
           'HYB-WRK-REPORT {"sent":4000,"statuses":{"200":3990,"503":10},"latency_us":{"99":503,"max":1577},'
           '"first_send_us":1000000,"last_answer_us":3000000,"late_1ms":1}\n'
           "Requests/sec:   1331.12\n")
    run = WrkRun(parse_wrk_report(out), cpu_s=0.2)
    assert (run.sent, run.answered(200), run.answered(503), run.answered(404)) == (4000, 3990, 10, 0)
    assert run.p("99") == pytest.approx(0.000503) and run.p("99.9") is None
    assert run.window_s == pytest.approx(2.0)


def test_no_report_line_is_an_error_not_an_empty_run() -> None:
    with pytest.raises(ValueError, match="HYB-WRK-REPORT"):
        parse_wrk_report("PANIC: unprotected error in call to Lua API\n")
    assert WrkRun({}, 0.0).window_s == 0.0


@pytest.mark.skipif(not WRK.exists(), reason=f"{WRK} not installed")
def test_the_script_beats_each_host_in_turn_at_the_rate(tmp_path: Path) -> None:
    got: list[tuple[int, str, dict[str, str], float]] = []

    class Beat(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body in two writes would wait for the delayed ACK

        def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
            got.append((self.server.server_port, self.path, dict(self.headers), time.monotonic()))
            self.send_response(200 if "h3" not in self.path else 503)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *_: object) -> None:
            pass

    servers = [ThreadingHTTPServer(("127.0.0.1", 0), Beat) for _ in range(2)]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    try:
        ports = [s.server_port for s in servers]
        files = []
        for r in range(2):  # host i to replica i % 2, as bench/fleet_pulse.py splits them
            f = tmp_path / f"names-{r}"
            f.write_text("".join(f"h{i}\n" for i in range(r, 10, 2)))
            files.append(str(f))
        p = start_wrk(SCRIPT, f"http://127.0.0.1:{ports[0]}", threads=2, conns=8, seconds=2,
                      env={"HYB_WRK_ADDRS": ",".join(f"127.0.0.1:{x}" for x in ports),
                           "HYB_WRK_NAMES": ",".join(files), "HYB_WRK_RATE": "200", "HYB_WRK_COUNT": "200",
                           "HYB_WRK_START": "2", "HYB_WRK_TOKEN": "bench-host"})
        run = wait_wrk(p)
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()
    assert run.sent == len(got) == 400  # wrk's own check of the script sends nothing
    assert run.answered(200) == 360 and run.answered(503) == 40
    port, path, headers, _ = got[0]
    assert headers["Authorization"] == "Bearer bench-host" and headers["Content-Length"] == "0"
    assert headers["Host"] == f"127.0.0.1:{port}"
    assert Counter((port, path) for port, path, _h, _t in got) == {
        (ports[i % 2], f"/v1/hosts/h{i}/heartbeat"): 40 for i in range(10)}
    # START 2: each thread begins at its list's third host (h4, h6, h8, h0, then h2 for replica
    # 0). Its 4 connections each send one of the first four; the fifth waits for an answer,
    # so whatever the load, a replica's first arrival is one of the first four (h2 is not; it
    # would be among them from START 0). Not their order: on a loaded machine connections
    # open late and a fast one's second beat arrives before a slow one's first
    for r, port in enumerate(ports):
        first = min((g for g in got if g[0] == port), key=lambda g: g[3])[1]
        assert first in {f"/v1/hosts/h{i}/heartbeat" for i in (4 + r, 6 + r, 8 + r, r)}, (port, first)
    times = sorted(t for *_, t in got)
    # 200 a thread at 200/s: one second, not a burst (the bound that matters); a loaded
    # machine may stretch it, not shorten it
    assert 0.9 <= times[-1] - times[0] <= 2.0
    assert run.cpu_s > 0 and 0.9 <= run.window_s <= 2.2


@pytest.mark.skipif(not WRK.exists(), reason=f"{WRK} not installed")
def test_a_stopped_wrk_reports_and_the_next_takes_the_stream_on_from_there(tmp_path: Path) -> None:
    """bench/fleet_pulse.py's phase 5 hands a restarting replica's hosts to the other
    replica and back: a wrk stopped by SIGINT (stop_wrk) before its -d ends still prints
    its report, and a wrk started at HYB_WRK_START = what the first sent continues the
    hosts' turn: over both, every host beat as often as the others, give or take one
    (nothing skipped, nothing sent twice)."""
    got: list[str] = []

    class Beat(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
            got.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Beat)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    names = tmp_path / "names"
    names.write_text("".join(f"h{i}\n" for i in range(7)))
    addr = f"127.0.0.1:{server.server_port}"

    def wrk(start: int, count: int, seconds: float) -> object:
        return start_wrk(SCRIPT, f"http://{addr}", threads=1, conns=4, seconds=seconds,
                         env={"HYB_WRK_ADDRS": addr, "HYB_WRK_NAMES": str(names), "HYB_WRK_RATE": "100",
                              "HYB_WRK_COUNT": str(count), "HYB_WRK_START": str(start), "HYB_WRK_TOKEN": "t"})
    try:
        p = wrk(3, 100_000, 30)
        time.sleep(1.5)
        t = time.monotonic()
        first = stop_wrk(p)  # type: ignore[arg-type]
        assert time.monotonic() - t < 5  # not the 30 s of -d
        time.sleep(0.3)  # anything in flight has landed
        n1 = len(got)
        second = wait_wrk(wrk(3 + first.sent, 40, 2))  # type: ignore[arg-type]
        time.sleep(0.3)
        # one that ended by itself (its -d out) before it is stopped: still its report
        p = wrk(0, 5, 1)
        time.sleep(2.5)
        late = stop_wrk(p)  # type: ignore[arg-type]
    finally:
        server.shutdown()
        server.server_close()
    assert 50 <= first.sent <= 200 and first.answered(200) <= first.sent
    assert n1 == first.sent  # what the report says went out is what arrived
    assert second.sent == 40 and late.sent == 5 and late.cpu_s > 0
    got = got[:first.sent + 40]
    per_host = Counter(got)
    assert set(per_host) == {f"/v1/hosts/h{i}/heartbeat" for i in range(7)}
    assert max(per_host.values()) - min(per_host.values()) <= 1, per_host
