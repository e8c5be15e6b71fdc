"""Which hosts a rollout acts on: the scheduler's registered hosts, or an Ansible
inventory file (INI or YAML, read by ``ansible-inventory`` itself so every form
Ansible accepts works), narrowed by a selector (``rack=r12,disk=nvme``).

A host's failure domain is its rack: the scheduler's ``rack``, or in a file the host
variable ``rack`` or membership of a group named ``rack_<name>``. A host that lands
in two racks is an error naming it, as is a selector that matches nothing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tools.fleet_rollout.spec import SpecError

HOSTD_PORT = 7443


@dataclass(frozen=True)
class Host:
    name: str
    address: str  # hostd's gRPC host:port
    rack: str
    labels: dict[str, str] = field(default_factory=dict, hash=False)
    admin_state: str = ""  # the scheduler's, when it comes from there

    def to_dict(self) -> dict:
        return {"name": self.name, "address": self.address, "rack": self.rack, "labels": self.labels,
                "admin_state": self.admin_state}

    @classmethod
    def from_dict(cls, d: dict) -> Host:
        return cls(d["name"], d["address"], d["rack"], dict(d.get("labels", {})), d.get("admin_state", ""))


def parse_selector(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for i, part in enumerate(p.strip() for p in text.split(",") if p.strip()):
        key, eq, value = part.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise SpecError("inventory.select", f"[{i}] {part!r} is not label=value")
        if key.strip() in out:
            raise SpecError("inventory.select", f"{key.strip()!r} given twice")
        out[key.strip()] = value.strip()
    return out


def select(hosts: Iterable[Host], selector: str) -> list[Host]:
    want = parse_selector(selector)
    every = list(hosts)
    out = [h for h in every if all((h.rack if k == "rack" else h.name if k == "name" else h.labels.get(k)) == v
                                    for k, v in want.items())]
    if not out:
        raise SpecError("inventory.select", f"{selector!r} matches none of the {len(every)} hosts")
    return out


def from_scheduler_items(items: list[dict]) -> list[Host]:
    return [Host(h["name"], h["address"], h.get("rack", ""), dict(h.get("labels", {})), h.get("admin_state", ""))
            for h in items]


def from_ansible_inventory(path: Path) -> list[Host]:
    """Hosts of an Ansible inventory file, as ``ansible-inventory --list`` resolves it."""
    if not path.exists():
        raise SpecError("inventory.source", f"{path}: no such file")
    exe = shutil.which("ansible-inventory", path=str(Path(sys.executable).parent)) or "ansible-inventory"
    try:
        r = subprocess.run([exe, "-i", str(path), "--list"], capture_output=True, text=True, timeout=120, check=False,
                           env={"ANSIBLE_INVENTORY_UNPARSED_FAILED": "true", "ANSIBLE_NOCOLOR": "1",
                                "PATH": "/usr/bin:/bin", "HOME": "/tmp"})
    except FileNotFoundError:
        raise SpecError("inventory.source", "ansible-inventory is not installed") from None
    if r.returncode != 0:
        raise SpecError("inventory.source", f"{path}: {r.stderr.strip().splitlines()[-1] if r.stderr else 'unreadable'}")
    return hosts_from_inventory_json(json.loads(r.stdout))


def hosts_from_inventory_json(inv: dict) -> list[Host]:
    hostvars: dict[str, dict] = inv.get("_meta", {}).get("hostvars", {})
    racks: dict[str, set[str]] = {}
    members: dict[str, set[str]] = {}

    def walk(group: str, seen: frozenset[str] = frozenset()) -> set[str]:
        g = inv.get(group, {})
        out = set(g.get("hosts", []))
        for child in g.get("children", []):
            if child not in seen:
                out |= walk(child, seen | {group})
        return out

    for group in inv:
        if group == "_meta":
            continue
        hs = walk(group)
        for h in hs:
            members.setdefault(h, set())
            if group.startswith("rack_"):
                racks.setdefault(h, set()).add(group.removeprefix("rack_"))
    out = []
    for name in sorted(set(hostvars) | set(members)):
        v = hostvars.get(name, {})
        rack_set = set(racks.get(name, set()))
        if v.get("rack"):
            rack_set.add(str(v["rack"]))
        if len(rack_set) > 1:
            raise SpecError("inventory.source", f"host {name} is in two racks: {', '.join(sorted(rack_set))}")
        address = str(v.get("hostd_address") or f"{v.get('ansible_host', name)}:{v.get('hostd_port', HOSTD_PORT)}")
        labels = {k: str(x) for k, x in v.items()
                  if not k.startswith("ansible_") and k not in ("rack", "hostd_address", "hostd_port")
                  and isinstance(x, (str, int, float))}
        out.append(Host(name, address, next(iter(rack_set), ""), labels))
    return out
