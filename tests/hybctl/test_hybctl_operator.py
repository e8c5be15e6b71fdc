"""hybctl against a real `scheduler serve` (HTTPS, dev CA, SQLite) whose hosts were
registered and cordoned through the API with racks and reasons an operator's terminal
must show as text: rich markup, emoji codes, escape sequences (a rack is printable text,
api/bounds.py; a cordon's reason is any text). No hostd runs: what is checked
here is what hybctl prints of the API's answers, its watch loop through a pipe and
SIGTERM, the fleet's default grouping, a refused token and an unknown VM, and host-name
completion. (test_hybctl.py runs the simulated fleet; test_hybctl_errors.py the error
paths that need no scheduler.)"""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
from tools.dev.fleetsim import fleet_scheduler
from tools.dev.host_shapes import SHAPES, make_layout
from tools.dev.procs import REPO

from tools.hybctl.cli import main

ADMIN, HOST = "op-admin-token", "op-host-token"
BIN = str(REPO / ".venv/bin/hybctl")
MARKUP = "[bold]rk-z[/bold] [link=https://evil.example]x[/link]"  # the rack
OSC8 = "\x1b]8;;https://evil.example\x1b\\x\x1b]8;;\x1b\\"  # a hyperlink as escape codes
REASON = "[disks] none free :warning: [red]"


def host_body(name: str, rack: str) -> dict:
    layout, sib = make_layout(SHAPES[0])
    return {"name": name, "address": f"{name}:7443", "rack": rack, "layout": json.loads(layout.to_json()),
            "cpu_siblings": {str(k): list(v) for k, v in sib.items()}}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    w = tmp_path_factory.mktemp("hybctl-op")
    with fleet_scheduler(w, admin_token=ADMIN, host_token=HOST) as s:
        api = httpx.Client(base_url=s["sched"].url, verify=s["sched"].verify, timeout=30,
                           headers={"Authorization": f"Bearer {ADMIN}"})
        for name, rack in (("op-0", MARKUP), ("op-1", "r1"), ("op-2", "r2")):
            r = api.post("/v1/hosts", json=host_body(name, rack), headers={"Authorization": f"Bearer {HOST}"})
            assert r.status_code == 201, r.text
        for name, reason in (("op-1", OSC8), ("op-2", REASON)):
            r = api.post(f"/v1/hosts/{name}/cordon", json={"reason": reason})  # held by the admin token: ops
            assert r.status_code == 200, r.text
        token = w / "admin.token"
        token.write_text(ADMIN + "\n")
        yield {"url": s["sched"].url, "ca": s["certs"] / "ca.crt", "token": token, "api": api, "dir": w}
        api.close()


def run(env: dict, *argv: str, capsys, token: Path | None = None) -> tuple[int, str, str]:  # type: ignore[no-untyped-def]
    base = ["--server", env["url"], "--ca", str(env["ca"]), "--token-file", str(token or env["token"])]
    capsys.readouterr()
    code = main([*base, *argv])
    got = capsys.readouterr()
    return code, got.out, got.err


def cli_env(env: dict, **extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("HYBCTL_")}, "HYBCTL_SERVER": env["url"],
            "HYBCTL_CA": str(env["ca"]), "HYBCTL_TOKEN_FILE": str(env["token"]),
            "HYBCTL_CONFIG": str(env["dir"] / "none.yaml"), "COLUMNS": "200", **extra}


def test_api_text_is_printed_as_text(env, capsys) -> None:  # type: ignore[no-untyped-def]
    """Markup in a rack, a reason with brackets and an emoji code come out as they are;
    escape codes come out as escapes, not acted on."""
    code, out, _ = run(env, "host", "list", "-o", "wide", capsys=capsys)
    assert code == 0
    rows = {ln.split()[0]: ln for ln in out.splitlines() if ln.startswith("op-")}
    assert MARKUP in rows["op-0"], rows
    assert "\x1b" not in out and "\\x1b]8;;https://evil.example\\x1b\\x" in rows["op-1"], rows
    assert REASON in rows["op-2"], rows
    code, out, _ = run(env, "host", "show", "op-2", capsys=capsys)
    assert f"cordoned by ops: {REASON}" in out
    code, out, _ = run(env, "host", "show", "op-0", capsys=capsys)
    assert MARKUP in out


def test_api_text_on_a_terminal_opens_no_link(env) -> None:  # type: ignore[no-untyped-def]
    """On a terminal, hybctl's own words are styled (bold headers), the API's text is not
    read as markup: no hyperlink escape (OSC 8) reaches the terminal."""
    leader, follower = pty.openpty()
    try:
        p = subprocess.Popen([BIN, "host", "list", "-o", "wide"],
                             env=cli_env(env, TERM="xterm-256color", COLUMNS="400"), stdin=subprocess.DEVNULL,
                             stdout=follower, stderr=follower)
        os.close(follower)
        got = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:
                break
            if not chunk:
                break
            got += chunk
        assert p.wait(timeout=60) == 0, got
    finally:
        os.close(leader)
    text = got.decode()
    assert "\x1b[1m" in text  # the headers, bold: it is a terminal
    assert "\x1b]8;" not in text, text  # no link, neither from markup nor from the escape codes
    assert "[bold]rk-z[/bold]" in text and "[link=https://evil.example]" in text


def test_list_json_is_the_apis_answer_with_next(env, capsys) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = run(env, "host", "list", "-o", "json", capsys=capsys)
    want = env["api"].get("/v1/hosts").json()
    assert code == 0 and "next" in want and json.loads(out) == want
    code, out, _ = run(env, "vm", "list", "-o", "json", capsys=capsys)
    assert code == 0 and json.loads(out) == env["api"].get("/v1/vms").json()


def test_fleet_hours_window_without_by(env, capsys) -> None:  # type: ignore[no-untyped-def]
    """The README's `hybctl fleet --window 0-24`: the split by class exists for the peak
    window only, so hours are grouped by state unless --by says otherwise."""
    code, out, err = run(env, "fleet", "--window", "0-24", "-o", "json", capsys=capsys)
    assert code == 0, err
    assert json.loads(out)["group"] == "state" and json.loads(out)["window"] == "0-24"
    code, out, err = run(env, "fleet", "-o", "json", capsys=capsys)
    assert code == 0 and json.loads(out)["group"] == "class", err
    code, out, err = run(env, "fleet", "--window", "0-24", "--by", "rack", "-o", "json", capsys=capsys)
    assert code == 0 and json.loads(out)["group"] == "rack", err


def test_an_unknown_token_is_named_as_refused(env, capsys) -> None:  # type: ignore[no-untyped-def]
    """The scheduler answers an unknown token hyb.auth.missing, as for no header at all;
    hybctl, which always sends one, says which token was refused."""
    bad = env["dir"] / "bad.token"
    bad.write_text("nobody-knows-this\n")
    code, _, err = run(env, "vm", "list", capsys=capsys, token=bad)
    assert code == 1 and err.count("\n") == 1
    assert f"the token of --token-file {bad} was refused: unknown or revoked token" in err, err


def test_deleting_an_unknown_vm_names_the_delete(env, capsys) -> None:  # type: ignore[no-untyped-def]
    code, _, err = run(env, "vm", "delete", "no-such-vm", capsys=capsys)  # asks first: looks it up
    assert code == 1 and "GET" not in err and err.startswith("error: delete VM no-such-vm: hyb.vm.not_found"), err
    code, _, err = run(env, "vm", "delete", "no-such-vm", "--yes", capsys=capsys)
    assert code == 1 and err.startswith("error: scheduler DELETE /v1/vms/no-such-vm: hyb.vm.not_found"), err


def test_completion_offers_the_schedulers_hosts(env) -> None:  # type: ignore[no-untyped-def]
    def complete(words: str) -> list[str]:
        r = subprocess.run([BIN], env=cli_env(env, _HYBCTL_COMPLETE="complete_bash", COMP_WORDS=words,
                                              COMP_CWORD=str(len(words.split(" ")) - 1)),
                           text=True, capture_output=True, timeout=30)
        assert r.returncode == 0 and r.stderr == "", r
        return r.stdout.split()
    assert set(complete("hybctl host show ")) == {"op-0", "op-1", "op-2"}
    assert complete("hybctl host cordon op-2") == ["op-2"]
    assert set(complete("hybctl vm list --host op-")) == {"op-0", "op-1", "op-2"}


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_watch_through_a_pipe_prints_as_it_goes_and_ends_on_sigterm(env, fmt: str) -> None:  # type: ignore[no-untyped-def]
    """`hybctl host list --watch | cat`: each answer reaches the pipe when fetched, not
    at exit; SIGTERM ends the watch as Ctrl-C does, exit 0, what was printed kept."""
    p = subprocess.Popen(["env", "--default-signal=TERM", BIN, "host", "list", "--watch", "--interval", "0.3",
                          "-o", fmt], env=cli_env(env), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines: list[str] = []
    shown = threading.Event()

    def read() -> None:
        for line in p.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if "op-2" in line:
                shown.set()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert shown.wait(30), f"nothing through the pipe within 30 s: {''.join(lines)!r}"
        time.sleep(1)  # a few more looks
        os.kill(p.pid, signal.SIGTERM)
        p.wait(timeout=10)
        reader.join(10)
        err = p.stderr.read()  # type: ignore[union-attr]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    out = "".join(lines)
    assert p.returncode == 0 and err == "", (p.returncode, err)
    assert "\x1b" not in out  # piped: no cursor movement, no redraw
    if fmt == "table":
        assert out.splitlines()[0].split()[:2] == ["NAME", "RACK"]
    else:
        assert json.loads(out.split("\n}\n")[0] + "\n}")["items"][0]["name"] == "op-0"
