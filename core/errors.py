"""Domain errors raised by services; the API edge maps them to JSON 4xx responses."""

from __future__ import annotations

from typing import Any


class DomainError(Exception):
    status = 400
    code = "bad_request"

    def __init__(self, detail: str = "", **extra: Any):
        super().__init__(detail or self.code)
        self.detail = detail or self.code
        self.extra = extra

    def payload(self) -> dict[str, Any]:
        return {"error": self.code, "detail": self.detail, **self.extra}


class NotFound(DomainError):
    status, code = 404, "not_found"


class Forbidden(DomainError):
    status, code = 403, "forbidden"


class AuthorityNotAllowed(Forbidden):
    code = "authority_not_allowed"


class Invalid(DomainError):
    status, code = 422, "invalid"


class IdempotencyKeyReused(DomainError):
    status, code = 422, "idempotency_key_reused"


class Conflict(DomainError):
    status, code = 409, "conflict"


class PreviewStale(Conflict):
    code = "preview_stale"


class LeaseHeld(Conflict):
    code = "lease_held"


class NotClaimable(Conflict):
    code = "not_claimable"


class LeaseLost(Conflict):
    code = "lease_lost"


class EffectUnresolved(Conflict):
    code = "effect_unresolved"


class EffectsUnresolved(Conflict):
    code = "effects_unresolved"


class NotDecisionAuthority(Forbidden):
    code = "not_decision_authority"
