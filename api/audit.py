"""Audit trail, chain verification and export over the API."""

from __future__ import annotations

from django.http import HttpRequest
from ninja import Query, Router

from api import responses as out
from api.auth import caller, refuse
from api.responses import ERRORS_READ
from api.schemas import AuditFilter
from audit.integrity import verify_for_people
from audit.models import AuditEvent
from audit.selectors import audit_events, outside_runs, settled_seq
from core.actors import Actor
from core.roles import may, reads_whole_audit_log
from interventions.audit_scope import audit_scope

router = Router(tags=["audit"])


def _viewer(request: HttpRequest) -> Actor:
    actor: Actor = caller(request)
    if actor.is_worker or not may(actor.roles, "view"):
        raise refuse(request, "audit is for people with a console role")
    return actor


def audit_dict(e: AuditEvent) -> dict:
    # ``seq`` is the global reading order (``after_seq`` pages by it); the hash covers the event's
    # position in its chain, ``chain`` and ``chain_seq``.
    return e.hashed_fields() | {
        "seq": e.seq,
        "chain": e.chain,
        "chain_seq": e.chain_seq,
        "created_at": e.created_at.isoformat(),
        "prev_hash": e.prev_hash,
        "hash": e.hash,
    }


@router.get("/audit", response={200: out.AuditListOut, **ERRORS_READ})
def list_audit(request: HttpRequest, filters: Query[AuditFilter]):
    actor = _viewer(request)
    whole = reads_whole_audit_log(actor.roles)  # core.roles "audit_read_all"
    if not whole and (
        asked := outside_runs(
            action=filters.action or "",
            object_type=filters.object_type or "",
            component=filters.component or "",
        )
    ):
        raise refuse(
            request, f"{asked} names events of no run: the whole audit log needs audit_read_all"
        )
    # Only settled events: one whose seq was taken by a transaction still in flight would otherwise
    # commit behind a poller's cursor (audit/selectors.py, "the settled horizon").
    horizon = settled_seq(floor=filters.after_seq)
    qs = audit_events(
        action=filters.action or "",
        actor=filters.actor or "",
        outcome=filters.outcome or "",
        object_type=filters.object_type or "",
        component=filters.component or "",
        run_id=filters.run_id or "",
        after_seq=filters.after_seq,
        before_seq=None if horizon is None else horizon + 1,
        runs_only=not whole,
        scope=audit_scope(actor),  # their teams' events only (docs/operator/teams.md)
    )
    events = [audit_dict(e) for e in qs.order_by("seq")[: filters.limit]]
    return {"events": events, "scope": "all" if whole else "runs"}


@router.get("/audit/verify", response={200: out.VerifyOut, **ERRORS_READ})
def verify(request: HttpRequest):
    """The same checks as ``manage.py audit_verify``: every audit chain, every run's history chain,
    the ledger against the history, and the anchors once any were written. Walks everything: for the
    roles that answer for the audit trail (``audit_verify``). A team-limited verifier gets the verdict
    with no break named (audit.integrity.verify_for_people)."""
    actor = _viewer(request)
    if not may(actor.roles, "audit_verify"):
        raise refuse(request, "verifying the audit trail needs the audit_verify permission")
    return verify_for_people(named=audit_scope(actor) is None)
