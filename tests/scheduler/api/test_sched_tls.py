"""The REST API on the wire: real `scheduler serve` processes (uvicorn) with HTTPS from
the dev CA (tools/dev/make-dev-ca.sh). A client that trusts another CA fails, plain HTTP to
the TLS port gets no answer, mTLS refuses a client without a certificate, the server
will not start on plain HTTP unless told to, and an unauthenticated 300 MB body is
refused before the server reads it (its memory does not grow)."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from tools.dev.procs import REPO, Scheduler, free_port

from sched_helpers import token_config

# xdist: own scheduler process: not the machine group
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("sched-tls")]


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["bash", str(REPO / "tools/dev/make-dev-ca.sh"), str(d)], check=True, capture_output=True)
    return d


def config(tmp: Path, certs: Path | None, **server: object) -> Path:
    toks = "".join(f'[[auth.tokens]]\nname = "{t["name"]}"\nsha256 = "{t["sha256"]}"\n'
                   f'scopes = [{", ".join(chr(34) + s + chr(34) for s in t["scopes"])}]\n' for t in token_config())
    srv = {"tls_cert": str(certs / "scheduler-api.crt"), "tls_key": str(certs / "scheduler-api.key")} if certs else {}
    srv |= server
    lines = "".join(f"{k} = {v if isinstance(v, (bool, int)) and not isinstance(v, bool) else _v(v)}\n"
                    for k, v in srv.items())
    path = tmp / "scheduler.toml"
    path.write_text(f'log_level = "WARNING"\n[server]\n{lines}[db]\nurl = "sqlite:///{tmp}/s.db"\n'
                    f'[dispatch]\nenabled = false\n[reconcile]\ninterval_s = 0\n{toks}')
    return path


def _v(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ", ".join(f'"{x}"' for x in v) + "]"
    return f'"{v}"'


@pytest.fixture
def serve(tmp_path: Path):
    started: list[Scheduler] = []

    def start(cfg: Path, ca: Path | None, **kw) -> Scheduler:  # type: ignore[no-untyped-def]
        s = Scheduler(cfg, free_port(), dict(os.environ), tmp_path / f"s{len(started)}.log", ca=ca, **kw)
        started.append(s)
        return s.start()
    yield start
    for s in started:
        s.stop()


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def trusting(ca: Path) -> ssl.SSLContext:
    """A client context that trusts ``ca`` (httpx deprecates ``verify=<path>``)."""
    return ssl.create_default_context(cafile=str(ca))


def announce(url: str, ca: Path, path: str, token: str, length: int) -> str:
    """POST ``path`` announcing a ``length``-byte body, send none, and return the answer."""
    u = urlsplit(url)
    with socket.create_connection((u.hostname, u.port), timeout=10) as raw, \
            trusting(ca).wrap_socket(raw, server_hostname=u.hostname) as tls:
        tls.sendall(f"POST {path} HTTP/1.1\r\nHost: {u.netloc}\r\nAuthorization: Bearer {token}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n".encode())
        got = b""
        while b"}}" not in got:
            more = tls.recv(65536)
            if not more:
                break
            got += more
    return got.decode(errors="replace")


def test_https_with_the_right_ca_only(serve, certs: Path, tmp_path: Path) -> None:
    s = serve(config(tmp_path, certs), certs / "ca.crt")
    assert s.url.startswith("https://")
    assert httpx.get(f"{s.url}/readyz", verify=trusting(certs / "ca.crt")).status_code == 200
    other = tmp_path / "other"
    subprocess.run(["bash", str(REPO / "tools/dev/make-dev-ca.sh"), str(other)], check=True, capture_output=True)
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{s.url}/readyz", verify=trusting(other / "ca.crt"))
    plain = s.url.replace("https://", "http://")
    try:
        r = httpx.get(f"{plain}/readyz", timeout=5)
    except httpx.HTTPError:
        pass  # the TLS server drops a plain HTTP client: nothing was answered
    else:
        pytest.fail(f"plain HTTP got an answer: {r.status_code} {r.text[:100]}")


def test_mtls_refuses_a_client_without_a_certificate(serve, certs: Path, tmp_path: Path) -> None:
    s = serve(config(tmp_path, certs, tls_client_ca=str(certs / "ca.crt")), certs / "ca.crt",
              client_cert=(certs / "scheduler.crt", certs / "scheduler.key"))
    ctx = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{s.url}/healthz", verify=ctx)
    ctx.load_cert_chain(str(certs / "scheduler.crt"), str(certs / "scheduler.key"))
    assert httpx.get(f"{s.url}/healthz", verify=ctx).status_code == 200


def test_plain_http_must_be_asked_for(certs: Path, tmp_path: Path) -> None:
    cfg = config(tmp_path, None)
    r = subprocess.run([sys.executable, "-m", "scheduler.cli", "serve", "--config", str(cfg),
                        "--port", str(free_port())], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode != 0 and "[server.tls_cert]" in r.stderr, r.stderr[-500:]


def test_an_unauthenticated_huge_body_is_refused_unread(serve, certs: Path, tmp_path: Path) -> None:
    s = serve(config(tmp_path, certs), certs / "ca.crt")
    before = rss_kb(s.proc.pid)

    def chunks():  # 300 MB, sent as it is generated: the client never holds it either
        block = b"x" * (1 << 20)
        for _ in range(300):
            yield block
    with httpx.Client(verify=trusting(certs / "ca.crt"), timeout=30) as c:
        for headers in ({"Content-Length": str(300 << 20)}, {}):  # announced, then chunked
            try:
                r = c.post(f"{s.url}/v1/hosts", content=chunks(), headers=headers)
                assert r.status_code == 401, r.text
            except httpx.HTTPError:
                pass  # the server answered 401 and closed while the client was still sending
        # with a valid token, a chunked body is read only up to server.max_body_bytes
        r = c.post(f"{s.url}/v1/hosts", content=chunks(), headers={"Authorization": "Bearer ta"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "hyb.request.too_large"
    # an admin's (a rollout over a fleet) up to max_admin_body_bytes: 300 MB announced is
    # refused from the headers alone (sent by hand: the body never follows)
    head = announce(s.url, certs / "ca.crt", "/v1/rollouts", "adm", 300 << 20)
    assert head.startswith("HTTP/1.1 413 ") and "takes at most 67108864 (server.max_admin_body_bytes)" in head
    grew = rss_kb(s.proc.pid) - before
    assert grew < 8 * 1024, f"the server grew by {grew} kB"


def test_metrics_and_docs_need_a_token_unless_opened(serve, certs: Path, tmp_path: Path) -> None:
    ca = trusting(certs / "ca.crt")
    s = serve(config(tmp_path, certs), certs / "ca.crt")
    for path in ("/metrics", "/docs", "/openapi.json"):
        r = httpx.get(f"{s.url}{path}", verify=ca)
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer"), path
        assert httpx.get(f"{s.url}{path}", verify=ca, headers={"Authorization": "Bearer ta"}).status_code == 200
    assert httpx.get(f"{s.url}/healthz", verify=ca).status_code == 200
    (tmp_path / "open").mkdir()
    s2 = serve(config(tmp_path / "open", certs, open_endpoints=["/healthz", "/readyz", "/metrics"]),
               certs / "ca.crt")
    assert httpx.get(f"{s2.url}/metrics", verify=ca).status_code == 200
    assert httpx.get(f"{s2.url}/docs", verify=ca).status_code == 401
