"""hybctl's contexts: named schedulers (URL, token file, CA), like kubectl's kubeconfig.

The file is YAML in the user's config directory (``$HYBCTL_CONFIG``, else
``$XDG_CONFIG_HOME/hybctl/config.yaml``, else ``~/.config/hybctl/config.yaml``)::

    current-context: prod
    contexts:
      prod:
        server: https://sched.example:8443
        token-file: ~/.config/hybctl/prod.token
        ca: /etc/hyb/ca.crt

What a command uses is resolved field by field: its flags, then ``HYBCTL_*`` variables
(HYBCTL_CONTEXT, HYBCTL_SERVER, HYBCTL_TOKEN_FILE, HYBCTL_TOKEN, HYBCTL_CA), then the
context. A token is read from a file (hybctl never writes a token into its config).

The file decides where a token is sent, so, as ssh does for its own config, a file that
others may write is refused; one that others may read is used with a warning (hybctl
writes it 0600)."""

from __future__ import annotations

import os
import ssl
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

FIELDS = ("server", "token-file", "ca")


class ConfigError(Exception):
    """The config file or a resolved setting is unusable; the message names which."""


def config_path() -> Path:
    if os.environ.get("HYBCTL_CONFIG"):
        return Path(os.environ["HYBCTL_CONFIG"])
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "hybctl" / "config.yaml"


def quiet(message: str) -> None:
    """The default ``warn``: say nothing (shell completion must print nothing but words)."""


def check_mode(path: Path, st: os.stat_result, warn: Callable[[str], None]) -> None:
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022:
        raise ConfigError(f"{path}: writable by group or others (mode {mode:04o}): whoever can write it chooses "
                          f"where your token is sent; chmod 600 {path}")
    if mode & 0o044:
        warn(f"{path}: readable by group or others (mode {mode:04o}); hybctl writes it 0600: chmod 600 {path}")


def load(path: Path | None = None, warn: Callable[[str], None] = quiet) -> dict:
    """The config as a dict with ``contexts`` (name -> settings, each a string) and
    ``current-context``; an empty one when the file does not exist."""
    path = path or config_path()
    if path == Path(os.devnull):
        return {"current-context": "", "contexts": {}}
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{path}: not a regular file")
        check_mode(path, st, warn)
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {"current-context": "", "contexts": {}}
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    try:
        data = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError) as e:
        raise ConfigError(f"{path}: not YAML: {' '.join(str(e).split())}") from None
    return checked(path, {} if data is None else data)


def checked(path: Path, data: object) -> dict:
    """``data`` as read from ``path``, or ConfigError naming the first setting of the
    wrong kind."""
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping (current-context, contexts)")
    current = data.get("current-context")
    if current is not None and not isinstance(current, str):
        raise ConfigError(f"{path}: current-context: expected a context's name")
    contexts = data.get("contexts")
    if contexts is not None and not isinstance(contexts, dict):
        raise ConfigError(f"{path}: contexts: expected a mapping of name to settings")
    for name, ctx in (contexts or {}).items():
        if not isinstance(name, str):
            raise ConfigError(f"{path}: contexts: {name!r}: a context's name is a string")
        if not isinstance(ctx, dict):
            raise ConfigError(f"{path}: contexts.{name}: expected a mapping")
        for k, v in ctx.items():
            if k not in FIELDS:
                raise ConfigError(f"{path}: contexts.{name}.{k}: unknown setting (known: {', '.join(FIELDS)})")
            if not isinstance(v, str):
                raise ConfigError(f"{path}: contexts.{name}.{k}: expected a string, not {type(v).__name__}")
    data["contexts"] = contexts or {}
    data["current-context"] = current or ""
    return data


def save(data: dict, path: Path | None = None) -> Path:
    """Written to a new file and renamed over the old, so a crash leaves one or the other."""
    path = path or config_path()
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), 0o600)  # an old .tmp keeps its mode through O_CREAT
            f.write(yaml.safe_dump(data, sort_keys=True, allow_unicode=True))
        tmp.replace(path)
    except OSError as e:
        raise ConfigError(f"{e.filename or path}: {e.strerror or e}") from None
    return path


@dataclass(frozen=True)
class Target:
    """Where a command goes and with what: the resolved settings."""

    context: str
    server: str
    token: str
    ca: Path | None
    token_from: str  # where the token came from, for an operator told it was refused


def resolve(*, context: str | None = None, server: str | None = None, token_file: str | None = None,
            ca: str | None = None, path: Path | None = None, warn: Callable[[str], None] = quiet) -> Target:
    """Flags (the arguments) over HYBCTL_* variables over the context's settings."""
    data = load(path, warn)
    env = os.environ
    name = context or env.get("HYBCTL_CONTEXT") or data["current-context"] or ""
    ctx: dict = {}
    if name:
        if name not in data["contexts"]:
            known = ", ".join(sorted(data["contexts"])) or "none"
            raise ConfigError(f"context {name!r}: not in {path or config_path()} (known: {known})")
        ctx = data["contexts"][name]
    url = server_url(server or env.get("HYBCTL_SERVER") or ctx.get("server") or "")
    token, token_from = read_token(token_file, ctx, name)
    ca_s = ca or env.get("HYBCTL_CA") or ctx.get("ca") or ""
    ca_p = Path(ca_s).expanduser() if ca_s else None
    if ca_p:
        check_ca(ca_p)
    return Target(context=name, server=url, token=token, ca=ca_p, token_from=token_from)


def server_url(url: str) -> str:
    if not url:
        raise ConfigError("server: not set (give --server, HYBCTL_SERVER, or a context: "
                          "hybctl config set-context NAME --server URL --token-file FILE)")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"server: {url!r} is not an http:// or https:// URL")
    try:
        if not httpx.URL(url).host:
            raise ConfigError(f"server: {url!r} names no host")
    except httpx.InvalidURL as e:
        raise ConfigError(f"server: {url!r}: {e}") from None
    return url.rstrip("/")


def read_token(token_file: str | None, ctx: dict, name: str) -> tuple[str, str]:
    """The token and where it came from: --token-file, HYBCTL_TOKEN_FILE, HYBCTL_TOKEN,
    then the context's token-file."""
    env = os.environ
    if token_file:
        tf, where = token_file, "--token-file"
    elif env.get("HYBCTL_TOKEN_FILE"):
        tf, where = env["HYBCTL_TOKEN_FILE"], "HYBCTL_TOKEN_FILE"
    elif env.get("HYBCTL_TOKEN"):
        return header_safe(env["HYBCTL_TOKEN"].strip(), "HYBCTL_TOKEN"), "HYBCTL_TOKEN"
    elif ctx.get("token-file"):
        tf, where = ctx["token-file"], f"context {name}'s token-file"
    else:
        raise ConfigError("token: not set (give --token-file, HYBCTL_TOKEN_FILE or HYBCTL_TOKEN, "
                          "or a context with a token-file)")
    p = Path(tf).expanduser()
    try:
        token = p.read_text(encoding="utf-8").strip()
    except OSError as e:
        raise ConfigError(f"token-file: {p}: {e.strerror or e}") from None
    except (UnicodeDecodeError, ValueError):
        raise ConfigError(f"token-file: {p}: not a token (binary data)") from None
    if not token:
        raise ConfigError(f"token-file: {p} is empty")
    return header_safe(token, f"token-file: {p}"), f"{where} {p}"


def header_safe(token: str, where: str) -> str:
    """A bearer token is visible ASCII (RFC 6750's b64token, and then some): anything
    else could not go in a header, or would split it."""
    if not token or not all(33 <= ord(c) < 127 for c in token):
        raise ConfigError(f"{where}: not a token (a bearer token is one word of printable ASCII)")
    return token


def check_ca(p: Path) -> None:
    """A CA file that ``ssl`` loads: a PEM certificate, readable."""
    if not p.is_file():
        raise ConfigError(f"ca: {p} is not a file")
    try:
        ssl.create_default_context(cafile=str(p))
    except ssl.SSLError as e:
        raise ConfigError(f"ca: {p}: not a PEM certificate ({e.reason or e})") from None
    except OSError as e:
        raise ConfigError(f"ca: {p}: {e.strerror or e}") from None
