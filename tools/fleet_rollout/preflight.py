"""Preflight: ask every selected host, in parallel, whether it can take the change
(PlanCarve for a policy, GetHostInfo for a hostd version). Read-only RPCs. A host that
cannot is skipped with hostd's reason; it is never attempted. A host whose VMs the
policy would not hold can, when the rollout may drain (``steps.drain_timeout_s``): the
scheduler moves its VMs first."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from tools.fleet_rollout.clients import HostdClients, HostError
from tools.fleet_rollout.inventory import Host
from tools.fleet_rollout.spec import RolloutSpec

PARALLEL = 64


def refusal(clients: HostdClients, host: Host, spec: RolloutSpec) -> str | None:
    """Why ``host`` cannot take the change, or None."""
    try:
        if spec.kind == "hostd":
            info = clients.info(host.address)
            return f"already runs hostd {info.version}" if info.version == spec.hostd_version else None
        if spec.kind == "convert":
            info = clients.info(host.address)
            if info.carved_digest and info.carved_digest != spec.policy_digest:
                return f"already converted with policy {info.carved_digest[:12]} (a kind = policy rollout changes it)"
        r = clients.plan_carve(host.address, spec.policy_text)
    except HostError as e:
        return f"preflight: {e}"
    if r.HasField("nofit") and r.nofit.field:
        return f"does not fit [{r.nofit.field}]: {r.nofit.reason}"
    if r.vm_conflicts and spec.steps.drain_timeout_s <= 0:  # else the rollout drains the host first
        return "running VMs would not fit: " + "; ".join(r.vm_conflicts)
    if r.already_carved:
        return "already carved with this policy"
    return None


def preflight(clients: HostdClients, hosts: list[Host], spec: RolloutSpec) -> dict[str, str]:
    with ThreadPoolExecutor(max_workers=min(PARALLEL, max(1, len(hosts)))) as pool:
        answers = list(pool.map(lambda h: refusal(clients, h, spec), hosts))
    return {h.name: why for h, why in zip(hosts, answers) if why is not None}
