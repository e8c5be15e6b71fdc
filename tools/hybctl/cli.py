"""hybctl: the scheduler's REST API from a terminal (tools/hybctl/README.md).

Exit codes: 0 done, 1 an error (refused, not found, unreachable, a bad config), 2 a
usage error. Every error is one line on stderr (``error: ...``), naming the field at
fault when the API names one; never a traceback, whatever the file, value or terminal."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import os
import re
import signal
import ssl
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import httpx
import typer
import yaml
from rich.console import Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from api.rest import ApiError, ApiUnreachable, RestClient
from api.states import DrainAction, HostState, MigrationResult, VmStatus
from tools.hybctl import config as cfg
from tools.hybctl import histogram
from tools.hybctl.output import (Column, Format, age, cell, console, disks, dump, grid, move_end, move_progress, pages,
                                 printer, table, titled, vfs, visible, visible_data, when)

# piped into grep or awk, a table keeps one line per row (rich would wrap at 80 columns)
out = console()

app = typer.Typer(no_args_is_help=True, add_completion=True, pretty_exceptions_enable=False,
                  rich_markup_mode="markdown",
                  help="The hybrid-KVM scheduler's REST API from a terminal: VMs, hosts, the fleet's "
                       "utilisation, rollouts, the audit log.\n\n"
                       "Each setting: its flag, else HYBCTL_CONTEXT, HYBCTL_SERVER, HYBCTL_TOKEN_FILE or "
                       "HYBCTL_TOKEN (the token itself), HYBCTL_CA, else the context's "
                       "(contexts are kept in HYBCTL_CONFIG, else ~/.config/hybctl/config.yaml).",
                  context_settings={"help_option_names": ["-h", "--help"]})
vm_app = typer.Typer(no_args_is_help=True, help="VMs: create, list, show, delete, change IO limits, move live.")
host_app = typer.Typer(no_args_is_help=True, help="Hosts: list, show, cordon, uncordon, drain.")
rollout_app = typer.Typer(no_args_is_help=True, help="Rollouts kept by the scheduler (fleet-rollout runs them).")
config_app = typer.Typer(no_args_is_help=True, help="Contexts: named schedulers with their token and CA.")
app.add_typer(vm_app, name="vm")
app.add_typer(host_app, name="host")
app.add_typer(rollout_app, name="rollout")
app.add_typer(config_app, name="config")


class Fail(Exception):
    """A one-line error hybctl prints before exiting 1."""


def say(kind: str, message: str) -> None:
    """``kind: message`` as one line on stderr, whatever its length or the terminal's
    width (a terminal wraps a long line, hybctl never does), with the API's control
    characters shown, not acted on."""
    sys.stderr.write(f"{kind}: {visible(' '.join(str(message).split()))}\n")
    sys.stderr.flush()


def warn(message: str) -> None:
    say("warning", message)


def seconds(least: float, *, above: bool = False) -> Callable[[Any], float]:
    """A parser of a duration in seconds: a finite number from ``least`` up to a week;
    -1, nan and inf are usage errors here, not a socket's ValueError later."""
    def parse(value: Any) -> float:
        try:
            v = float(value)
        except (TypeError, ValueError):
            raise typer.BadParameter(f"{value!r} is not a number of seconds") from None
        if not (math.isfinite(v) and (v > least if above else v >= least) and v <= 7 * 86400):
            bound = f"above {least:g}" if above else f"at least {least:g}"
            raise typer.BadParameter(f"{value!r}: seconds {bound} and at most a week (604800)")
        return v
    return parse


# ---------------------------------------------------------------------- connection


class Client(RestClient):
    """The REST client, which knows where its token came from: a token the scheduler
    does not know is named by its file when refused."""

    def __init__(self, target: cfg.Target, timeout: float):
        self.token_from = target.token_from
        try:
            super().__init__(target.server, target.token, ca=target.ca, timeout_s=timeout)
        except (ssl.SSLError, OSError) as e:
            raise cfg.ConfigError(f"ca: {target.ca}: {getattr(e, 'reason', None) or e}") from None
        except httpx.InvalidURL as e:
            raise cfg.ConfigError(f"server: {target.server!r}: {e}") from None

    def request(self, method: str, path: str, **kw: Any) -> Any:
        try:
            return super().request(method, path, **kw)
        except ApiError as e:
            if e.status == 401:
                raise Fail(f"scheduler {method} {path}: the token of {self.token_from} was refused: {e.reason} "
                           f"({e.code or e.status})") from None
            raise

    def send(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            return super().send(method, path, **kw)
        except (httpx.InvalidURL, UnicodeError) as e:
            raise Fail(f"{method} {path}: not a request httpx can send: {e}") from None

    def all_pages(self, path: str, params: dict[str, Any]) -> dict:
        """Every page of a paged list as one answer: the last page's, with every item
        (its ``next``, null, included), what ``GET path`` without ``limit`` answers."""
        items: list[Any] = []
        after = ""
        while True:
            page = self.request("GET", path, params={**params, "limit": 500, **({"after": after} if after else {})})
            items += page["items"]
            after = page.get("next") or ""
            if not after:
                return {**page, "items": items}


class Conn:
    """The global options, resolved into a client the first time a command needs one."""

    def __init__(self, context: str | None, server: str | None, token_file: str | None, ca: str | None,
                 timeout: float):
        self.opts = dict(context=context, server=server, token_file=token_file, ca=ca)
        self.timeout = timeout
        self._client: Client | None = None

    @property
    def api(self) -> Client:
        if self._client is None:
            self._client = Client(cfg.resolve(**self.opts, warn=warn), self.timeout)
        return self._client

    def close(self) -> None:
        if self._client:
            self._client.close()


def conn(ctx: typer.Context) -> Client:
    return ctx.find_root().obj.api


# ---------------------------------------------------------------------- completion
# A completer prints nothing but words and never fails: the shell shows whatever it
# prints, so any trouble (no server, a bad config) is no words at all.


def complete_context(incomplete: str) -> list[str]:
    try:
        names = cfg.load()["contexts"]
    except Exception:  # noqa: BLE001 - see above
        return []
    return sorted(n for n in names if n.startswith(incomplete))


def complete_host(ctx: typer.Context, incomplete: str) -> list[str]:
    """The hosts of the scheduler the command line names (flags, HYBCTL_*, context)."""
    p = ctx.find_root().params
    try:
        t = cfg.resolve(context=p.get("context"), server=p.get("server"), token_file=p.get("token_file"),
                        ca=p.get("ca"))
        with Client(t, 3.0) as api:
            names = [h["name"] for h in api.all_pages("/v1/hosts", {})["items"]]
    except Exception:  # noqa: BLE001 - see above
        return []
    return [n for n in names if n.startswith(incomplete)]


@app.callback()
def root(ctx: typer.Context,
         context: Annotated[Optional[str], typer.Option("--context", help="a context of the config file",
                                                        envvar="HYBCTL_CONTEXT", show_envvar=True,
                                                        autocompletion=complete_context)] = None,
         server: Annotated[Optional[str], typer.Option("--server", "-s", help="the scheduler's URL",
                                                       envvar="HYBCTL_SERVER", show_envvar=True)] = None,
         token_file: Annotated[Optional[str], typer.Option("--token-file", help="a file holding a bearer token "
                                                                                "(or HYBCTL_TOKEN: the token itself)",
                                                           envvar="HYBCTL_TOKEN_FILE", show_envvar=True)] = None,
         ca: Annotated[Optional[str], typer.Option("--ca", help="the CA the scheduler's certificate is checked "
                                                                "against (default: the system's)",
                                                   envvar="HYBCTL_CA", show_envvar=True)] = None,
         timeout: Annotated[float, typer.Option("--timeout", help="seconds to wait for an answer",
                                                parser=seconds(0, above=True))] = 15.0) -> None:
    if getattr(ctx.get_parameter_source("token_file"), "name", "") == "ENVIRONMENT":
        token_file = None  # resolve() reads HYBCTL_TOKEN_FILE itself, and names it when the token is refused
    ctx.obj = Conn(context, server, token_file, ca, timeout)
    ctx.call_on_close(ctx.obj.close)


OutputOpt = Annotated[Format, typer.Option("--output", "-o", help="table, wide, json or yaml")]
WatchOpt = Annotated[bool, typer.Option("--watch", "-w", help="show it again every --interval seconds (Ctrl-C ends)")]
IntervalOpt = Annotated[float, typer.Option("--interval", help="seconds between two looks with --watch",
                                            parser=seconds(0.2))]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="do not ask for confirmation")]
HostArg = Annotated[str, typer.Argument(help="the host's name", autocompletion=complete_host)]


@contextlib.contextmanager
def term_is_interrupt() -> Iterator[None]:
    """SIGTERM ends a watch as Ctrl-C does: what was drawn stays, the exit is clean (a
    supervisor's or ``timeout``'s stop is not a crash)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@contextlib.contextmanager
def frames(fmt: Format) -> Iterator[Callable[[Any, Callable[[Any], RenderableType]], None]]:
    """Where --watch and --wait draw each answer: a table on a terminal is redrawn in
    place; anything else (json, yaml, a table piped on) is printed again each time the
    answer changes and flushed, tables separated by a blank line, yaml documents by
    ``---``, so ``| cat`` or a log file sees each as it comes."""
    show = printer(out, fmt)
    if fmt in (Format.table, Format.wide) and out.is_terminal:
        with Live(console=out, auto_refresh=False, transient=False) as live:
            yield lambda data, render: live.update(render(visible_data(data)), refresh=True)
        return
    last: list[Any] = []

    def draw(data: Any, render: Callable[[Any], RenderableType]) -> None:
        if last and data == last[0]:
            return
        if last and fmt in (Format.table, Format.wide):
            out.print()
        show(data, render)
        if fmt is Format.yaml:
            out.print("---")
        out.file.flush()
        last[:] = [data]
    yield draw


def shown(fetch: Callable[[], Any], render: Callable[[Any], RenderableType], fmt: Format, watch: bool,
          interval: float) -> None:
    """Fetch and print once, or again and again with --watch until Ctrl-C or SIGTERM,
    which end it with exit 0."""
    data = fetch()
    if not watch:
        printer(out, fmt)(data, render)
        return
    with term_is_interrupt(), contextlib.suppress(KeyboardInterrupt), frames(fmt) as draw:
        while True:
            draw(data, render)
            time.sleep(interval)
            data = fetch()


def confirm(what: str, yes: bool) -> None:
    if yes:
        return
    if not sys.stdin.isatty():
        raise Fail(f"{what}: refused without --yes (no terminal to ask on)")
    if not typer.confirm(f"{visible(what)}?", default=False):
        raise Fail(f"{what}: not confirmed")


def read_body(path: str, flag: str = "--filename") -> Any:
    """A JSON or YAML document from ``path`` ("-": standard input), as the JSON it will
    be sent as: YAML's dates become ISO strings (as kubectl's YAML does); a value JSON
    has no form for is refused here, not by the encoder mid-request."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise Fail(f"{flag}: {path}: {e.strerror or e}") from None
    except (UnicodeDecodeError, ValueError):
        raise Fail(f"{flag}: {path}: not UTF-8 text") from None
    try:
        doc = yaml.safe_load(text)  # YAML 1.1 reads JSON too
    except (yaml.YAMLError, RecursionError) as e:
        raise Fail(f"{flag}: {path}: neither JSON nor YAML: {e}") from None

    def iso(v: Any) -> str:
        if isinstance(v, (dt.date, dt.datetime)):
            return v.isoformat()
        raise TypeError(f"a {type(v).__name__} ({str(v)[:40]}) has no JSON form")
    try:
        return json.loads(json.dumps(doc, default=iso))
    except (TypeError, ValueError, RecursionError) as e:
        raise Fail(f"{flag}: {path}: {e}") from None


# ---------------------------------------------------------------------- VMs

VM_COLUMNS = [
    Column("ID", lambda v: v["id"]),
    Column("NAME", lambda v: v["name"]),
    Column("TENANT", lambda v: v["tenant"]),
    Column("STATUS", lambda v: v["status"]),
    Column("HOST", lambda v: v["host"]),
    Column("VCPUS", lambda v: v["request"].get("vcpus"), wide_only=True),
    Column("MEMORY", lambda v: f"{v['request'].get('memory_mib', 0)} MiB", wide_only=True),
    Column("CPUS", lambda v: (v.get("placement") or {}).get("cpus"), wide_only=True),
    Column("REASON", lambda v: v.get("reason"), wide_only=True),
    Column("AGE", lambda v: age(v["created"])),
]


@vm_app.command("list")
def vm_list(ctx: typer.Context, output: OutputOpt = Format.table,
            tenant: Annotated[Optional[str], typer.Option(help="only this tenant's (admin)")] = None,
            host: Annotated[Optional[str], typer.Option(help="only VMs on this host",
                                                        autocompletion=complete_host)] = None,
            status: Annotated[Optional[VmStatus], typer.Option(help="only VMs in this status")] = None,
            name: Annotated[Optional[str], typer.Option(help="only VMs of this name")] = None,
            watch: WatchOpt = False, interval: IntervalOpt = 2.0) -> None:
    """The VMs you may see (a tenant token: its own), every page of them."""
    api = conn(ctx)
    params = {k: v for k, v in dict(tenant=tenant, host=host, status=status, name=name).items() if v}

    shown(lambda: api.all_pages("/v1/vms", params), lambda d: table(d["items"], VM_COLUMNS, output), output, watch,
          interval)


def vm_detail(v: dict) -> RenderableType:
    t = Table(box=None, show_header=False, pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    req, pl = v["request"], v.get("placement") or {}
    for k, val in (("id", v["id"]), ("name", v["name"]), ("tenant", v["tenant"]), ("status", v["status"]),
                   ("reason", v.get("reason")), ("host", v["host"]), ("hostd vm", v.get("hostd_vm_id")),
                   ("replaces", v.get("replaces")), ("vcpus", req.get("vcpus")),
                   ("memory", f"{req.get('memory_mib')} MiB, {req.get('page_size_kb', 2048)} KiB pages"),
                   ("image", req.get("image")), ("on maintenance", req.get("on_maintenance", "block")),
                   ("placement nodes", pl.get("nodes")), ("placement cpus", pl.get("cpus")),
                   ("hugepages", pages(pl.get("hugepages") or [])), ("vfs", vfs(pl.get("vfs") or [])),
                   ("disks", disks(pl.get("disks") or [])),
                   ("attempts", v.get("attempts")), ("created", when(v["created"])),
                   ("updated", when(v["updated"]))):
        t.add_row(k, cell(val))
    if v.get("migration"):
        t.add_row("moving live", move_progress(v["migration"]))
    if v.get("last_migration"):
        t.add_row("last move", move_end(v["last_migration"]))
    for d in req.get("disks") or []:
        t.add_row(f"disk {d.get('name', '')}", cell(d.get("iotune")))
    return t


@vm_app.command("show")
def vm_show(ctx: typer.Context, vm_id: Annotated[str, typer.Argument(help="the VM's id")],
            output: OutputOpt = Format.table, watch: WatchOpt = False, interval: IntervalOpt = 2.0) -> None:
    """One VM: its request, placement and status."""
    api = conn(ctx)
    shown(lambda: api.request("GET", f"/v1/vms/{vm_id}"), vm_detail, output, watch, interval)


@vm_app.command("create")
def vm_create(ctx: typer.Context,
              filename: Annotated[str, typer.Option("--filename", "-f", help="the VM request, JSON or YAML "
                                                                               "(- for standard input)")],
              idempotency_key: Annotated[Optional[str], typer.Option(
                  help="retrying with the same key returns the same VM (default: a new one, printed)")] = None,
              dry_run: Annotated[bool, typer.Option("--dry-run", help="where it would go; nothing is "
                                                                      "created (as `hybctl why`)")] = False,
              wait: Annotated[bool, typer.Option("--wait", help="wait until it runs or fails")] = False,
              wait_timeout: Annotated[float, typer.Option(help="seconds --wait waits", parser=seconds(0))] = 300.0,
              output: OutputOpt = Format.table) -> None:
    """Ask for a VM (POST /v1/vms); the answer is accepted, the VM is created after."""
    body = read_body(filename)
    if dry_run:
        return why_show(conn(ctx), body, output)
    key = idempotency_key or str(uuid.uuid4())
    api = conn(ctx)
    v = api.request("POST", "/v1/vms", json=body, headers={"Idempotency-Key": key})
    if not idempotency_key and output in (Format.table, Format.wide):
        say("Idempotency-Key", f"{key} (give it again with --idempotency-key to retry safely)")
    if wait:
        v = wait_running(api, v, wait_timeout, output)
    printer(out, output)(v, vm_detail)


def wait_running(api: Client, v: dict, timeout: float, output: Format) -> dict:
    """The VM once it left ``pending`` and ``creating`` (--wait); Fail, the VM shown,
    unless it runs."""
    deadline = time.monotonic() + timeout
    while v["status"] in (VmStatus.PENDING, VmStatus.CREATING) and time.monotonic() < deadline:
        time.sleep(0.5)
        v = api.request("GET", f"/v1/vms/{v['id']}")
    if v["status"] != VmStatus.RUNNING:
        printer(out, output)(v, vm_detail)
        raise Fail(f"VM {v['id']}: {v['status']}" + (f": {v['reason']}" if v.get("reason") else
                                                    " after --wait-timeout"))
    return v


@vm_app.command("start")
def vm_start(ctx: typer.Context, vm_id: Annotated[str, typer.Argument(help="the VM's id")],
             wait: Annotated[bool, typer.Option("--wait", help="wait until it runs or fails")] = False,
             wait_timeout: Annotated[float, typer.Option(help="seconds --wait waits", parser=seconds(0))] = 300.0,
             output: OutputOpt = Format.table) -> None:
    """Start a stopped VM again (one a drain stopped: on_maintenance = stop), placed from
    its own request on a host that fits it now (POST /v1/vms/{id}/start). A VM on its way
    to running, or running, is shown as it is."""
    api = conn(ctx)
    v = api.request("POST", f"/v1/vms/{vm_id}/start")
    if wait:
        v = wait_running(api, v, wait_timeout, output)
    printer(out, output)(v, vm_detail)


@vm_app.command("delete")
def vm_delete(ctx: typer.Context, vm_ids: Annotated[list[str], typer.Argument(help="the VMs' ids")],
              yes: YesOpt = False) -> None:
    """Delete VMs: hostd destroys the domain, the scheduler frees what it held."""
    api = conn(ctx)
    for vm_id in vm_ids:
        if not yes:
            try:  # what is about to go, for the question; an unknown id fails before it is asked
                v = api.request("GET", f"/v1/vms/{vm_id}")
            except ApiError as e:
                if e.status != 404:
                    raise
                raise Fail(f"delete VM {vm_id}: {e.code or e.status}{f' [{e.field}]' if e.field else ''}: {e.reason} "
                           "(nothing deleted)") from None
            confirm(f"delete VM {vm_id} ({v['name']}, {v['status']} on {v['host'] or 'no host'})", yes)
        api.request("DELETE", f"/v1/vms/{vm_id}")
        out.print(f"VM {visible(vm_id)} deleting")


def parse_settings(pairs: list[str], flag: str) -> dict[str, int]:
    got: dict[str, int] = {}
    for p in pairs:
        k, sep, v = p.partition("=")
        if not sep or not k:
            raise typer.BadParameter(f"{p!r}: expected KEY=VALUE", param_hint=flag)
        try:
            got[k.strip()] = int(v)
        except ValueError:
            raise typer.BadParameter(f"{p!r}: {k} must be a whole number", param_hint=flag) from None
    return got


@vm_app.command("io-limits")
def vm_io_limits(ctx: typer.Context, vm_id: Annotated[str, typer.Argument(help="the VM's id")],
                 disk: Annotated[Optional[str], typer.Option(help="the disk to change (its name in the request)")]
                 = None,
                 set_: Annotated[list[str], typer.Option("--set", help="an iotune field of the disk, KEY=VALUE "
                                                                        "(total_iops_sec=500; repeat)")] = [],  # noqa: B006
                 vf: Annotated[Optional[int], typer.Option(help="the VF index to change")] = None,
                 max_tx_mbps: Annotated[Optional[int], typer.Option(help="the VF's tx ceiling")] = None,
                 min_tx_mbps: Annotated[Optional[int], typer.Option(help="the VF's tx floor")] = None,
                 filename: Annotated[Optional[str], typer.Option("--filename", "-f", help="the whole change "
                                                                 "(PATCH body), JSON or YAML")] = None,
                 output: OutputOpt = Format.table) -> None:
    """Change a running VM's disk throttles or VF rates in place (PATCH .../io-limits)."""
    if filename:
        body = read_body(filename)
    else:
        body = {}
        if disk:
            body["disks"] = [{"disk": disk, "iotune": parse_settings(set_, "--set")}]
        elif set_:
            raise typer.BadParameter("needs --disk", param_hint="--set")
        if vf is not None:
            if max_tx_mbps is None:
                raise typer.BadParameter("needs --max-tx-mbps", param_hint="--vf")
            body["vfs"] = [{"vf": vf, "max_tx_rate_mbps": max_tx_mbps,
                            **({"min_tx_rate_mbps": min_tx_mbps} if min_tx_mbps is not None else {})}]
        if not body:
            raise typer.BadParameter("give --disk with --set, --vf with --max-tx-mbps, or -f", param_hint="VM_ID")
    v = conn(ctx).request("PATCH", f"/v1/vms/{vm_id}/io-limits", json=body)
    printer(out, output)(v, vm_detail)


@vm_app.command("migrate")
def vm_migrate(ctx: typer.Context, vm_id: Annotated[str, typer.Argument(help="the VM's id")],
               to: Annotated[Optional[str], typer.Option("--to", help="the host to move it to (default: placement "
                                                                      "picks, with the VM's own request)",
                                                         autocompletion=complete_host)] = None,
               wait: Annotated[bool, typer.Option("--wait", help="follow the move until it ends; exit 1 with its "
                                                                 "reason if it fails")] = False,
               wait_timeout: Annotated[float, typer.Option(help="seconds --wait waits", parser=seconds(0))] = 1800.0,
               output: OutputOpt = Format.table,
               interval: Annotated[float, typer.Option("--interval", help="seconds between two looks with --wait",
                                                       parser=seconds(0.2))] = 1.0) -> None:
    """Move a running VM live to another host (POST /v1/vms/{id}/migrate; an admin's
    act): same boot, memory and raw disks copied; it runs where it is until it runs
    on the target. A move under way is followed, not started again."""
    if to is not None and not to.strip():
        raise typer.BadParameter("an empty host name: give a host, or leave --to out", param_hint="--to")
    api = conn(ctx)
    v = api.request("POST", f"/v1/vms/{vm_id}/migrate", json={"target_host": to} if to is not None else {})
    m = v.get("migration") or {}
    if not wait:
        if output in (Format.json, Format.yaml):
            printer(out, output)(v, vm_detail)
        else:
            out.print(f"VM {visible(str(v.get('id', vm_id)))} moving live: {visible(move_progress(m))}")
        return
    started = m.get("started")
    deadline = time.monotonic() + wait_timeout
    if output in (Format.json, Format.yaml):  # the VM once the move ended
        while v.get("migration") and time.monotonic() < deadline:
            time.sleep(interval)
            v = api.request("GET", f"/v1/vms/{vm_id}")
        printer(out, output)(v, vm_detail)
    else:
        with term_is_interrupt(), frames(output) as draw:
            while v.get("migration") and time.monotonic() < deadline:
                draw(v, migrate_render)
                time.sleep(interval)
                v = api.request("GET", f"/v1/vms/{vm_id}")
            draw(v, migrate_render)
    if v.get("migration"):
        raise Fail(f"VM {vm_id}: still moving after --wait-timeout ({move_progress(v['migration'])})")
    last = v.get("last_migration") or {}
    if started and last.get("started") != started:
        raise Fail(f"VM {vm_id}: the move ended, but the VM records another ({move_end(last)}); it runs on "
                   f"{v.get('host') or 'no host'}")
    if last.get("result") != MigrationResult.DONE:
        raise Fail(f"VM {vm_id}: the move to {last.get('to_host') or m.get('target_host') or '?'} failed: "
                   f"{last.get('reason') or v.get('reason') or 'no reason recorded'}; it runs on "
                   f"{v.get('host') or 'no host'}")


def migrate_render(v: dict) -> RenderableType:
    """One line while a move runs, its end once over."""
    if v.get("migration"):
        return Text(f"VM {v['id']} on {v.get('host')}: moving live {move_progress(v['migration'])}")
    return Text(f"VM {v['id']} on {v.get('host')}: " + move_end(v.get("last_migration")))


# ---------------------------------------------------------------------- why


def why_render(p: dict) -> RenderableType:
    head = (f"fits: {p['host']} (of {p['examined']} hosts examined)" if p["fits"] else
            f"fits nowhere: {p['examined']} hosts examined")
    t = grid("REJECTED FOR", "HOSTS")
    for res, n in sorted(p["rejections"].items(), key=lambda kv: -kv[1]):
        t.add_row(res, str(n))
    parts: list = [titled(head, t), ""]
    if p["candidates"]:
        best = grid("HOST", "NODES", "CPUS", "HUGEPAGES")
        for c in p["candidates"]:
            best.add_row(c["host"], cell(c["placement"]["nodes"]), cell(c["placement"]["cpus"]),
                         cell([f"{h.get('count', '')}x{h.get('size_kb', '')}K@{h.get('node', '')}"
                               for h in c["placement"]["hugepages"]]))
        parts += [titled("best hosts", best), ""]
    if p["rejected_hosts"]:
        rej = grid("HOST", "RESOURCE", "REASON")
        for r in p["rejected_hosts"][:20]:
            rej.add_row(r["host"], r["resource"], r["reason"])
        shown_n = min(20, len(p["rejected_hosts"]))
        parts.append(titled(f"rejected hosts ({shown_n} shown; -o json for the first 100)", rej))
    return Group(*parts)


def why_show(api: RestClient, body: Any, output: Format) -> None:
    p = api.request("POST", "/v1/vms", params={"dry_run": "true"}, json=body,
                    headers={"Idempotency-Key": f"hybctl-why-{uuid.uuid4()}"})
    printer(out, output)(p, why_render)


@app.command("why")
def why(ctx: typer.Context,
        filename: Annotated[str, typer.Option("--filename", "-f", help="the VM request, JSON or YAML (- for "
                                                                         "standard input)")],
        output: OutputOpt = Format.table) -> None:
    """Where a VM request would go, and why the other hosts would not take it (a dry
    run: nothing is claimed or created)."""
    why_show(conn(ctx), read_body(filename), output)


# ---------------------------------------------------------------------- hosts


def free_cpus(h: dict) -> int:
    return sum(n["free_cpus"] for n in h["nodes"])


HOST_COLUMNS = [
    Column("NAME", lambda h: h["name"]),
    Column("RACK", lambda h: h["rack"]),
    Column("STATE", lambda h: h["state"]),
    Column("ADMIN", lambda h: h["admin_state"] + (f" ({h['admin_owner']})" if h.get("admin_owner") else "")),
    Column("VMS", lambda h: h["vms"]),
    Column("FREE CPUS", free_cpus),
    Column("POLICY", lambda h: (h.get("carved_policy") or "")[:12], wide_only=True),
    Column("VERSION", lambda h: h.get("hostd_version"), wide_only=True),
    Column("ADDRESS", lambda h: h["address"], wide_only=True),
    Column("REASON", lambda h: h.get("admin_reason"), wide_only=True),
    Column("HEARTBEAT", lambda h: age(h["last_heartbeat"])),
]


@host_app.command("list")
def host_list(ctx: typer.Context, output: OutputOpt = Format.table,
              rack: Annotated[Optional[str], typer.Option(help="only this rack's")] = None,
              state: Annotated[Optional[HostState], typer.Option(help="only hosts in this state")] = None,
              watch: WatchOpt = False, interval: IntervalOpt = 2.0) -> None:
    """The registered hosts (admin), every page of them."""
    api = conn(ctx)
    params = {k: v for k, v in dict(rack=rack, state=state).items() if v}
    shown(lambda: api.all_pages("/v1/hosts", params), lambda d: table(d["items"], HOST_COLUMNS, output), output,
          watch, interval)


def host_detail(h: dict) -> RenderableType:
    t = Table(box=None, show_header=False, pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    for k, val in (("name", h["name"]), ("address", h["address"]), ("rack", h["rack"]), ("labels", h["labels"]),
                   ("state", h["state"]), ("down since", when(h.get("down_since"))),
                   ("admin", f"{h['admin_state']}" + (f" by {h['admin_owner']}" if h.get("admin_owner") else "")
                    + (f": {h['admin_reason']}" if h.get("admin_reason") else "")),
                   ("carved policy", h.get("carved_policy")), ("hostd", h.get("hostd_version")),
                   ("generation", h["generation"]), ("last heartbeat", f"{when(h['last_heartbeat'])} "
                                                                       f"({age(h['last_heartbeat'])} ago)"),
                   ("metrics", h.get("metrics_url")), ("VMs", h["vms"])):
        t.add_row(k, cell(val))
    nodes = grid("NODE", "VM CPUS", "USED", "FREE", "HUGEPAGES (free/total)")
    for n in h["nodes"]:
        pages = ", ".join(f"{p.get('size_kb')}K {p.get('free')}/{p.get('total')}" for p in n.get("hugepages") or [])
        nodes.add_row(str(n["node"]), cell(n.get("vm_cpus")), cell(n.get("used_cpus")), cell(n.get("free_cpus")),
                      pages or "-")
    parts: list = [t, "", titled("NUMA nodes (the carve's VM side)", nodes)]
    if h["pfs"]:
        pfs = grid("PF", "NODE", "VFS used/total", "TX reserved/bandwidth")
        for p in h["pfs"]:
            pfs.add_row(p["name"], str(p["node"]), f"{p['vfs_used']}/{p['vfs_total']}",
                        f"{p['reserved_mbps']}/{p['bandwidth_mbps']} Mb/s")
        parts += ["", titled("SR-IOV PFs", pfs)]
    if h["disks"]:
        disks = grid("DISK", "NODE", "CLASS", "SIZE", "USED", "IOPS", "BYTES/S")
        for d in h["disks"]:
            disks.add_row(d["name"], str(d["node"]), d.get("class", ""), f"{d['size_bytes'] / 2**30:.1f} GiB",
                          cell(d["used"]), cell(d.get("iops")), cell(d.get("bytes_sec")))
        parts += ["", titled("raw disks", disks)]
    return Group(*parts)


@host_app.command("show")
def host_show(ctx: typer.Context, name: HostArg,
              output: OutputOpt = Format.table, watch: WatchOpt = False, interval: IntervalOpt = 2.0) -> None:
    """One host: its state, its carve's capacity and what is used of it."""
    api = conn(ctx)
    shown(lambda: api.request("GET", f"/v1/hosts/{name}"), host_detail, output, watch, interval)


ReasonOpt = Annotated[str, typer.Option(help="why, for the next operator")]
# The hold's owner is the token's principal (the scheduler derives it); another owner's
# hold is overridden only by naming it, so a hold taken since is not overridden unseen.
ForceOpt = Annotated[Optional[str], typer.Option(
    "--force", metavar="OWNER", help="take the host from OWNER, who holds it now as `host show` says (audited); "
                                     "refused if someone else holds it by then")]


def admin_body(reason: str, force: str | None) -> dict:
    return {"reason": reason, **({"force": True, "expect_owner": force} if force is not None else {})}


def admin_change(ctx: typer.Context, name: str, verb: str, reason: str, force: str | None, output: Format) -> dict:
    h = conn(ctx).request("POST", f"/v1/hosts/{name}/{verb}", json=admin_body(reason, force))
    if output in (Format.json, Format.yaml):
        printer(out, output)(h, lambda _: "")
    else:
        v = visible_data(h)
        out.print(f"host {v['name']}: {v['admin_state']}" + (f" by {v['admin_owner']}" if v.get("admin_owner") else ""))
    return h


@host_app.command("cordon")
def host_cordon(ctx: typer.Context, name: HostArg,
                reason: ReasonOpt = "", force: ForceOpt = None, output: OutputOpt = Format.table) -> None:
    """No new VMs go to the host; those on it stay. Held by your token's principal."""
    admin_change(ctx, name, "cordon", reason, force, output)


@host_app.command("uncordon")
def host_uncordon(ctx: typer.Context, name: HostArg,
                  reason: ReasonOpt = "", force: ForceOpt = None, output: OutputOpt = Format.table) -> None:
    """The host takes VMs again (only the hold's owner may, or --force OWNER)."""
    admin_change(ctx, name, "uncordon", reason, force, output)


DRAIN_COLUMNS = [Column("VM", lambda s: s["vm"]), Column("NAME", lambda s: s["name"]),
                 Column("ACTION", lambda s: s["action"]), Column("WHY", lambda s: s["why"]),
                 Column("MOVE", lambda s: move_progress(s.get("migration")) if s.get("migration") else "")]


def drain_render(d: dict) -> RenderableType:
    title = (f"host {d['host']}: {d['admin_state']}, {d['left']} VMs left"
             + (", drained" if d["drained"] else ""))
    return table(d["steps"], DRAIN_COLUMNS, Format.table, title=title)


@host_app.command("drain")
def host_drain(ctx: typer.Context, name: HostArg,
               reason: ReasonOpt = "", force: ForceOpt = None, yes: YesOpt = False,
               status: Annotated[bool, typer.Option("--status", help="only show what a drain does or waits for")]
               = False,
               wait: Annotated[bool, typer.Option("--wait", help="watch the drain until the host is drained")] = False,
               output: OutputOpt = Format.table, interval: IntervalOpt = 2.0) -> None:
    """Move the host's VMs away as each asked (`on_maintenance`: replace, stop, or block)
    within their disruption budgets; the host takes no new VMs."""
    api = conn(ctx)
    path = f"/v1/hosts/{name}/drain"
    if not status:
        plan = api.request("GET", path)
        moving = sum(1 for s in plan["steps"] if s["action"] != DrainAction.DONE)
        confirm(f"drain host {name} ({moving} VMs to replace, stop or wait on)", yes)
        api.request("POST", path, json=admin_body(reason, force))
    if not wait:
        d = api.request("GET", path)
        printer(out, output)(d, drain_render)
        return
    if output in (Format.json, Format.yaml):  # the answer once drained
        while not (d := api.request("GET", path))["drained"]:
            time.sleep(interval)
        printer(out, output)(d, drain_render)
        return
    with term_is_interrupt(), frames(output) as draw:
        while True:
            d = api.request("GET", path)
            draw(d, drain_render)
            if d["drained"]:
                break
            time.sleep(interval)


# ---------------------------------------------------------------------- fleet


class FleetGroup(str, Enum):
    """What ``fleet`` splits the hosts by (the API's ``group``)."""

    cls = "class"
    rack = "rack"
    state = "state"
    policy = "policy"


@app.command("fleet")
def fleet(ctx: typer.Context,
          day: Annotated[Optional[str], typer.Option(help="host-local day, YYYY-MM-DD (default: today)")] = None,
          compare: Annotated[Optional[str], typer.Option(help="a second day, drawn under the first (before/after)")]
          = None,
          by: Annotated[Optional[FleetGroup], typer.Option("--by", help="class, rack, state or policy (default: class "
                                                                   "for the peak window, which alone keeps the "
                                                                   "split by class; state for hours)")] = None,
          window: Annotated[str, typer.Option(help="peak (each host's evening window), or host-local hours HH-HH")]
          = "peak",
          bins: Annotated[int, typer.Option(help="bins over 0-100 %")] = 20,
          output: OutputOpt = Format.table, watch: WatchOpt = False, interval: IntervalOpt = 30.0) -> None:
    """The fleet's distribution of host CPU use (GET /v1/fleet/utilization), drawn as a
    histogram: the hosts per bin, per group."""
    group = by.value if by else "class" if window == "peak" else "state"
    params = {"day": day or dt.date.today().isoformat(), "group": group, "window": window, "bins": bins}
    if compare:
        params["compare"] = compare
    api = conn(ctx)
    shown(lambda: api.request("GET", "/v1/fleet/utilization", params=params),
          lambda u: histogram.render(u, columns=out.width), output, watch, interval)


# ---------------------------------------------------------------------- audit

AUDIT_COLUMNS = [Column("ID", lambda a: a["id"]), Column("AT", lambda a: when(a["at"])),
                 Column("WHO", lambda a: a["principal"]), Column("ACTION", lambda a: a["action"]),
                 Column("TARGET", lambda a: a["target"]),
                 Column("DETAIL", lambda a: json.dumps(a["detail"], sort_keys=True), wide_only=True)]


def since_arg(v: str | None, flag: str) -> float | None:
    """An ISO time, or an age back from now (30s, 15m, 2h, 7d)."""
    if not v:
        return None
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if v[-1:] in units and re.fullmatch(r"[0-9]+(\.[0-9]*)?", v[:-1]):
        return time.time() - float(v[:-1]) * units[v[-1]]
    try:
        t = dt.datetime.fromisoformat(v)
        return (t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)).timestamp()
    except (ValueError, OverflowError):
        raise typer.BadParameter(f"{v!r}: expected an ISO time (2026-11-26T14:00) or an age (15m, 2h, 7d)",
                                 param_hint=flag) from None


@app.command("audit")
def audit(ctx: typer.Context,
          since: Annotated[Optional[str], typer.Option(help="from this time (ISO, UTC) or age (15m, 2h, 7d)")] = None,
          until: Annotated[Optional[str], typer.Option(help="before this time or age")] = None,
          who: Annotated[Optional[str], typer.Option("--who", help="the principal (token name)")] = None,
          action: Annotated[Optional[str], typer.Option(help="exact, or a prefix ending in '.' (host.)")] = None,
          target: Annotated[Optional[str], typer.Option(help="a VM id or host name")] = None,
          limit: Annotated[int, typer.Option(help="entries at most, newest first", min=1)] = 50,
          output: OutputOpt = Format.table) -> None:
    """Who did what, when (admin)."""
    params: dict[str, Any] = {k: v for k, v in dict(principal=who, action=action, target=target).items() if v}
    for k, v, flag in (("since", since, "--since"), ("until", until, "--until")):
        t = since_arg(v, flag)
        if t is not None:
            params[k] = t
    api = conn(ctx)
    items: list[dict] = []
    before = None
    while len(items) < limit:
        page = api.request("GET", "/v1/audit", params={**params, "limit": min(500, limit - len(items)),
                                                       **({"before": before} if before else {})})
        items += page["items"]
        before = page.get("next")
        if not before:
            break
    data = {"items": items}
    printer(out, output)(data, lambda d: table(d["items"], AUDIT_COLUMNS, output))


# ---------------------------------------------------------------------- rollouts

def sum_counts(per_wave: list[dict[str, int]]) -> dict[str, int]:
    """The rollout's hosts by state over its waves (the API counts them per wave)."""
    total: dict[str, int] = {}
    for w in per_wave:
        for k, n in w.items():
            total[k] = total.get(k, 0) + n
    return total


ROLLOUT_COLUMNS = [
    Column("NAME", lambda r: r["name"]), Column("KIND", lambda r: r["kind"]), Column("STATE", lambda r: r["state"]),
    Column("WAVE", lambda r: f"{r['wave'] + 1}/{r['waves']}" if r["waves"] else "-"),
    Column("HOSTS", lambda r: ", ".join(f"{k} {v}" for k, v in sorted(sum_counts(r["counts"]).items()))),
    Column("BY", lambda r: r["created_by"], wide_only=True),
    Column("REASON", lambda r: r["reason"], wide_only=True),
    Column("AGE", lambda r: age(r["created"])),
]
ROLLOUT_HOST_COLUMNS = [Column("HOST", lambda h: h["name"]), Column("WAVE", lambda h: h["wave"]),
                        Column("RACK", lambda h: h["rack"]), Column("STATE", lambda h: h["state"]),
                        Column("NOTE", lambda h: h["data"].get("rollback_failed") or h["data"].get("reason"),
                               wide_only=True),
                        Column("UPDATED", lambda h: age(h["updated"]))]


def rollout_detail(d: dict, fmt: Format) -> RenderableType:
    r = d["rollout"]
    head = (f"rollout {r['name']} ({r['kind']}): {r['state']}" + (f": {r['reason']}" if r["reason"] else "")
            + f"\nwave {r['wave'] + 1} of {r['waves']}; policy {r['policy_digest'][:12]}; by {r['created_by']}"
            + (f"; lease {r['lease']['holder']} ({r['lease']['principal']}, fence {r['lease']['fence']})"
               if r.get("lease") else ""))
    parts: list = [head, ""]
    if r["skipped"]:
        parts += [table(r["skipped"], [Column("SKIPPED", lambda s: s.get("host") or s.get("name")),
                                       Column("WHY", lambda s: s.get("reason") or s.get("why"))], fmt), ""]
    parts.append(table(d["hosts"], ROLLOUT_HOST_COLUMNS, fmt))
    return Group(*parts)


@rollout_app.command("status")
def rollout_status(ctx: typer.Context,
                   name: Annotated[Optional[str], typer.Argument(help="a rollout (default: list them)")] = None,
                   output: OutputOpt = Format.table, watch: WatchOpt = False, interval: IntervalOpt = 2.0) -> None:
    """The rollouts and their state; with a NAME, its waves' hosts and their steps."""
    api = conn(ctx)
    if not name:
        shown(lambda: api.request("GET", "/v1/rollouts"), lambda d: table(d["items"], ROLLOUT_COLUMNS, output),
              output, watch, interval)
        return

    def fetch() -> dict:
        return {"rollout": api.request("GET", f"/v1/rollouts/{name}"),
                "hosts": api.request("GET", f"/v1/rollouts/{name}/hosts", params={"brief": "true"})["items"]}
    shown(fetch, lambda d: rollout_detail(d, output), output, watch, interval)


def rollout_verb(verb: str, doc: str, destructive: bool) -> None:
    """``hybctl rollout VERB NAME``: the API's state change; the controller running the
    rollout (fleet-rollout) acts on it at its next step. It replaces the state the
    operator saw (``--expect``, else the state read now and shown in the confirmation):
    if the controller or another operator moved the rollout since, the API refuses it
    (hyb.rollout.stale_state, naming who)."""
    def command(ctx: typer.Context, name: Annotated[str, typer.Argument(help="the rollout")],
                reason: Annotated[str, typer.Option(help="why, kept with the transition")] = "",
                expect: Annotated[Optional[str], typer.Option(
                    metavar="STATE", help="the state the rollout must still be in (default: as read now)")] = None,
                yes: YesOpt = False, output: OutputOpt = Format.table) -> None:
        api = conn(ctx)
        if expect is None:
            expect = api.request("GET", f"/v1/rollouts/{name}")["state"]
        if destructive:
            confirm(f"{verb} rollout {name}, now {expect} (its changed hosts are rolled back)", yes)
        r = api.request("POST", f"/v1/rollouts/{name}/{verb}", json={"expect": expect, "reason": reason})
        if output in (Format.json, Format.yaml):
            printer(out, output)(r, lambda _: "")
        else:
            v = visible_data(r)
            out.print(f"rollout {visible(name)}: {v['state']}" + (f" ({v['reason']})" if v.get("reason") else ""))
    command.__doc__ = doc
    rollout_app.command(verb)(command)


for _verb, _doc, _destructive in (
        ("pause", "Stop the rollout at its controller's next step.", False),
        ("resume", "Run a paused or halted rollout again (a done one retries its failed rollbacks).", False),
        ("abort", "Roll back the hosts mid-change and stop.", True),
        ("rollback", "Roll back every changed host, last wave first.", True)):
    rollout_verb(_verb, _doc, _destructive)


# ---------------------------------------------------------------------- raw


@app.command("api")
def raw(ctx: typer.Context, method: Annotated[str, typer.Argument(help="GET, POST, PUT, PATCH or DELETE")],
        path: Annotated[str, typer.Argument(help="the path, with its query (/v1/hosts?rack=r1)")],
        data: Annotated[Optional[str], typer.Option("--data", "-d", help="the body: JSON text, or @FILE "
                                                                        "(JSON or YAML), @- for stdin")] = None,
        header: Annotated[list[str], typer.Option("--header", "-H", help="NAME: VALUE (repeat)")] = [],  # noqa: B006
        output: Annotated[Format, typer.Option("--output", "-o", help="json or yaml")] = Format.json) -> None:
    """Any call of the REST API, like `kubectl get --raw`: the answer's body as it came."""
    m = method.upper()
    if m not in ("GET", "POST", "PUT", "PATCH", "DELETE"):
        raise typer.BadParameter(f"{method!r}: not one of GET, POST, PUT, PATCH, DELETE", param_hint="METHOD")
    if not path.startswith("/"):
        raise typer.BadParameter(f"{path!r}: a path starts with /", param_hint="PATH")
    kw: dict[str, Any] = {}
    if data is not None:
        if data.startswith("@"):
            kw["json"] = read_body(data[1:], "--data")
        else:
            try:
                kw["json"] = json.loads(data)
            except ValueError as e:
                raise typer.BadParameter(f"not JSON: {e}", param_hint="--data") from None
    headers = {}
    for h in header:
        k, sep, v = h.partition(":")
        if not sep:
            raise typer.BadParameter(f"{h!r}: expected NAME: VALUE", param_hint="--header")
        headers[k.strip()] = v.strip()
    r = conn(ctx).send(m, path, headers=headers, **kw)
    body: Any = r.text
    try:
        body = r.json() if r.content else None
    except ValueError:
        pass
    if body is not None:
        fmt = Format.yaml if output is Format.yaml else Format.json
        text = dump(body, fmt) if not isinstance(body, str) else "\n".join(map(visible, body.split("\n")))
        out.print(text, soft_wrap=True)
    if r.status_code >= 400:
        raise typer.Exit(1)


# ---------------------------------------------------------------------- config


def load_config() -> dict:
    return cfg.load(warn=warn)


@config_app.command("view")
def config_view() -> None:
    """The config file as it is (tokens are in files, never here)."""
    out.print(dump(load_config(), Format.yaml))


@config_app.command("get-contexts")
def config_get_contexts() -> None:
    data = visible_data(load_config())
    t = grid("CURRENT", "NAME", "SERVER", "TOKEN FILE", "CA")
    for name, c in sorted(data["contexts"].items()):
        t.add_row("*" if name == data["current-context"] else "", name, c.get("server", "-"),
                  c.get("token-file", "-"), c.get("ca", "-"))
    out.print(t)


@config_app.command("current-context")
def config_current_context() -> None:
    name = load_config()["current-context"]
    if not name:
        raise Fail("current-context: not set (hybctl config use-context NAME)")
    out.print(visible(name))


ContextArg = Annotated[str, typer.Argument(help="a context of the config file", autocompletion=complete_context)]


@config_app.command("use-context")
def config_use_context(name: ContextArg) -> None:
    data = load_config()
    if name not in data["contexts"]:
        raise Fail(f"context {name!r}: not in {cfg.config_path()} (known: "
                   f"{', '.join(sorted(data['contexts'])) or 'none'})")
    data["current-context"] = name
    cfg.save(data)
    out.print(f"current context: {visible(name)}")


@config_app.command("set-context")
def config_set_context(name: Annotated[str, typer.Argument(help="the context to add or change",
                                                           autocompletion=complete_context)],
                       server: Annotated[Optional[str], typer.Option(help="the scheduler's URL")] = None,
                       token_file: Annotated[Optional[str], typer.Option(help="a file holding the token")] = None,
                       ca: Annotated[Optional[str], typer.Option(help="the scheduler's CA certificate")] = None,
                       use: Annotated[bool, typer.Option("--use", help="make it the current context")] = False) -> None:
    """Add a context or change some of its settings."""
    data = load_config()
    c = dict(data["contexts"].get(name, {}))
    for k, v in (("server", server), ("token-file", token_file), ("ca", ca)):
        if v is not None:
            c[k] = str(Path(v).expanduser().resolve()) if k != "server" else v
    if "server" not in c:
        raise typer.BadParameter("a new context needs --server", param_hint="--server")
    data["contexts"][name] = c
    if use or not data["current-context"]:
        data["current-context"] = name
    path = cfg.save(data)
    out.print(f"context {visible(name)} written to {visible(str(path))}")


@config_app.command("delete-context")
def config_delete_context(name: ContextArg) -> None:
    data = load_config()
    if data["contexts"].pop(name, None) is None:
        raise Fail(f"context {name!r}: not in {cfg.config_path()}")
    if data["current-context"] == name:
        data["current-context"] = ""
    cfg.save(data)
    out.print(f"context {visible(name)} removed")


# ---------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    """hybctl's entry point: the exit code, and every error as one line on stderr."""
    try:
        rv = app(args=argv, prog_name="hybctl", standalone_mode=False)
        return rv if isinstance(rv, int) else 0
    except SystemExit as e:  # shell completion, --show-completion
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except typer.TyperException as e:  # click's usage errors (exit 2), as Typer vendors them
        if type(e).__name__ == "NoArgsIsHelpError":
            return e.exit_code  # the help is printed (Typer tells it apart by name too)
        ctx = getattr(e, "ctx", None)
        say("error", e.format_message() + (f" (see '{ctx.command_path} --help')" if ctx else ""))
        return e.exit_code
    except typer.Abort:
        say("error", "aborted")
        return 1
    except ApiUnreachable as e:
        say("error", f"{e}" + (f" (server {e.url})" if e.url else ""))
    except (ApiError, cfg.ConfigError, Fail) as e:
        say("error", str(e))
    except BrokenPipeError:  # `hybctl ... | head`: the reader has what it wanted
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # noqa: BLE001 - the README promises no traceback, a bug included
        say("error", f"unexpected {type(e).__name__}: {e} (a bug in hybctl: please report it with the command)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
