"""The control plane's adapters for the demo world (listed in ``settings.CONTROLPLANE_ADAPTERS``).

Importing this module registers, in ``interventions.registry``:

compensators -- each undoes one committed effect with the *compensation's* idempotency key, so a
  retried compensation can never undo twice:
    (inventory, reserve)      -> POST /inventory/release   {reservation_id}
    (shipping, create_label)  -> POST /shipping/void_label {label_id}
    (payments, charge)        -> POST /payments/refund     {charge_id}
    (notifications, enqueue)  -> POST /notifications/cancel {notification_id}; a notification that
                                 has already been sent gives ok=False, retryable=False (irreversible).
  The target id comes from ``EffectInfo.external_ref``, else the named field in ``outcome_detail``,
  else the world's own record under the effect's idempotency key (an effect reconciled as committed
  may have no ref yet). Results: ok=True on success (also when it was already undone);
  retryable=False when retrying cannot help (unknown object, already sent, key reused); otherwise
  retryable=True (world down, no answer, an injected refusal).

reconcilers (inventory, shipping, payments, notifications) -- ``GET /{tool}/by-key/{key}``:
  committed -> "committed" (external_ref = the id the world created), a stored business refusal ->
  "failed", never seen -> "not_found", world down / no answer -> "unknown".

key voiders (every tool) -- ``POST /{tool}/by-key/{key}/void``: the world refuses the key for good
  ("failed": it can never commit), or says it already committed ("committed") / refused it ("failed").
  A reconciler's "not_found" becomes ``failed`` only after this (unknown until known:
  docs/concepts/contracts.md, "Reconcile").

redaction -- payments ``card`` / ``card_number`` are shown masked to the last four digits.

assumption checkers (the assumption key names the sku; ``meta`` tunes the check):
  ``price`` (key ``price:sku-1``; recorded value = the price the run relied on) -- ok while the current
    price is within ``meta["tolerance"]`` (absolute, default 0) or ``meta["tolerance_pct"]`` (percent)
    of the recorded one. A drop beyond tolerance also fails unless ``meta["allow_decrease"]`` is true.
  ``stock`` (key ``stock:sku-1``; recorded value = the stock seen, informational) -- ok while the current
    stock is >= ``meta["need"]`` (default 1): the quantity the run still has to reserve.
  If the world cannot answer, the fact is *not* confirmed: ok=False with a "could not check" detail.

The world URL is read from ``django.conf.settings.WORLD_URL`` at call time (falling back to the
WORLD_URL environment variable, then http://127.0.0.1:8100), so this module imports without Django
settings being configured. ``settings.WORLD_TIMEOUT_S`` (default 5 s) bounds every call.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from interventions.registry import (
    AssumptionCheck,
    CompensationResult,
    EffectInfo,
    ReconcileResult,
    assumption_checker,
    compensator,
    key_voider,
    reconciler,
    redaction,
)

from .client import DEFAULT_URL, WorldClient, WorldClientError, WorldError, WorldTimeout

# (tool, action) of the effect -> (undo action, id field the undo takes)
UNDO = {
    ("inventory", "reserve"): ("release", "reservation_id"),
    ("shipping", "create_label"): ("void_label", "label_id"),
    ("payments", "charge"): ("refund", "charge_id"),
    ("notifications", "enqueue"): ("cancel", "notification_id"),
}
# The action a by-key answer names for a voided key (world.store.VOID_ACTION, over HTTP).
VOID_ACTION = "void_key"
# World refusals that a retry can never turn into a success.
FINAL_ERRORS = {"already_sent", "idempotency_key_reused", "invalid_request"}


def _setting(name: str, default: Any) -> Any:
    try:
        from django.conf import settings

        return getattr(settings, name, default)
    except Exception:  # settings not configured (e.g. a script or a test without Django)
        return default


def world_client() -> WorldClient:
    url = _setting("WORLD_URL", None) or os.environ.get("WORLD_URL") or DEFAULT_URL
    return WorldClient(url, timeout=float(_setting("WORLD_TIMEOUT_S", 5.0)))


def _failure(exc: WorldClientError, **detail: Any) -> CompensationResult:
    info: dict[str, Any] = {
        "error": getattr(exc, "error", type(exc).__name__),
        "message": str(exc),
        **detail,
    }
    if isinstance(exc, WorldError):
        info["status"], info["body"] = exc.status, exc.body
        # A stored refusal is final (a replay gives the same answer); an injected one is not.
        retryable = exc.injected or (exc.status not in (404, 409) and exc.error not in FINAL_ERRORS)
    else:
        info["ambiguous"] = exc.ambiguous
        retryable = True  # the compensation key makes a retry safe even if this one committed
    return CompensationResult(ok=False, detail=info, retryable=retryable)


def _target_id(client: WorldClient, effect: EffectInfo, field: str) -> str:
    if effect.external_ref:
        return effect.external_ref
    if effect.outcome_detail.get(field):
        return str(effect.outcome_detail[field])
    found = client.by_key(effect.tool, effect.idempotency_key)
    if found.get("committed"):
        return str(found["result"].get(field) or found["result"].get("id") or "")
    return ""


def _compensate(effect: EffectInfo, compensation_key: str) -> CompensationResult:
    undo_action, field = UNDO[(effect.tool, effect.action)]
    with world_client() as client:
        try:
            target = _target_id(client, effect, field)
            if not target:
                # The ledger says committed but the world knows no object for it: an operator must look.
                return CompensationResult(
                    ok=False,
                    retryable=False,
                    detail={
                        "error": "no_reference",
                        "message": f"no {field} for effect {effect.idempotency_key!r} and the world has no "
                        f"committed call under that key",
                    },
                )
            result = client.perform(effect.tool, undo_action, {field: target}, compensation_key)
        except WorldClientError as exc:
            return _failure(exc, action=undo_action)
    return CompensationResult(ok=True, external_ref=str(result.get("id", target)), detail=result)


def _register_compensators() -> None:
    for tool, action in UNDO:
        compensator(tool, action)(_compensate)


def reconcile(tool: str, action: str, idempotency_key: str) -> ReconcileResult:
    try:
        with world_client() as client:
            found = client.by_key(tool, idempotency_key)
    except WorldTimeout as exc:
        return ReconcileResult("unknown", evidence={"error": "timeout", "message": str(exc)})
    except WorldClientError as exc:
        return ReconcileResult(
            "unknown", evidence={"error": getattr(exc, "error", "unavailable"), "message": str(exc)}
        )
    evidence = {"source": f"GET /{tool}/by-key/{idempotency_key}", **found}
    if not found.get("found"):
        return ReconcileResult("not_found", evidence=evidence)
    if found.get("action") == VOID_ACTION:  # voided earlier: nothing can ever commit under it
        return ReconcileResult("failed", evidence={**evidence, "voided": True})
    return _known(found, action, evidence)


def _known(found: dict[str, Any], action: str, evidence: dict[str, Any]) -> ReconcileResult:
    if found.get("action") != action:
        # The key committed a *different* operation: neither answer is true for this effect.
        return ReconcileResult("unknown", evidence={**evidence, "error": "action_mismatch"})
    result = found.get("result") or {}
    if found.get("committed"):
        return ReconcileResult(
            "committed", external_ref=str(result.get("id", "")), evidence=evidence
        )
    return ReconcileResult("failed", evidence=evidence)


def void_key(tool: str, action: str, idempotency_key: str) -> ReconcileResult:
    source = f"POST /{tool}/by-key/{idempotency_key}/void"
    try:
        with world_client() as client:
            answer = client.void_key(tool, idempotency_key)
    except WorldClientError as exc:
        error = "timeout" if isinstance(exc, WorldTimeout) else getattr(exc, "error", "unavailable")
        return ReconcileResult("unknown", evidence={"error": error, "message": str(exc)})
    evidence = {"source": source, **answer}
    if answer.get("voided"):
        return ReconcileResult("failed", evidence=evidence)
    return _known(answer, action, evidence)  # it happened before the void: report what did


def _register_reconcilers() -> None:
    for tool in ("inventory", "shipping", "payments", "notifications"):
        reconciler(tool)(reconcile)
        key_voider(tool)(void_key)
    redaction("payments", {"card": "last4", "card_number": "last4"})


def _sku(key: str, meta: dict[str, Any]) -> str:
    return str(meta.get("sku") or (key.split(":", 1)[1] if ":" in key else key))


def _current_item(key: str, meta: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    sku = _sku(key, meta)
    try:
        with world_client() as client:
            return client.get_item(sku), sku
    except WorldError as exc:
        if exc.status == 404:
            return None, sku
        raise


def _guarded(fn: Callable[[str, Any, dict[str, Any]], AssumptionCheck]):
    def check(key: str, recorded: Any, meta: dict[str, Any] | None) -> AssumptionCheck:
        try:
            return fn(key, recorded, meta or {})
        except WorldClientError as exc:
            return AssumptionCheck(
                ok=False, current_value=None, detail=f"could not check {key}: {exc}"
            )

    check.__name__ = fn.__name__
    return check


@assumption_checker("price")
@_guarded
def check_price(key: str, recorded: Any, meta: dict[str, Any]) -> AssumptionCheck:
    item, sku = _current_item(key, meta)
    if item is None:
        return AssumptionCheck(ok=False, detail=f"{sku} no longer exists")
    current = float(item["price"])
    try:
        before = float(recorded)
    except (TypeError, ValueError):
        return AssumptionCheck(
            ok=False, current_value=current, detail=f"recorded price {recorded!r} is not a number"
        )
    tolerance = float(meta.get("tolerance", 0))
    if "tolerance_pct" in meta:
        tolerance = max(tolerance, abs(before) * float(meta["tolerance_pct"]) / 100)
    delta = current - before
    ok = abs(delta) <= tolerance + 1e-9 or (delta < 0 and bool(meta.get("allow_decrease")))
    verb = "unchanged" if delta == 0 else ("within tolerance" if ok else "changed")
    return AssumptionCheck(
        ok=ok,
        current_value=current,
        detail=f"price of {sku} was {before}, now {current} ({verb}; tolerance {tolerance})",
    )


@assumption_checker("stock")
@_guarded
def check_stock(key: str, recorded: Any, meta: dict[str, Any]) -> AssumptionCheck:
    item, sku = _current_item(key, meta)
    if item is None:
        return AssumptionCheck(ok=False, detail=f"{sku} no longer exists")
    current, need = int(item["stock"]), int(meta.get("need", 1))
    ok = current >= need
    return AssumptionCheck(
        ok=ok,
        current_value=current,
        detail=f"stock of {sku} is {current} (was {recorded}); need {need}: "
        f"{'enough' if ok else 'not enough'}",
    )


_register_compensators()
_register_reconcilers()
