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
context. A token is read from a file (mode 0600 is the operator's business; hybctl
never writes a token into its config)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import yaml

FIELDS = ("server", "token-file", "ca")


class ConfigError(Exception):
    """The config file or a resolved setting is unusable; the message names which."""


def config_path() -> Path:
    if os.environ.get("HYBCTL_CONFIG"):
        return Path(os.environ["HYBCTL_CONFIG"])
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "hybctl" / "config.yaml"


def load(path: Path | None = None) -> dict:
    """The config as a dict with ``contexts`` (name -> fields) and ``current-context``;
    an empty one when the file does not exist."""
    path = path or config_path()
    if not path.exists():
        return {"current-context": "", "contexts": {}}
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not YAML: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("contexts", {}), dict):
        raise ConfigError(f"{path}: contexts: expected a mapping of name to settings")
    data.setdefault("contexts", {})
    data.setdefault("current-context", "")
    for name, ctx in data["contexts"].items():
        if not isinstance(ctx, dict):
            raise ConfigError(f"{path}: contexts.{name}: expected a mapping")
        unknown = set(ctx) - set(FIELDS)
        if unknown:
            raise ConfigError(f"{path}: contexts.{name}.{sorted(unknown)[0]}: unknown setting "
                              f"(known: {', '.join(FIELDS)})")
    return data


def save(data: dict, path: Path | None = None) -> Path:
    """Written to a new file and renamed over the old, so a crash leaves one or the other."""
    path = path or config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(data, sort_keys=True))
    os.chmod(tmp, 0o600)
    tmp.replace(path)
    return path


@dataclass(frozen=True)
class Target:
    """Where a command goes and with what: the resolved settings."""

    context: str
    server: str
    token: str
    ca: Path | None


def resolve(*, context: str | None = None, server: str | None = None, token_file: str | None = None,
            ca: str | None = None, path: Path | None = None) -> Target:
    """Flags (the arguments) over HYBCTL_* variables over the context's settings."""
    data = load(path)
    env = os.environ
    name = context or env.get("HYBCTL_CONTEXT") or data["current-context"] or ""
    ctx: dict = {}
    if name:
        if name not in data["contexts"]:
            known = ", ".join(sorted(data["contexts"])) or "none"
            raise ConfigError(f"context {name!r}: not in {path or config_path()} (known: {known})")
        ctx = data["contexts"][name]
    url = server or env.get("HYBCTL_SERVER") or ctx.get("server") or ""
    if not url:
        raise ConfigError("server: not set (give --server, HYBCTL_SERVER, or a context: "
                          "hybctl config set-context NAME --server URL --token-file FILE)")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"server: {url!r} is not an http:// or https:// URL")
    token = env.get("HYBCTL_TOKEN", "") if not token_file else ""
    tf = token_file or env.get("HYBCTL_TOKEN_FILE") or ("" if token else ctx.get("token-file", ""))
    if tf:
        p = Path(tf).expanduser()
        try:
            token = p.read_text().strip()
        except OSError as e:
            raise ConfigError(f"token-file: {p}: {e.strerror}") from None
        if not token:
            raise ConfigError(f"token-file: {p} is empty")
    if not token:
        raise ConfigError("token: not set (give --token-file, HYBCTL_TOKEN_FILE or HYBCTL_TOKEN, "
                          "or a context with a token-file)")
    ca_s = ca or env.get("HYBCTL_CA") or ctx.get("ca") or ""
    ca_p = Path(ca_s).expanduser() if ca_s else None
    if ca_p and not ca_p.is_file():
        raise ConfigError(f"ca: {ca_p} is not a file")
    return Target(context=name, server=url.rstrip("/"), token=token, ca=ca_p)
