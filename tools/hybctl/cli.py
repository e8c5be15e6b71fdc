"""hybctl: the scheduler's REST API from a terminal (tools/hybctl/README.md).

Exit codes: 0 done, 1 an error (refused, not found, unreachable, a bad config), 2 a
usage error (click's). Errors are one line on stderr naming the field at fault when the
API names one; never a traceback for a server that is down."""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
import yaml
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table

from api.rest import ApiError, ApiUnreachable, RestClient
from api.states import DrainAction, HostState, VmStatus
from tools.hybctl import config as cfg
from tools.hybctl import histogram
from tools.hybctl.output import Column, Format, age, cell, dump, grid, printer, table, titled, when

# piped into grep or awk, a table keeps one line per row (rich would wrap at 80 columns)
out = Console(soft_wrap=False, width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 1000)
err = Console(stderr=True)

app = typer.Typer(no_args_is_help=True, add_completion=True, pretty_exceptions_enable=False,
                  rich_markup_mode="markdown",
                  help="The hybrid-KVM scheduler's REST API from a terminal: VMs, hosts, the fleet's "
                       "utilisation, rollouts, the audit log.",
                  context_settings={"help_option_names": ["-h", "--help"]})
vm_app = typer.Typer(no_args_is_help=True, help="VMs: create, list, show, delete, change IO limits.")
host_app = typer.Typer(no_args_is_help=True, help="Hosts: list, show, cordon, uncordon, drain.")
rollout_app = typer.Typer(no_args_is_help=True, help="Rollouts kept by the scheduler (fleet-rollout runs them).")
config_app = typer.Typer(no_args_is_help=True, help="Contexts: named schedulers with their token and CA.")
app.add_typer(vm_app, name="vm")
app.add_typer(host_app, name="host")
app.add_typer(rollout_app, name="rollout")
app.add_typer(config_app, name="config")


class Fail(Exception):
    """A one-line error hybctl prints before exiting 1."""


# ---------------------------------------------------------------------- connection


class Conn:
    """The global options, resolved into a client the first time a command needs one."""

    def __init__(self, context: str | None, server: str | None, token_file: str | None, ca: str | None,
                 timeout: float):
        self.opts = dict(context=context, server=server, token_file=token_file, ca=ca)
        self.timeout = timeout
        self._client: RestClient | None = None

    @property
    def api(self) -> RestClient:
        if self._client is None:
            t = cfg.resolve(**self.opts)
            self._client = RestClient(t.server, t.token, ca=t.ca, timeout_s=self.timeout)
        return self._client

    def close(self) -> None:
        if self._client:
            self._client.close()


def conn(ctx: typer.Context) -> RestClient:
    return ctx.find_root().obj.api


@app.callback()
def root(ctx: typer.Context,
         context: Annotated[Optional[str], typer.Option("--context", help="a context of the config file",
                                                        envvar="HYBCTL_CONTEXT", show_envvar=True)] = None,
         server: Annotated[Optional[str], typer.Option("--server", "-s", help="the scheduler's URL",
                                                       envvar="HYBCTL_SERVER", show_envvar=True)] = None,
         token_file: Annotated[Optional[str], typer.Option("--token-file", help="a file holding a bearer token",
                                                           envvar="HYBCTL_TOKEN_FILE", show_envvar=True)] = None,
         ca: Annotated[Optional[str], typer.Option("--ca", help="the CA the scheduler's certificate is checked "
                                                                "against (default: the system's)",
                                                   envvar="HYBCTL_CA", show_envvar=True)] = None,
         timeout: Annotated[float, typer.Option("--timeout", help="seconds to wait for an answer")] = 15.0) -> None:
    ctx.obj = Conn(context, server, token_file, ca, timeout)
    ctx.call_on_close(ctx.obj.close)


OutputOpt = Annotated[Format, typer.Option("--output", "-o", help="table, wide, json or yaml")]
WatchOpt = Annotated[bool, typer.Option("--watch", "-w", help="show it again every --interval seconds (Ctrl-C ends)")]
IntervalOpt = Annotated[float, typer.Option("--interval", help="seconds between two looks with --watch", min=0.2)]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="do not ask for confirmation")]


def shown(fetch: Callable[[], Any], render: Callable[[Any], RenderableType], fmt: Format, watch: bool,
          interval: float) -> None:
    """Fetch and print once, or again and again with --watch: tables redrawn in place,
    json/yaml printed each time the answer changes (a stream of documents)."""
    show = printer(out, fmt)
    data = fetch()
    if not watch:
        show(data, lambda: render(data))
        return
    try:
        if fmt in (Format.json, Format.yaml):
            last = None
            while True:
                if data != last:
                    show(data, lambda: render(data))
                    if fmt is Format.yaml:
                        out.print("---", markup=False)
                    last = data
                time.sleep(interval)
                data = fetch()
        with Live(render(data), console=out, auto_refresh=False, transient=False) as live:
            while True:
                time.sleep(interval)
                data = fetch()
                live.update(render(data), refresh=True)
    except KeyboardInterrupt:
        return


def confirm(what: str, yes: bool) -> None:
    if yes:
        return
    if not sys.stdin.isatty():
        raise Fail(f"{what}: refused without --yes (no terminal to ask on)")
    if not typer.confirm(f"{what}?", default=False):
        raise Fail(f"{what}: not confirmed")


def read_body(path: str) -> Any:
    """A JSON or YAML document from ``path`` ("-": standard input)."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as e:
        raise Fail(f"--filename: {path}: {e.strerror}") from None
    try:
        return yaml.safe_load(text)  # YAML 1.1 reads JSON too
    except yaml.YAMLError as e:
        raise Fail(f"--filename: {path}: neither JSON nor YAML: {e}") from None


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
            host: Annotated[Optional[str], typer.Option(help="only VMs on this host")] = None,
            status: Annotated[Optional[VmStatus], typer.Option(help="only VMs in this status")] = None,
            name: Annotated[Optional[str], typer.Option(help="only VMs of this name")] = None,
            watch: WatchOpt = False, interval: IntervalOpt = 2.0) -> None:
    """The VMs you may see (a tenant token: its own), every page of them."""
    api = conn(ctx)
    params = {k: v for k, v in dict(tenant=tenant, host=host, status=status, name=name).items() if v}

    shown(lambda: {"items": api.every_page("/v1/vms", params)},
          lambda d: table(d["items"], VM_COLUMNS, output), output, watch, interval)


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
                   ("hugepages", pl.get("hugepages")), ("vfs", pl.get("vfs")), ("disks", pl.get("disks")),
                   ("attempts", v.get("attempts")), ("created", when(v["created"])),
                   ("updated", when(v["updated"]))):
        t.add_row(k, cell(val))
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
              wait_timeout: Annotated[float, typer.Option(help="seconds --wait waits")] = 300.0,
              output: OutputOpt = Format.table) -> None:
    """Ask for a VM (POST /v1/vms); the answer is accepted, the VM is created after."""
    body = read_body(filename)
    if dry_run:
        return why_show(conn(ctx), body, output)
    key = idempotency_key or str(uuid.uuid4())
    api = conn(ctx)
    v = api.request("POST", "/v1/vms", json=body, headers={"Idempotency-Key": key})
    if not idempotency_key and output in (Format.table, Format.wide):
        err.print(f"Idempotency-Key: {key} (give it again with --idempotency-key to retry safely)")
    if wait:
        deadline = time.monotonic() + wait_timeout
        while v["status"] in (VmStatus.PENDING, VmStatus.CREATING) and time.monotonic() < deadline:
            time.sleep(0.5)
            v = api.request("GET", f"/v1/vms/{v['id']}")
        if v["status"] != VmStatus.RUNNING:
            printer(out, output)(v, lambda: vm_detail(v))
            raise Fail(f"VM {v['id']}: {v['status']}" + (f": {v['reason']}" if v.get("reason") else
                                                        " after --wait-timeout"))
    printer(out, output)(v, lambda: vm_detail(v))


@vm_app.command("delete")
def vm_delete(ctx: typer.Context, vm_ids: Annotated[list[str], typer.Argument(help="the VMs' ids")],
              yes: YesOpt = False) -> None:
    """Delete VMs: hostd destroys the domain, the scheduler frees what it held."""
    api = conn(ctx)
    for vm_id in vm_ids:
        v = api.request("GET", f"/v1/vms/{vm_id}")  # an unknown id fails before anything is asked
        confirm(f"delete VM {vm_id} ({v['name']}, {v['status']} on {v['host'] or 'no host'})", yes)
        api.request("DELETE", f"/v1/vms/{vm_id}")
        out.print(f"VM {vm_id} deleting")


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
    printer(out, output)(v, lambda: vm_detail(v))


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
    printer(out, output)(p, lambda: why_render(p))


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
    shown(lambda: {"items": api.every_page("/v1/hosts", params)},
          lambda d: table(d["items"], HOST_COLUMNS, output), output, watch, interval)


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
def host_show(ctx: typer.Context, name: Annotated[str, typer.Argument(help="the host's name")],
              output: OutputOpt = Format.table, watch: WatchOpt = False, interval: IntervalOpt = 2.0) -> None:
    """One host: its state, its carve's capacity and what is used of it."""
    api = conn(ctx)
    shown(lambda: api.request("GET", f"/v1/hosts/{name}"), host_detail, output, watch, interval)


OwnerOpt = Annotated[str, typer.Option(help="who holds the host while it is not active (another owner's hold is "
                                            "refused unless --force)")]
ReasonOpt = Annotated[str, typer.Option(help="why, for the next operator")]
ForceOpt = Annotated[bool, typer.Option("--force", help="take the host from another owner (audited)")]


def admin_change(ctx: typer.Context, name: str, verb: str, owner: str, reason: str, force: bool,
                 output: Format) -> dict:
    h = conn(ctx).request("POST", f"/v1/hosts/{name}/{verb}",
                          json={"owner": owner, "reason": reason, "force": force})
    if output in (Format.json, Format.yaml):
        printer(out, output)(h, lambda: "")
    else:
        out.print(f"host {name}: {h['admin_state']}" + (f" by {h['admin_owner']}" if h.get("admin_owner") else ""))
    return h


@host_app.command("cordon")
def host_cordon(ctx: typer.Context, name: Annotated[str, typer.Argument(help="the host's name")],
                owner: OwnerOpt = "hybctl", reason: ReasonOpt = "", force: ForceOpt = False,
                output: OutputOpt = Format.table) -> None:
    """No new VMs go to the host; those on it stay."""
    admin_change(ctx, name, "cordon", owner, reason, force, output)


@host_app.command("uncordon")
def host_uncordon(ctx: typer.Context, name: Annotated[str, typer.Argument(help="the host's name")],
                  owner: OwnerOpt = "hybctl", reason: ReasonOpt = "", force: ForceOpt = False,
                  output: OutputOpt = Format.table) -> None:
    """The host takes VMs again."""
    admin_change(ctx, name, "uncordon", owner, reason, force, output)


DRAIN_COLUMNS = [Column("VM", lambda s: s["vm"]), Column("NAME", lambda s: s["name"]),
                 Column("ACTION", lambda s: s["action"]), Column("WHY", lambda s: s["why"])]


def drain_render(d: dict) -> RenderableType:
    title = (f"host {d['host']}: {d['admin_state']}, {d['left']} VMs left"
             + (", drained" if d["drained"] else ""))
    return table(d["steps"], DRAIN_COLUMNS, Format.table, title=title)


@host_app.command("drain")
def host_drain(ctx: typer.Context, name: Annotated[str, typer.Argument(help="the host's name")],
               owner: OwnerOpt = "hybctl", reason: ReasonOpt = "", force: ForceOpt = False, yes: YesOpt = False,
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
        api.request("POST", path, json={"owner": owner, "reason": reason, "force": force})
    if not wait:
        d = api.request("GET", path)
        printer(out, output)(d, lambda: drain_render(d))
        return
    show = printer(out, output)
    with Live(console=out, auto_refresh=False) as live:
        while True:
            d = api.request("GET", path)
            if output in (Format.table, Format.wide):
                live.update(drain_render(d), refresh=True)
            if d["drained"]:
                break
            time.sleep(interval)
    if output not in (Format.table, Format.wide):
        show(d, lambda: drain_render(d))


# ---------------------------------------------------------------------- fleet


@app.command("fleet")
def fleet(ctx: typer.Context,
          day: Annotated[Optional[str], typer.Option(help="host-local day, YYYY-MM-DD (default: today)")] = None,
          compare: Annotated[Optional[str], typer.Option(help="a second day, drawn under the first (before/after)")]
          = None,
          by: Annotated[str, typer.Option("--by", help="class, rack, state or policy")] = "class",
          window: Annotated[str, typer.Option(help="peak (each host's evening window), or host-local hours HH-HH")]
          = "peak",
          bins: Annotated[int, typer.Option(help="bins over 0-100 %")] = 20,
          output: OutputOpt = Format.table, watch: WatchOpt = False, interval: IntervalOpt = 30.0) -> None:
    """The fleet's distribution of host CPU use (GET /v1/fleet/utilization), drawn as a
    histogram: the hosts per bin, per group."""
    params = {"day": day or dt.date.today().isoformat(), "group": by, "window": window, "bins": bins}
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
    if v[-1:] in units and v[:-1].replace(".", "", 1).isdigit():
        return time.time() - float(v[:-1]) * units[v[-1]]
    try:
        t = dt.datetime.fromisoformat(v)
    except ValueError:
        raise typer.BadParameter(f"{v!r}: expected an ISO time (2026-11-26T14:00) or an age (15m, 2h, 7d)",
                                 param_hint=flag) from None
    return (t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)).timestamp()


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
    printer(out, output)(data, lambda: table(items, AUDIT_COLUMNS, output))


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
            + (f"; lease {r['lease']['holder']}" if r.get("lease") else ""))
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
    rollout (fleet-rollout) acts on it at its next step."""
    def command(ctx: typer.Context, name: Annotated[str, typer.Argument(help="the rollout")],
                reason: Annotated[str, typer.Option(help="why, kept with the transition")] = "",
                yes: YesOpt = False, output: OutputOpt = Format.table) -> None:
        if destructive:
            confirm(f"{verb} rollout {name} (its changed hosts are rolled back)", yes)
        r = conn(ctx).request("POST", f"/v1/rollouts/{name}/{verb}", json={"reason": reason})
        if output in (Format.json, Format.yaml):
            printer(out, output)(r, lambda: "")
        else:
            out.print(f"rollout {name}: {r['state']}" + (f" ({r['reason']})" if r.get("reason") else ""))
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
            kw["json"] = read_body(data[1:])
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
        out.print(dump(body, fmt) if not isinstance(body, str) else body, markup=False, highlight=False,
                  soft_wrap=True)
    if r.status_code >= 400:
        raise typer.Exit(1)


# ---------------------------------------------------------------------- config


@config_app.command("view")
def config_view() -> None:
    """The config file as it is (tokens are in files, never here)."""
    out.print(dump(cfg.load(), Format.yaml), markup=False, highlight=False)


@config_app.command("get-contexts")
def config_get_contexts() -> None:
    data = cfg.load()
    t = grid("CURRENT", "NAME", "SERVER", "TOKEN FILE", "CA")
    for name, c in sorted(data["contexts"].items()):
        t.add_row("*" if name == data["current-context"] else "", name, c.get("server", "-"),
                  c.get("token-file", "-"), c.get("ca", "-"))
    out.print(t)


@config_app.command("current-context")
def config_current_context() -> None:
    name = cfg.load()["current-context"]
    if not name:
        raise Fail("current-context: not set (hybctl config use-context NAME)")
    out.print(name, markup=False)


@config_app.command("use-context")
def config_use_context(name: Annotated[str, typer.Argument(help="a context of the config file")]) -> None:
    data = cfg.load()
    if name not in data["contexts"]:
        raise Fail(f"context {name!r}: not in {cfg.config_path()} (known: "
                   f"{', '.join(sorted(data['contexts'])) or 'none'})")
    data["current-context"] = name
    cfg.save(data)
    out.print(f"current context: {name}")


@config_app.command("set-context")
def config_set_context(name: Annotated[str, typer.Argument(help="the context to add or change")],
                       server: Annotated[Optional[str], typer.Option(help="the scheduler's URL")] = None,
                       token_file: Annotated[Optional[str], typer.Option(help="a file holding the token")] = None,
                       ca: Annotated[Optional[str], typer.Option(help="the scheduler's CA certificate")] = None,
                       use: Annotated[bool, typer.Option("--use", help="make it the current context")] = False) -> None:
    """Add a context or change some of its settings."""
    data = cfg.load()
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
    out.print(f"context {name} written to {path}")


@config_app.command("delete-context")
def config_delete_context(name: Annotated[str, typer.Argument(help="the context to remove")]) -> None:
    data = cfg.load()
    if data["contexts"].pop(name, None) is None:
        raise Fail(f"context {name!r}: not in {cfg.config_path()}")
    if data["current-context"] == name:
        data["current-context"] = ""
    cfg.save(data)
    out.print(f"context {name} removed")


# ---------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    try:
        app(args=argv, prog_name="hybctl")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except ApiUnreachable as e:
        where = f" (server {e.url})" if e.url else ""
        err.print(f"error: {e}{where}", markup=False, highlight=False)
    except ApiError as e:
        err.print(f"error: {e}", markup=False, highlight=False)
    except (cfg.ConfigError, Fail) as e:
        err.print(f"error: {e}", markup=False, highlight=False)
    except KeyboardInterrupt:
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
