"""A carve policy's identity across the fleet: the sha256 of its text.

hostd records it with a carve (``HostInfo.carved_policy_digest``) and refuses a
``Carve`` whose digest is not its text's; fleet-rollout plans, carves and checks hosts
by it. One definition, so both sides name a policy the same way.
"""

from __future__ import annotations

import hashlib


def policy_digest(text: str) -> str:
    """sha256 hex of the policy text's UTF-8 bytes, exactly as given (no normalising:
    the text a host is carved with is the text that was planned)."""
    return hashlib.sha256(text.encode()).hexdigest()
