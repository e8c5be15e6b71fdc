"""What each `hostd` subcommand does, wired from the layers: discover -> carve -> apply.

`hostd carve` and `hostd uncarve` call the carve service the Carve and Uncarve RPCs call
(hostd/apply/carve_service.py): the same checks against the VMs the daemon holds (its
ledger in state_dir), the same lock, the same journal and errors."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from rich.console import Console

from api.jsonmodel import SchemaError
from api.layout import Layout
from hostd.carve.plan import plan_host
from hostd.apply.carve_service import Asker, CarveService, LedgerVms, Where
from hostd.apply.carve_state import JOURNAL_NAME
from hostd.carve.policy import Policy, PolicyError, load_policy, loads_policy
from hostd.carve.render import render_layout, render_nofit
from hostd.config import HostdConfig, load_config
from hostd.discover import discover_host
from hostd.discover.model import Topology
from hostd.discover.render import render_topology
from hostd.errors import BadPolicy, BadTopology, CarveNoFit, NoFit

__all__ = ["run", "print_json"]
EXIT_NOFIT = 3  # the policy does not fit this host (hostd/cli.py lists the exit codes)


def run(args: argparse.Namespace, console: Console) -> int:
    cfg = load_config(args.config)
    return {"discover": _discover, "plan": _plan, "carve": _carve,
            "uncarve": _uncarve, "serve": _serve, "image": _image}[args.cmd](args, cfg, console)


def _policy(args: argparse.Namespace, cfg: HostdConfig, *, required: bool) -> Policy | None:
    path: Path | None = getattr(args, "policy", None)
    if path is None:
        if not required and not cfg.policy.exists():
            return None
        path = cfg.policy
    try:
        return load_policy(path)
    except PolicyError as e:
        raise BadPolicy(e.reason, field=e.field) from None


def _topology(args: argparse.Namespace, cfg: HostdConfig, policy: Policy | None) -> Topology:
    root = args.root or cfg.root
    allow = args.allow if args.allow is not None else (policy.disks.allow if policy else ())
    return discover_host(root, allow=tuple(allow), wipe_ok=tuple(policy.disks.wipe_ok) if policy else (),
                         virt_type=args.virt_type or cfg.virt_type,
                         probe_versions=root == Path("/"))


def _discover(args, cfg, console) -> int:
    topo = _topology(args, cfg, _policy(args, cfg, required=False))
    if args.json:
        print_json(topo.to_dict())
    else:
        render_topology(topo, console)
    return 0


def _plan_for(args, cfg) -> tuple[Topology, Layout | NoFit, Policy]:
    policy = _policy(args, cfg, required=True)
    assert policy is not None
    if getattr(args, "topology", None):
        try:
            topo = Topology.from_json(args.topology.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise BadTopology(str(e), field=str(args.topology)) from None
        except SchemaError as e:
            raise BadTopology(str(e), field=str(args.topology)) from None
    else:
        topo = _topology(args, cfg, policy)
    return topo, plan_host(topo, policy), policy


def _plan(args, cfg, console) -> int:
    _topo, result, _policy_ = _plan_for(args, cfg)
    return _show_plan(result, args.json, console)


def _show_plan(result: Layout | NoFit, as_json: bool, console: Console) -> int:
    if isinstance(result, NoFit):
        if as_json:
            print_json({"nofit": {"field": result.field, "reason": result.reason}})
        else:
            render_nofit(result, console)
        return EXIT_NOFIT
    if as_json:
        print_json(result.to_dict())
    else:
        render_layout(result, console)
    return 0


def _carve_service(args: argparse.Namespace, cfg: HostdConfig) -> CarveService:
    allow = getattr(args, "allow", None)
    where = Where(root=getattr(args, "root", None) or cfg.root, state_dir=args.state_dir or cfg.state_dir,
                  policy_file=cfg.policy, virt_type=getattr(args, "virt_type", None) or cfg.virt_type,
                  allow=tuple(allow) if allow is not None else None)
    return CarveService(where, LedgerVms(where.state_dir), wait_s=args.wait)


def _asker(args: argparse.Namespace) -> Asker:
    user = os.environ.get("SUDO_USER") or os.environ.get("USER") or str(os.getuid())
    return Asker(args.expect, args.operation or f"hostd-cli:{user}:{int(time.time())}", f"hostd-cli:{user}")


def _carve(args, cfg, console) -> int:
    """Journaled, and recorded with the policy's digest, so `hostd serve` serves the carved
    policy and GetHostInfo shows it. Refused (nothing changed) where the Carve RPC refuses."""
    path: Path = args.policy or cfg.policy
    try:
        text = path.read_text()
        policy = loads_policy(text, source=str(path))
    except OSError as e:
        raise BadPolicy(e.strerror or str(e), field=str(path)) from None
    except PolicyError as e:
        raise BadPolicy(e.reason, field=e.field) from None
    service = _carve_service(args, cfg)
    if args.dry_run:
        plan = service.plan(text, policy=policy)
        if plan.nofit is not None:
            return _show_plan(plan.nofit, args.json, console)
        assert plan.layout is not None
        layout, digest, steps, cannot_move, conflicts = (plan.layout, plan.digest, plan.steps, plan.cannot_move,
                                                          plan.vm_conflicts)
    else:
        try:
            out = service.carve(text, _asker(args), policy=policy)
        except CarveNoFit as e:
            return _show_plan(NoFit(e.field or "policy", e.detail), args.json, console)
        layout, digest, steps, cannot_move, conflicts = out.layout, out.digest, out.steps, out.cannot_move, []
    if args.json:
        print_json({"dry_run": args.dry_run, "policy_digest": digest, "steps": [s.to_dict() for s in steps],
                    "cannot_move": cannot_move, "vm_conflicts": conflicts, "layout": layout.to_dict()})
        return 0
    render_layout(layout, console)
    if not steps:
        console.print("host already matches the layout: nothing to change")
    verb = "would" if args.dry_run else "did"
    for s in steps:
        console.print(f"  {verb}: {s.describe()}", highlight=False, markup=False)
    for why in cannot_move:
        console.print(f"  cannot move off io_cpus: {why}", highlight=False, markup=False)
    for why in conflicts:
        console.print(f"  would not hold VM {why}: the carve will be refused", highlight=False, markup=False)
    if not args.dry_run:
        console.print(f"carved with policy {path} (sha256 {digest}); journal: "
                      f"{service.where.state_dir / JOURNAL_NAME} (`hostd uncarve` restores)",
                      highlight=False, markup=False)
    return 0


def _uncarve(args, cfg, console) -> int:
    service = _carve_service(args, cfg)
    steps = service.uncarve(_asker(args), drained=args.drained, dry_run=args.dry_run)
    if not steps:
        console.print(f"nothing to undo: the journal ({service.where.state_dir / JOURNAL_NAME}) is empty",
                      highlight=False, markup=False)
    verb = "would undo" if args.dry_run else "undid"
    for s in steps:
        console.print(f"  {verb}: {s.describe()}", highlight=False, markup=False)
    return 0


def _serve(args, cfg, console) -> int:
    from hostd.rpc.daemon import serve

    return serve(cfg, ready_file=args.ready_file)


def _image(args, cfg, console) -> int:
    from hostd.apply.images import ImageStore

    store = ImageStore(cfg.image_dir)
    if args.image_cmd == "list":
        for name in store.names():
            img = store.get(name)
            console.print(f"{img.name} {img.version} {img.kind} {' '.join(sorted(img.files))}",
                          highlight=False, markup=False)
        return 0
    if args.from_dir:
        from hostd.domain.guest_profiles import image_store_args

        try:
            manifest = json.loads((args.from_dir / "manifest.json").read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise BadTopology(f"cannot read its manifest.json: {e}", field="--from") from None
        kw = image_store_args(manifest, args.from_dir)
        kw["name"] = args.name or kw["name"]
        img = store.add(kw.pop("name"), kw.pop("version") or args.version, kw.pop("kind"), kw.pop("files"), **kw)
        console.print(f"image {img.name} {img.version} ({img.kind}) in {cfg.image_dir}", highlight=False,
                      markup=False)
        return 0
    if not args.name:
        raise BadTopology("give a name (or --from DIR)", field="name")
    files = {k: v for k, v in (("kernel", args.kernel), ("initrd", args.initrd), ("disk", args.disk))
             if v is not None}
    kind = "disk" if args.disk else "kernel"
    img = store.add(args.name, args.version, kind, files, cmdline=args.cmdline, fmt=args.format,
                    profiles=tuple(args.profile))
    console.print(f"image {img.name} {img.version} ({kind}) in {cfg.image_dir}", highlight=False, markup=False)
    return 0


def print_json(obj: object) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")
