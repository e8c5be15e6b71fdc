"""Who may call what on hostd's gRPC API.

mTLS proves a caller holds a certificate the fleet CA signed, and every hostd holds
one: that alone must not let one storage host create, stop or delete VMs on another
(or, with the rollout RPCs, carve it). Read-only RPCs are open to any certificate the
CA signed; mutating ones only to the identities in ``rpc_mutating_callers`` (the
scheduler's and fleet-rollout's certificate names). An identity is a DNS or URI
subject alternative name of the client certificate, or its common name.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import grpc

from hostd.errors import Forbidden

log = logging.getLogger(__name__)

# Every RPC that changes a VM or the host. A new mutating RPC must be added here;
# tests/hostd/rpc/test_grpc_callers.py fails for an RPC that is in neither set.
MUTATING = frozenset({"CreateVM", "DeleteVM", "StartVM", "StopVM", "UpdateIOLimits", "Carve", "Uncarve",
                      "PrepareMigration", "MigrateVM", "CompleteMigration", "AbortMigration"})
READ_ONLY = frozenset({"GetVM", "ListVMs", "GetInventory", "Health", "WatchEvents", "GetHostStats",
                       "GetHostInfo", "PlanCarve", "GetMigration"})


def peer_identities(ctx: grpc.ServicerContext) -> list[str]:
    """The client certificate's SAN names and CN ([] without TLS)."""
    auth = ctx.auth_context()
    names = [*auth.get("x509_subject_alternative_name", ()), *auth.get("x509_common_name", ())]
    return list(dict.fromkeys(n.decode() if isinstance(n, bytes) else str(n) for n in names))


@dataclass(frozen=True)
class CallerCheck:
    """``mutating``: identities allowed to call MUTATING RPCs. ``None`` means there are no
    identities to check (plaintext gRPC, local development only): everything is allowed."""

    mutating: frozenset[str] | None

    def check(self, ctx: grpc.ServicerContext, method: str) -> None:
        if self.mutating is None or method not in MUTATING:
            return
        who = peer_identities(ctx)
        if not any(n in self.mutating for n in who):
            log.warning("rpc denied method=%s caller=%s peer=%s", method, ",".join(who) or "-", ctx.peer())
            raise Forbidden(f"caller {', '.join(who) or '(no certificate name)'} may not call {method} "
                            f"(allowed: {', '.join(sorted(self.mutating)) or 'nobody'}; "
                            "hostd.toml rpc_mutating_callers)", field="caller")
