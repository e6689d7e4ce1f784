"""The only knowledge the control plane has of external systems.

Adapter modules (settings.CONTROLPLANE_ADAPTERS, e.g. ``world.adapters``) register three kinds of
callables here. They are plain functions of plain data -- no ORM objects cross this boundary, so an
adapter can be tested without Django and can never write control-plane state behind the services'
back. They do network I/O, so services call them *outside* any database transaction.

- ``@compensator(tool, action)``: undo one committed effect; gets an :class:`EffectInfo` and the
  compensation's own idempotency key, returns :class:`CompensationResult`.
- ``@reconciler(tool)``: ask the external system whether an idempotency key committed; returns
  :class:`ReconcileResult`.
- ``@assumption_checker(name)``: re-read a fact a run relied on; returns :class:`AssumptionCheck`.
- ``@key_voider(tool)``: make the external system refuse an idempotency key for good (a by-key
  void/cancel); returns :class:`ReconcileResult`: ``failed`` once the key can never commit (voided
  now or before), ``committed`` if it already had, ``unknown`` if the system could not answer.

And two declarations (plain data):

- ``commit_window(tool, seconds)``: the provider's documented window -- a call under a key is never
  committed later than this after it was sent. Past it, a key the system never saw is ``failed``.
- ``redaction(tool, {"card_number": "last4"})``: how sensitive args are shown to people (the inbox,
  previews, the run page): ``last4`` keeps the last four characters, ``hide`` shows nothing.
  Stored args are not changed (fingerprints and compensations need them).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from django.conf import settings

from core.redaction import redact as redact_value


@dataclass(frozen=True)
class EffectInfo:
    tool: str
    action: str
    idempotency_key: str
    args: dict[str, Any]
    external_ref: str = ""
    outcome_detail: dict[str, Any] = field(default_factory=dict)
    compensation: dict[str, Any] | None = (
        None  # {"tool": ..., "action": ..., "args": {...}} as declared
    )


@dataclass(frozen=True)
class CompensationResult:
    ok: bool
    external_ref: str = ""
    detail: dict[str, Any] = field(default_factory=dict)
    retryable: bool = True  # False: retrying cannot help (e.g. notification already sent)


@dataclass(frozen=True)
class ReconcileResult:
    # committed/failed: the external system knows the key; not_found: it never saw it (so it did not
    # commit); unknown: the system could not answer (down, timeout) -- try again later.
    outcome: Literal["committed", "failed", "not_found", "unknown"]
    external_ref: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AssumptionCheck:
    ok: bool  # True: the fact still holds
    current_value: Any = None
    detail: str = ""


Compensator = Callable[[EffectInfo, str], CompensationResult]
KeyVoider = Callable[[str, str, str], ReconcileResult]  # (tool, action, idempotency_key)
MASKS = ("last4", "hide")
Reconciler = Callable[[str, str, str], ReconcileResult]  # (tool, action, idempotency_key)
AssumptionChecker = Callable[
    [str, Any, dict[str, Any]], AssumptionCheck
]  # (key, recorded value, meta)

_compensators: dict[tuple[str, str], Compensator] = {}
_reconcilers: dict[str, Reconciler] = {}
_checkers: dict[str, AssumptionChecker] = {}
_voiders: dict[str, KeyVoider] = {}
_commit_windows: dict[str, float] = {}
_redactions: dict[str, dict[str, str]] = {}
_loaded = False


def compensator(tool: str, action: str) -> Callable[[Compensator], Compensator]:
    def register(fn: Compensator) -> Compensator:
        _compensators[(tool, action)] = fn
        return fn

    return register


def reconciler(tool: str) -> Callable[[Reconciler], Reconciler]:
    def register(fn: Reconciler) -> Reconciler:
        _reconcilers[tool] = fn
        return fn

    return register


def assumption_checker(name: str) -> Callable[[AssumptionChecker], AssumptionChecker]:
    def register(fn: AssumptionChecker) -> AssumptionChecker:
        _checkers[name] = fn
        return fn

    return register


def key_voider(tool: str) -> Callable[[KeyVoider], KeyVoider]:
    def register(fn: KeyVoider) -> KeyVoider:
        _voiders[tool] = fn
        return fn

    return register


def commit_window(tool: str, seconds: float) -> None:
    if not seconds > 0:
        raise ValueError("a commit window is a positive number of seconds")
    _commit_windows[tool] = float(seconds)


def redaction(tool: str, fields: dict[str, str]) -> None:
    for name, mask in fields.items():
        if mask not in MASKS:
            raise ValueError(f"redaction of {tool}.{name}: mask must be one of {MASKS}")
    _redactions.setdefault(tool, {}).update(fields)


def load_adapters() -> None:
    """Import the configured adapter modules once (they register on import)."""
    global _loaded
    if _loaded:
        return
    for module in settings.CONTROLPLANE_ADAPTERS:
        importlib.import_module(module)
    _loaded = True


def get_compensator(tool: str, action: str) -> Compensator | None:
    load_adapters()
    return _compensators.get((tool, action))


def get_reconciler(tool: str) -> Reconciler | None:
    load_adapters()
    return _reconcilers.get(tool)


def get_assumption_checker(name: str) -> AssumptionChecker | None:
    load_adapters()
    return _checkers.get(name)


def get_key_voider(tool: str) -> KeyVoider | None:
    load_adapters()
    return _voiders.get(tool)


def get_commit_window(tool: str) -> float | None:
    load_adapters()
    return _commit_windows.get(tool)


def redact(tool: str, args: Any) -> Any:
    """``args`` as people may see them: core.redaction's policy (sensitive keys at any depth, card
    numbers and secrets in any string) plus every field the tool's adapter declared sensitive."""
    load_adapters()
    return redact_value(args, _redactions.get(tool))


def registered() -> dict[str, Any]:
    load_adapters()
    return {
        "compensators": sorted(f"{t}:{a}" for t, a in _compensators),
        "reconcilers": sorted(_reconcilers),
        "assumption_checkers": sorted(_checkers),
        "key_voiders": sorted(_voiders),
        "commit_windows": dict(sorted(_commit_windows.items())),
        "redactions": {tool: dict(rules) for tool, rules in sorted(_redactions.items())},
    }
