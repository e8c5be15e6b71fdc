"""`hostd` command line: discover, plan, carve, uncarve, serve.

Exit codes: 0 ok, 1 error (message names the field), 2 usage, 3 the policy does
not fit this host (NoFit).

`carve` and `uncarve` are the Carve and Uncarve RPCs' service run from here: beside a
running `hostd serve` they wait for its carve lock and refuse what it would refuse
(a layout that would not hold its VMs, an uncarve under running VMs), with the same
error codes.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from hostd.errors import HostdError

log = logging.getLogger(__name__)

EPILOG = """examples:
  hostd discover                       this host, as tables
  hostd discover --json > host.json    the topology interface (api/topology.md)
  hostd plan --topology host.json --policy policy.toml
  hostd carve --policy policy.toml --dry-run
  hostd carve --policy policy.toml     apply; the journal lets uncarve restore
  hostd uncarve                        put the host back as it was (no VM may run)
  hostd uncarve --drained              ... with stopped VMs left on it
  hostd image add smoke --kernel vmlinuz --initrd initrd.img --cmdline "console=ttyS0"
  hostd --config /etc/hostd/hostd.toml serve
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hostd", description="Storage-host carving and VM daemon.",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, help="hostd TOML config (default /etc/hostd/hostd.toml)")
    p.add_argument("-v", "--verbose", action="store_true", help="log every step")
    sub = p.add_subparsers(dest="cmd", required=True)

    d = sub.add_parser("discover", help="print the host topology")
    _discover_args(d)
    d.add_argument("--json", action="store_true", help="JSON (api/topology.md)")
    d.add_argument("--policy", type=Path, help="take the disk allow-list from this policy")

    pl = sub.add_parser("plan", help="topology + policy -> host layout (pure, changes nothing)")
    pl.add_argument("--topology", type=Path, help="JSON from `hostd discover --json` (default: this host)")
    pl.add_argument("--policy", type=Path, help="carve policy TOML (default: config's policy)")
    pl.add_argument("--json", action="store_true")
    _discover_args(pl)

    c = sub.add_parser("carve", help="apply the plan's live part to this host")
    c.add_argument("--policy", type=Path, help="carve policy TOML (default: config's policy)")
    c.add_argument("--dry-run", action="store_true", help="print the steps, change nothing")
    c.add_argument("--json", action="store_true")
    c.add_argument("--state-dir", type=Path, help="where the carve journal lives")
    _wait_arg(c)
    _expect_args(c)
    _discover_args(c)

    s = sub.add_parser("serve", help="run the daemon: gRPC API (api/hostd.proto) over libvirt")
    s.add_argument("--ready-file", type=Path, help="write 'PID PORT' here once serving (tests, units)")

    im = sub.add_parser("image", help="the guest image store VMs name (hostd/apply/images.py)")
    isub = im.add_subparsers(dest="image_cmd", required=True)
    ia = isub.add_parser("add", help="register an image (files are checksummed, not copied)")
    ia.add_argument("name", nargs="?", help="image name (default: the manifest's, with --from)")
    ia.add_argument("--from", dest="from_dir", type=Path,
                    help="a built guestimages/ output dir: its manifest.json gives files, cmdline, "
                         "profiles and kernel capabilities")
    ia.add_argument("--version", default="1")
    ia.add_argument("--kernel", type=Path, help="direct kernel boot: vmlinuz")
    ia.add_argument("--initrd", type=Path)
    ia.add_argument("--cmdline", default="")
    ia.add_argument("--disk", type=Path, help="a root disk image instead of a kernel")
    ia.add_argument("--format", default="raw", choices=["raw", "qcow2"])
    ia.add_argument("--profile", action="append", default=[], help="tuning profile it supports")
    isub.add_parser("list", help="the registered images")

    u = sub.add_parser("uncarve", help="undo every recorded carve step, newest first")
    u.add_argument("--dry-run", action="store_true")
    u.add_argument("--state-dir", type=Path)
    u.add_argument("--drained", action="store_true",
                   help="the VMs left on this host (none running) are drained: uncarve under them")
    _wait_arg(u)
    _expect_args(u)
    return p


def _expect_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--expect", metavar="DIGEST",
                   help="refuse (hyb.carve.conflict) unless the host is carved with this digest "
                        "('' = uncarved), as the Carve RPC does; without it the command acts on "
                        "whatever the host carries")
    p.add_argument("--operation", metavar="ID", help="recorded as the carve's operation "
                   "(default hostd-cli:<user>:<time>)")


def _wait_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--wait", type=float, default=60.0, metavar="SECONDS",
                   help="wait this long for another carve (or hostd's VM changes) to finish, then "
                        "refuse with hyb.carve.busy (default %(default)s)")


def _discover_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", type=Path, help="read /sys,/proc,/dev under this directory")
    p.add_argument("--virt-type", choices=["kvm", "qemu"], help="override config virt_type")
    p.add_argument("--allow", action="append", default=None, metavar="PATTERN",
                   help="disk allow-list entry (name, id, /dev path, glob); repeatable")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose or args.cmd == "serve" else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr)
    # soft_wrap: a line is never broken at the terminal's width (a path in an error,
    # a step, piped into a log or read by a script); tables still fit the width
    console = Console(soft_wrap=True)
    from hostd import commands  # the heavy imports only once arguments parsed

    try:
        return commands.run(args, console)
    except HostdError as e:
        Console(stderr=True, soft_wrap=True).print(f"[red]error[/red] {escape(str(e))}", highlight=False)
        return 1
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0



if __name__ == "__main__":
    sys.exit(main())
