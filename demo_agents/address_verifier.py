"""The address-verifier agent: the child run a purchase delegates to. SDK only.

Input: ``{"address": "1 Main St, 10115 Berlin, DE", "order": "..."}``. It holds only the grant its parent
delegated (``address:verify``). There is no address system in the demo world, so the check is local --
but it is still *declared* as the effect ``address:verify`` with an idempotency key before it counts,
so the delegated authority is exercised: revoke or suspend the parent's grant and the child's
declaration is denied. The verdict (with the normalised address the parent will ship to) is written
to the checkpoint, where the parent reads it from ``GET /runs/{child}``.

A bad address (no house/postal number, fewer than two comma-separated parts, or containing
"invalid"/"unknown") fails the child with ``address_invalid``; the parent then fails with
``address_verification_failed`` after its reservation -- something for an operator to compensate.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from controlplane_sdk import RunContext

from .common import AgentFailure, think

AGENT = "address-verifier"


def check_address(address: str) -> dict[str, Any]:
    """Pure, deterministic verdict: ``{"ok", "normalized", "reason", "id"}``."""
    parts = [re.sub(r"\s+", " ", p).strip() for p in address.split(",")]
    parts = [p for p in parts if p]
    normalized = ", ".join(parts)
    reason = ""
    if len(parts) < 2:
        reason = "needs at least a street and a town, separated by a comma"
    elif not re.search(r"\d", normalized):
        reason = "no house or postal number"
    elif re.search(r"\b(invalid|unknown)\b", normalized, re.I):
        reason = "the carrier does not know this address"
    digest = hashlib.sha256(normalized.lower().encode()).hexdigest()[:12]
    return {"ok": not reason, "normalized": normalized, "reason": reason, "id": f"addr_{digest}"}


def verify(ctx: RunContext) -> None:
    inp = ctx.get_run().get("input") or {}
    address = str(inp.get("address") or "")
    if "verdict" not in ctx.state:
        think()
        with ctx.step("verify"):
            verdict = check_address(address)
            with ctx.effect("address", "verify", args={"address": address}) as fx:
                if fx.already_done:  # an earlier attempt recorded it
                    verdict = (
                        fx.result if isinstance(fx.result, dict) and "ok" in fx.result else verdict
                    )
                else:
                    fx.committed(external_ref=verdict["id"], detail=verdict)
        ctx.checkpoint("verify", {"verdict": verdict})
    verdict = ctx.state["verdict"]
    if not verdict.get("ok"):
        raise AgentFailure(
            "address_invalid", f"address {address!r} rejected: {verdict.get('reason')}"
        )
