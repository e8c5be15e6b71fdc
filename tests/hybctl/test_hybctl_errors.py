"""hybctl's error paths, no scheduler needed: bad config, token and CA files, bad option
values, stderr a pipe or a terminal. Each ends with exit 1 (an error) or 2 (a usage
error) and exactly one line on stderr, ``error: ...``; never a traceback
(tools/hybctl/README.md). Most run hybctl's ``main`` in this process, the fuzzed ones
too; what depends on stderr being a pipe or a terminal runs the installed command.
Requests go to a local port nobody listens on, so each is refused at once."""

from __future__ import annotations

import contextlib
import io
import os
import pty
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tools.dev.procs import REPO, free_port

from tools.hybctl.cli import main

BIN = str(REPO / ".venv/bin/hybctl")
DOWN = f"https://127.0.0.1:{free_port()}"  # nobody listens: connection refused
FUZZ = settings(max_examples=50, deadline=None, database=None, derandomize=True,
                suppress_health_check=list(HealthCheck))


@contextlib.contextmanager
def environ(**env: str) -> Iterator[None]:
    """os.environ without the caller's HYBCTL_* settings, with ``env``; restored after."""
    saved = dict(os.environ)
    for k in [k for k in os.environ if k.startswith("HYBCTL_") or k.startswith("_HYBCTL")]:
        del os.environ[k]
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run(*argv: str, **env: str) -> tuple[int, str, str]:
    """hybctl ARGV in this process with ``env``: (exit code, stdout, stderr)."""
    with environ(**env), contextlib.redirect_stdout(io.StringIO()) as o, \
            contextlib.redirect_stderr(io.StringIO()) as e:
        code = main(list(argv))
    return code, o.getvalue(), e.getvalue()


def one_error_line(code: int, err: str, codes: tuple[int, ...] = (1, 2)) -> str:
    """The README's promise: exit 1 or 2 and one line, ``error: ...``, and not the
    line of the last-resort handler (an exception hybctl did not expect is a bug)."""
    assert code in codes, (code, err)
    assert "Traceback" not in err, err
    assert err.endswith("\n") and err.count("\n") == 1 and err.startswith("error: "), repr(err)
    assert "a bug in hybctl" not in err, err
    return err


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    token = tmp_path / "t.token"
    token.write_text("a-token\n")
    notcert = tmp_path / "notcert.crt"
    notcert.write_text("this is not a certificate\n")
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(bytes(range(256)))
    number = tmp_path / "number.yaml"
    number.write_text(yaml.safe_dump({"current-context": "a", "contexts": {"a": {"server": 12345,
                                                                                "token-file": str(token)}}}))
    for p in (token, binary, number):
        p.chmod(0o600)
    (tmp_path / "adir").mkdir()
    return {"token": token, "notcert": notcert, "binary": binary, "number": number, "dir": tmp_path / "adir"}


# ---------------------------------------------------------------------- each defect


@pytest.mark.parametrize("case", ["ca-not-a-certificate", "binary-config", "server-a-number", "config-a-directory",
                                  "timeout-negative", "timeout-nan", "interval-inf"])
def test_bad_files_and_values_are_one_line(files, case) -> None:  # type: ignore[no-untyped-def]
    base = ["--server", DOWN, "--token-file", str(files["token"])]
    code, _, err = {
        "ca-not-a-certificate": lambda: run(*base, "--ca", str(files["notcert"]), "vm", "list"),
        "binary-config": lambda: run("vm", "list", HYBCTL_CONFIG=str(files["binary"])),
        "server-a-number": lambda: run("vm", "list", HYBCTL_CONFIG=str(files["number"])),
        "config-a-directory": lambda: run("vm", "list", HYBCTL_CONFIG=str(files["dir"])),
        "timeout-negative": lambda: run(*base, "--timeout", "-1", "vm", "list"),
        "timeout-nan": lambda: run(*base, "--timeout", "nan", "vm", "list"),
        "interval-inf": lambda: run(*base, "vm", "list", "--watch", "--interval", "inf"),
    }[case]()
    line = one_error_line(code, err)
    assert {"ca-not-a-certificate": "ca: ", "binary-config": "not UTF-8", "server-a-number": "contexts.a.server",
            "config-a-directory": "not a regular file", "timeout-negative": "--timeout",
            "timeout-nan": "--timeout", "interval-inf": "--interval"}[case] in line
    assert code == (2 if case.startswith(("timeout", "interval")) else 1)


def test_a_usage_error_is_one_line_too() -> None:
    code, _, err = run("fleet", "--bins", "many")
    assert "--bins" in one_error_line(code, err, (2,))
    code, _, err = run("vm", "list", "-o", "xml")
    assert "--output" in one_error_line(code, err, (2,))


@pytest.mark.parametrize("terminal", [False, True], ids=["pipe", "terminal"])
def test_an_error_is_one_line_whatever_stderr_is(files, terminal: bool) -> None:
    """rich wrapped errors at 80 columns when stderr was not a terminal (and at the
    terminal's width on one): a long VM id made it 2-4 lines."""
    vm = "v" * 150
    argv = [BIN, "--server", DOWN, "--token-file", str(files["token"]), "vm", "show", vm]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("HYBCTL_")}, "COLUMNS": "80",
           "HYBCTL_CONFIG": str(files["dir"] / "none.yaml")}
    if not terminal:
        r = subprocess.run(argv, env=env, text=True, capture_output=True, timeout=60)
        code, err = r.returncode, r.stderr
    else:
        leader, follower = pty.openpty()
        try:
            p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=follower)
            os.close(follower)
            got = b""
            while True:
                try:
                    chunk = os.read(leader, 4096)
                except OSError:  # EIO: the child closed its end
                    break
                if not chunk:
                    break
                got += chunk
            code = p.wait(timeout=60)
        finally:
            os.close(leader)
        err = got.decode().replace("\r\n", "\n")
    assert vm in one_error_line(code, err, (1,)) and "cannot connect" in err


def test_a_config_others_may_read_is_used_with_a_warning(files, tmp_path: Path) -> None:
    """As ssh does for its own files: readable by others, a warning; writable by others
    (who could send your token to their server), refused."""
    conf = tmp_path / "config.yaml"
    conf.write_text(yaml.safe_dump({"current-context": "a", "contexts": {"a": {"server": DOWN}}}))
    conf.chmod(0o644)
    code, out, err = run("config", "get-contexts", HYBCTL_CONFIG=str(conf))
    assert code == 0 and "a" in out.split()
    assert err.count("\n") == 1 and err.startswith("warning: ") and "0644" in err and "chmod 600" in err
    conf.chmod(0o600)
    assert run("config", "get-contexts", HYBCTL_CONFIG=str(conf))[2] == ""
    conf.chmod(0o664)
    code, _, err = run("config", "get-contexts", HYBCTL_CONFIG=str(conf))
    assert "writable by group or others (mode 0664)" in one_error_line(code, err, (1,))
    code, _, err = run("vm", "list", HYBCTL_CONFIG=str(conf))
    assert "writable by group or others" in one_error_line(code, err, (1,))


def test_the_help_names_every_variable() -> None:
    code, out, _ = run("--help", COLUMNS="200")
    assert code == 0
    for var in ("HYBCTL_CONTEXT", "HYBCTL_SERVER", "HYBCTL_TOKEN_FILE", "HYBCTL_CA", "HYBCTL_CONFIG"):
        assert var in out, var
    assert re.search(r"HYBCTL_TOKEN(?![_A-Z])", out), out  # the token itself, not only its file


def complete(words: str, **env: str) -> list[str]:
    """What bash completion offers for the command line ``words`` (the last one being
    typed)."""
    parts = words.split(" ")
    r = subprocess.run([BIN], env={**{k: v for k, v in os.environ.items() if not k.startswith("HYBCTL_")},
                                   "_HYBCTL_COMPLETE": "complete_bash", "COMP_WORDS": words,
                                   "COMP_CWORD": str(len(parts) - 1), **env},
                       text=True, capture_output=True, timeout=30)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r
    return r.stdout.split()


def test_completion_offers_group_values_and_contexts(tmp_path: Path) -> None:
    assert set(complete("hybctl fleet --by ")) == {"class", "rack", "state", "policy"}
    conf = tmp_path / "config.yaml"
    conf.write_text(yaml.safe_dump({"current-context": "lab", "contexts": {"lab": {"server": DOWN},
                                                                           "prod": {"server": DOWN}}}))
    conf.chmod(0o600)
    assert set(complete("hybctl --context ", HYBCTL_CONFIG=str(conf))) == {"lab", "prod"}
    assert complete("hybctl config use-context p", HYBCTL_CONFIG=str(conf)) == ["prod"]
    # no scheduler to ask: no hosts, and nothing else printed
    assert complete("hybctl host show ", HYBCTL_CONFIG=str(conf)) == []


# ---------------------------------------------------------------------- fuzzed

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20),
                    st.dates(), st.binary(max_size=8))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=6)
SERVERS = st.one_of(st.text(max_size=30), st.sampled_from(
    ["", "http://", "https://", "https://[::1", "http://127.0.0.1:99999", "https://:80", "http:///x", "ftp://x",
     "https://exa mple", DOWN, DOWN + "/v1", "http://127.0.0.1:" + DOWN.rsplit(":", 1)[1]]))


def config_documents(token: Path, ca: Path) -> st.SearchStrategy[bytes]:
    """Config files as an operator could get them wrong: random bytes, YAML of the wrong
    shape, settings of the wrong type, contexts pointing at bad token and CA files."""
    setting = st.one_of(VALUES, SERVERS, st.sampled_from([str(token), str(ca), "/nonexistent", "/", "~", "-"]))
    context = st.dictionaries(st.sampled_from(["server", "token-file", "ca", "servr", "token"]), setting, max_size=4)
    document = st.fixed_dictionaries({}, optional={
        "current-context": st.one_of(st.sampled_from(["a", "b", ""]), VALUES),
        "contexts": st.one_of(st.dictionaries(st.one_of(st.sampled_from(["a", "b"]), SCALARS), context, max_size=3),
                              VALUES)})
    as_yaml = st.one_of(document, VALUES).map(
        lambda d: yaml.dump(d, allow_unicode=True).encode())  # yaml.dump: dates, bytes, any type
    return st.one_of(st.binary(max_size=200), as_yaml, st.text(max_size=200).map(str.encode),
                     st.sampled_from([b"", b"\xff\xfe", b"[[[[[[[[", b"contexts: [", b"a: *b",
                                      b"!!python/name:os.system", b"contexts:\n  a:\n    server: 12345\n", b"\x00"]))


@FUZZ
@given(st.data())
def test_fuzz_config_files(tmp_path_factory, data) -> None:  # type: ignore[no-untyped-def]
    d = tmp_path_factory.mktemp("conf")
    token, ca = d / "t.token", d / "ca.crt"
    token.write_bytes(data.draw(st.sampled_from([b"tok\n", b"", b"\xff\xfe", b"two words", b"a\x1b[31m"])))
    ca.write_bytes(data.draw(st.sampled_from([b"", b"not a certificate", b"\x00" * 10])))
    kind = data.draw(st.sampled_from(["file", "directory", "missing"]), label="config")
    conf = d / "config.yaml"
    if kind == "file":
        conf.write_bytes(data.draw(config_documents(token, ca), label="content"))
        conf.chmod(0o600)
    elif kind == "directory":
        conf.mkdir()
    argv = data.draw(st.sampled_from([["vm", "list"], ["host", "list", "-o", "json"], ["config", "view"],
                                      ["config", "get-contexts"], ["config", "current-context"],
                                      ["config", "use-context", "a"], ["--context", "b", "vm", "show", "x"],
                                      ["config", "set-context", "b", "--server", DOWN]]), label="argv")
    code, _, err = run("--timeout", "2", *argv, HYBCTL_CONFIG=str(conf))
    if code != 0:
        one_error_line(code, err)
    else:
        assert argv[0] == "config" and "Traceback" not in err and err == "", err


def option_values(tmp: Path) -> st.SearchStrategy[list[str]]:
    """A command line with one bad (or odd) value: durations, formats, counts, times,
    and the paths of a request body, a token and a CA."""
    paths = st.one_of(st.sampled_from([str(tmp / n) for n in ("binary", "empty", "dir", "missing", "text", "deep",
                                                               "dates.yaml", "notcert")]),
                      st.text(min_size=1, max_size=20).filter(lambda s: "\x00" not in s and not s.startswith("-")))
    text = st.text(max_size=20).filter(lambda s: "\x00" not in s and not s.startswith("-"))
    numbers = st.one_of(text, st.sampled_from(["-1", "0", "nan", "inf", "-inf", "1e400", "1e-400", "0x10", " 1",
                                               "1" * 5000, "99999999999999999999"]))
    base = ["--server", DOWN, "--token-file", str(tmp / "t.token")]
    return st.one_of(
        st.tuples(st.sampled_from(["--timeout"]), numbers).map(lambda t: [*base, *t, "vm", "list"]),
        st.tuples(st.sampled_from(["--interval"]), numbers).map(lambda t: [*base, "host", "list", "-w", *t]),
        st.tuples(st.sampled_from(["--wait-timeout"]), numbers).map(
            lambda t: [*base, "vm", "create", "-f", str(tmp / "text"), *t]),
        st.tuples(st.sampled_from(["--bins", "--window", "--day", "--by", "-o"]), text).map(
            lambda t: [*base, "fleet", *t]),
        st.tuples(st.sampled_from(["--since", "--until", "--limit"]), numbers).map(lambda t: [*base, "audit", *t]),
        st.tuples(st.sampled_from(["--to", "--wait-timeout", "--interval", "-o"]), numbers).map(
            lambda t: [*base, "vm", "migrate", "x", "--wait", *t]),
        text.map(lambda v: [*base, "vm", "migrate", v, "--to", "h2"]),
        paths.map(lambda p: [*base, "vm", "create", "-f", p]),
        paths.map(lambda p: [*base, "why", "-f", p]),
        paths.map(lambda p: [*base, "vm", "io-limits", "x", "-f", p]),
        paths.map(lambda p: [*base, "api", "POST", "/v1/vms", "-d", "@" + p]),
        paths.map(lambda p: ["--server", DOWN, "--token-file", p, "vm", "list"]),
        paths.map(lambda p: [*base, "--ca", p, "vm", "list"]),
        st.lists(text, max_size=3).map(lambda s: [*base, "vm", "io-limits", "x", "--disk", "d",
                                                  *[a for v in s for a in ("--set", v)]]),
        st.tuples(text, text).map(lambda t: [*base, "api", *t]),
        text.map(lambda h: [*base, "api", "GET", "/v1/vms", "-H", h]),
        text.map(lambda d: [*base, "api", "POST", "/v1/vms", "-d", d]),
        text.map(lambda s: ["--server", s, "--token-file", str(tmp / "t.token"), "vm", "list"]),
    )


@pytest.fixture(scope="module")
def value_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("values")
    (d / "t.token").write_text("tok\n")
    (d / "binary").write_bytes(bytes(range(256)) * 4)
    (d / "empty").write_bytes(b"")
    (d / "dir").mkdir()
    (d / "text").write_text("name: web\nvcpus: 1\n")
    (d / "deep").write_text("[" * 5000)
    (d / "dates.yaml").write_text("name: web\nwhen: 2026-11-25\nblob: !!binary aGk=\n")
    (d / "notcert").write_text("-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n")
    return d


@settings(max_examples=100, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzz_option_values(value_files: Path, data) -> None:  # type: ignore[no-untyped-def]
    argv = data.draw(option_values(value_files), label="argv")
    code, _, err = run("--timeout", "2", *argv, HYBCTL_CONFIG=str(value_files / "none.yaml"))
    one_error_line(code, err)  # nothing listens at DOWN: a value that passes ends refused there
