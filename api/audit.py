"""Audit trail, chain verification and export over the API."""

from __future__ import annotations

from django.http import HttpRequest
from ninja import Query, Router
from pydantic import Field

from api.auth import caller, refuse
from api.schemas import Schema
from audit.models import AuditEvent
from audit.services import verify_chain
from core.actors import Actor
from core.roles import may

router = Router(tags=["audit"])


def _viewer(request: HttpRequest) -> Actor:
    actor: Actor = caller(request)
    if actor.is_worker or not may(actor.roles, "view"):
        raise refuse(request, "audit is for people with a console role")
    return actor


class AuditFilter(Schema):
    run_id: str | None = Field(default=None, max_length=36)
    action: str | None = Field(default=None, max_length=60)
    outcome: str | None = Field(default=None, max_length=10)
    after_seq: int = Field(default=0, ge=0, le=2**63 - 1)  # seq is a bigint
    limit: int = Field(default=100, ge=1, le=1000)


def audit_dict(e: AuditEvent) -> dict:
    return e.hashed_fields() | {
        "created_at": e.created_at.isoformat(),
        "prev_hash": e.prev_hash,
        "hash": e.hash,
    }


@router.get("/audit", response=dict)
def list_audit(request: HttpRequest, filters: Query[AuditFilter]):
    _viewer(request)
    qs = AuditEvent.objects.filter(seq__gt=filters.after_seq)
    if filters.run_id:
        qs = qs.filter(run_id=filters.run_id) if _uuid_ok(filters.run_id) else qs.none()
    if filters.action:
        qs = qs.filter(action=filters.action)
    if filters.outcome:
        qs = qs.filter(outcome=filters.outcome)
    return {"events": [audit_dict(e) for e in qs.order_by("seq")[: filters.limit]]}


@router.get("/audit/verify", response=dict)
def verify(request: HttpRequest):
    _viewer(request)
    return verify_chain().as_dict()


def _uuid_ok(value: str) -> bool:
    import uuid

    try:
        uuid.UUID(value)
        return True
    except ValueError:
        return False
