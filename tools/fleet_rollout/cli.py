"""`fleet-rollout`: convert and upgrade a storage fleet wave by wave, gated on the IO
service's health, resumable after any crash.

The rollouts are kept by the scheduler (``/v1/rollouts``): every operator sees every
rollout, and a rollout over hosts another active rollout has is refused at plan.

Exit codes: 0 done (run, resume), rolled back (rollback), or the command did what it
says (plan, status, pause); 1 error (one line naming the field, or the refusal); 2
usage; 3 the rollout stopped short: halted, paused or aborted, or the scheduler (the
rollouts' store) stopped answering (the rollout stays where it was; resume continues).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from rich.console import Console

from api.overlap import holders_subject, holders_text
from api.states import RolloutHostState, RolloutState
from tools.fleet_rollout.clients import HostdClients, Scheduler, SchedulerError, Tls
from tools.fleet_rollout.engine import Engine, Options
from tools.fleet_rollout.inventory import (
    Host,
    from_ansible_inventory,
    from_scheduler_items,
    select,
)
from tools.fleet_rollout.plan import FitsNone, Plan, make_plan
from tools.fleet_rollout.preflight import preflight
from tools.fleet_rollout.render import render_plan, render_status, status_dict
from tools.fleet_rollout.spec import RolloutSpec, SpecError, load_spec
from tools.fleet_rollout.store import Store, StoreError, StoreUnavailable, dead_here

log = logging.getLogger(__name__)

EXIT_STOPPED = 3
EPILOG = """examples:
  fleet-rollout plan convert.toml                 waves, racks, hosts skipped and why
  fleet-rollout run convert.toml                  start (or continue) the rollout it names
  fleet-rollout status convert-r12 [--json]
  fleet-rollout pause convert-r12                 the running controller stops at the next step
  fleet-rollout resume convert-r12                continue a paused or halted rollout here
  fleet-rollout abort convert-r12                 stop; hosts mid-change are rolled back
  fleet-rollout rollback convert-r12              undo every converted host, last wave first
environment: FLEET_ROLLOUT_SCHEDULER_URL, FLEET_ROLLOUT_TOKEN_FILE,
  FLEET_ROLLOUT_SCHEDULER_CA, FLEET_ROLLOUT_TLS_DIR stand for the options of the same name.
"""


def build_parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="fleet-rollout", description=__doc__.split("\n\n")[0], epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scheduler-url", default=env("FLEET_ROLLOUT_SCHEDULER_URL", ""),
                   help="the scheduler: it keeps the rollouts, and cordons hosts")
    p.add_argument("--token-file", type=Path, default=_path(env("FLEET_ROLLOUT_TOKEN_FILE")),
                   help="an admin token for the scheduler (rollouts, cordon, uncordon)")
    p.add_argument("--scheduler-ca", type=Path, default=_path(env("FLEET_ROLLOUT_SCHEDULER_CA")))
    p.add_argument("--tls-dir", type=Path, default=_path(env("FLEET_ROLLOUT_TLS_DIR")),
                   help="ca.crt, fleet-rollout.crt and fleet-rollout.key for hostd's mTLS")
    p.add_argument("--plaintext", action="store_true", help="gRPC without TLS (local development only)")
    p.add_argument("--lease-ttl", type=float, default=15.0, help="seconds a dead controller blocks the next")
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="cmd", required=True)
    pl = sub.add_parser("plan", help="inventory + preflight -> waves (changes nothing)")
    pl.add_argument("spec", type=Path)
    pl.add_argument("--json", action="store_true")
    pl.add_argument("--no-preflight", action="store_true", help="plan from the inventory alone (no RPCs)")
    r = sub.add_parser("run", help="start the rollout a spec names, or continue it")
    r.add_argument("spec", type=Path)
    r.add_argument("--json", action="store_true", help="print the final status as JSON")
    st = sub.add_parser("status", help="where a rollout stands")
    st.add_argument("name", nargs="?")
    st.add_argument("--json", action="store_true")
    st.add_argument("--transitions", action="store_true", help="every recorded transition (with --json)")
    for verb, what in (("pause", "stop at the next step boundary"), ("resume", "continue here"),
                       ("abort", "stop and roll back hosts mid-change"),
                       ("rollback", "roll back every changed host, last wave first")):
        c = sub.add_parser(verb, help=what)
        c.add_argument("name")
        c.add_argument("--json", action="store_true")
    return p


def _path(v: str | None) -> Path | None:
    return Path(v) if v else None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    console = Console(stderr=False)
    args.opened = []  # the scheduler clients the command opened, closed at its end
    try:
        return COMMANDS[args.cmd](args, console)
    except SpecError as e:
        print(f"fleet-rollout: {e.field}: {e.reason}", file=sys.stderr)
    except StoreUnavailable as e:
        name = getattr(args, "name", None) or "NAME"
        print(f"fleet-rollout: {e}; the rollout stays where it was (`fleet-rollout resume {name}` "
              "continues it)", file=sys.stderr)
        return EXIT_STOPPED
    except (StoreError, SchedulerError) as e:
        print(f"fleet-rollout: {e}", file=sys.stderr)
    finally:
        for c in args.opened:
            c.close()
    return 1


# ------------------------------------------------------------------ wiring


def _hostd(args: argparse.Namespace, spec: RolloutSpec | None = None) -> HostdClients:
    if args.plaintext:
        return HostdClients(None, spec.limits.rpc_timeout_s if spec else 10.0)
    if args.tls_dir is None:
        raise SpecError("--tls-dir", "hostd's mTLS needs the CA and the fleet-rollout client certificate "
                                     "(or --plaintext for local development)")
    return HostdClients(Tls.from_dir(args.tls_dir), spec.limits.rpc_timeout_s if spec else 10.0)


def _scheduler(args: argparse.Namespace, spec: RolloutSpec | None = None) -> Scheduler | None:
    if not args.scheduler_url:
        return None
    if args.token_file is None:
        raise SpecError("--token-file", "the scheduler needs an admin token")
    try:
        token = args.token_file.read_text().strip()
    except OSError as e:
        raise SpecError("--token-file", f"{e.filename}: {e.strerror}") from None
    return Scheduler(args.scheduler_url, token, ca=args.scheduler_ca,
                     connections=spec.limits.concurrency if spec else 20)


def _store(args: argparse.Namespace, spec: RolloutSpec | None = None) -> Store:
    sched = _scheduler(args, spec)
    if sched is None:
        raise SpecError("--scheduler-url", "the scheduler keeps the rollouts: give its URL "
                                           "(or FLEET_ROLLOUT_SCHEDULER_URL)")
    args.opened.append(sched)
    return Store(sched, retry_s=spec.limits.unreachable_s if spec else 15.0)


def _inventory(args: argparse.Namespace, spec: RolloutSpec, base: Path) -> list[Host]:
    if spec.inventory.source == "scheduler":
        sched = _scheduler(args)
        if sched is None:
            raise SpecError("inventory.source", "is 'scheduler' but no --scheduler-url is given")
        try:
            hosts = from_scheduler_items(sched.hosts())
        finally:
            sched.close()
    else:
        path = Path(spec.inventory.source)
        hosts = from_ansible_inventory(path if path.is_absolute() else base / path)
    return select(hosts, spec.inventory.select) if spec.inventory.select else hosts


def make_rollout_plan(args: argparse.Namespace, spec: RolloutSpec, base: Path, *, check: bool = True) -> Plan:
    hosts = _inventory(args, spec, base)
    refused = {}
    if check:
        clients = _hostd(args, spec)
        try:
            refused = preflight(clients, hosts, spec)
        finally:
            clients.close()
    return make_plan(hosts, spec, refused)


# ------------------------------------------------------------------ commands


def _plan(args: argparse.Namespace, console: Console) -> int:
    spec = load_spec(args.spec)
    plan = make_rollout_plan(args, spec, args.spec.parent, check=not args.no_preflight)
    if args.json:
        print(json.dumps({"name": spec.name, "policy_digest": spec.policy_digest, **plan.to_dict()}, indent=2))
    else:
        render_plan(plan, console)
    return 0


def _run(args: argparse.Namespace, console: Console) -> int:
    spec = load_spec(args.spec)
    args.name = spec.name  # for the hint if the scheduler stops answering
    store = _store(args, spec)
    stored = store.find(spec.name)
    if stored is not None:
        if stored.spec != spec:  # every key, the policy's text included
            raise SpecError("name", f"rollout {spec.name} exists with a different spec: give the new one "
                                    "another name (status/resume/rollback act on this one)")
        if stored.state != RolloutState.RUNNING:
            raise StoreError(f"rollout {spec.name} is {stored.state}: `fleet-rollout resume {spec.name}` continues it")
    else:
        try:
            plan = make_rollout_plan(args, spec, args.spec.parent)
        except FitsNone as e:
            _refuse_held(store, spec.name, e)
            raise
        if not args.json:
            render_plan(plan, console)
        store.create(spec, plan)  # refused if another active rollout has any of its hosts
    return _drive(args, store, spec.name, console)


def _refuse_held(store: Store, name: str, e: FitsNone) -> None:
    """When no selected host can take the change because other active rollouts hold them
    (the hosts a running rollout has just converted say "already converted"), say whose
    they are, as the scheduler's overlap refusal would at create, instead of only
    ``e``'s first host's reason. If the scheduler cannot say, ``e`` stands alone."""
    try:
        held = store.holders(e.hosts)
    except StoreError:
        return
    if not held:
        return
    raise StoreError(f"rollout {name} {e.reason}, and {holders_subject(len(held))} "
                     f"{'holds' if len(held) == 1 else 'hold'} {sum(len(hs) for _, _, hs in held)} of them "
                     f"(a host belongs to at most one): {holders_text(held)}")


def _drive(args: argparse.Namespace, store: Store, name: str, console: Console) -> int:
    spec = store.rollout(name).spec
    hostd, sched = _hostd(args, spec), _scheduler(args, spec)
    store.retry_s = spec.limits.unreachable_s

    def event(host: str, frm: str, to: str) -> None:
        if not args.json and to in (RolloutHostState.VERIFIED, RolloutHostState.FAILED, RolloutHostState.ROLLED_BACK):
            console.print(f"{host}: {frm} -> {to}", highlight=False, markup=False)
    try:
        final = Engine(store, name, hostd, sched, Options(lease_ttl_s=args.lease_ttl), on_event=event).run()
    finally:
        hostd.close()
        if sched:
            sched.close()
    return _show(args, store, name, console,
                 ok=final == RolloutState.DONE and args.cmd != "rollback"
                 or args.cmd == "rollback" and final == RolloutState.ROLLED_BACK)


def _show(args: argparse.Namespace, store: Store, name: str, console: Console, *, ok: bool = True) -> int:
    st = status_dict(store, name)
    if getattr(args, "transitions", False):
        st["transitions"] = store.transitions(name)
    if args.json:
        print(json.dumps(st, indent=2))
    else:
        render_status(st, console)
    return 0 if ok else EXIT_STOPPED


def _status(args: argparse.Namespace, console: Console) -> int:
    store = _store(args)
    names = [args.name] if args.name else store.rollouts()
    if not names:
        console.print(f"no rollouts at {store.where}")
        return 0
    for n in names:
        _show(args, store, n, console)
    return 0


def _operator(to: str, drive: bool):  # type: ignore[no-untyped-def]
    """The scheduler decides which states a command applies to (hyb.rollout.bad_state)."""
    def cmd(args: argparse.Namespace, console: Console) -> int:
        store = _store(args)
        r = store.rollout(args.name)
        live = r.lease if r.lease and r.lease.holder != store.holder and not dead_here(r.lease.holder) else None
        if not (args.cmd == "resume" and r.state == RolloutState.RUNNING and live is None):
            # (a running rollout whose controller is gone, e.g. the scheduler was away: just drive it)
            # from the state just read: if the controller or another operator moved it since, refused
            store.set_rollout(args.name, to, f"by {store.holder}", fenced=False, expect=r.state)
        if drive and live is None:
            return _drive(args, store, args.name, console)
        console.print(f"rollout {args.name}: {to}" + (f" (the controller {live.holder} acts on it)" if live else ""),
                      highlight=False, markup=False)
        return 0
    return cmd


COMMANDS = {
    "plan": _plan, "run": _run, "status": _status,
    "pause": _operator(RolloutState.PAUSED, drive=False),
    # resume on a done rollout retries the rollbacks that could not finish (hosts left held)
    "resume": _operator(RolloutState.RUNNING, drive=True),
    "abort": _operator(RolloutState.ABORTING, drive=True),
    "rollback": _operator(RolloutState.ROLLING_BACK, drive=True),
}


if __name__ == "__main__":
    sys.exit(main())
