"""Run-control endpoints: preview, issue, receipt, reconcile, approvals, contracts."""

from __future__ import annotations

from typing import Any, Literal
from uuid import UUID

from django.http import HttpRequest
from ninja import Router, Schema
from ninja.responses import Status
from pydantic import Field

from api.auth import caller
from core.actors import Actor
from core.errors import Forbidden, NotFound
from core.metrics import observe_intervention
from interventions import base
from interventions.contracts import contracts_document
from interventions.models import Intervention
from interventions.selectors import receipt_dict
from runs.selectors import get_visible_run

router = Router(tags=["run control"])


class InterventionIn(Schema):
    kind: str = Field(min_length=1, max_length=30)
    reason: str = Field(default="", max_length=2000)
    scope: Literal["run", "tree"] = "run"
    options: dict[str, Any] = {}
    override_reason: str = Field(default="", max_length=2000)


def _operator(request: HttpRequest) -> Actor:
    actor: Actor = caller(request)
    if actor.is_worker:
        raise Forbidden("a worker token can never issue an intervention")
    return actor


def _req(body: InterventionIn) -> base.Request:
    return base.Request(
        kind=body.kind,
        reason=body.reason,
        scope=body.scope,
        options=body.options,
        override_reason=body.override_reason,
    )


@router.post("/runs/{run_id}/interventions/preview", response=dict)
def preview(request: HttpRequest, run_id: UUID, body: InterventionIn):
    actor = _operator(request)
    get_visible_run(actor, run_id)
    return base.preview(actor=actor, run_id=run_id, req=_req(body))


@router.post("/runs/{run_id}/interventions", response={202: dict})
def issue(request: HttpRequest, run_id: UUID, body: InterventionIn):
    actor = caller(request)  # workers are refused inside base.issue, so the refusal is audited
    with observe_intervention(body.kind):
        intervention = base.issue(actor=actor, run_id=run_id, req=_req(body))
    return Status(202, receipt_dict(intervention))


@router.get("/interventions/{intervention_id}", response=dict)
def get_intervention(request: HttpRequest, intervention_id: UUID):
    actor = _operator(request)
    intervention = Intervention.objects.filter(pk=intervention_id).first()
    if intervention is None:
        raise NotFound(f"intervention {intervention_id} does not exist", object="intervention")
    get_visible_run(actor, intervention.run_id)
    return receipt_dict(intervention)


@router.get("/runs/{run_id}/interventions", response=dict)
def list_interventions(request: HttpRequest, run_id: UUID):
    actor = _operator(request)
    run = get_visible_run(actor, run_id)
    return {"interventions": [receipt_dict(i) for i in run.interventions.order_by("created_at")]}


class ReconcileIn(Schema):
    outcome: Literal["committed", "failed"]
    evidence: str = Field(min_length=1, max_length=5000)
    external_ref: str = Field(default="", max_length=200)
    reason: str = Field(min_length=1, max_length=2000)
    # Like the reconcile intervention: someone other than the run's decision authority needs an
    # override with a reason (and a role that may override).
    override_reason: str = Field(default="", max_length=2000)


@router.post("/effects/{effect_id}/reconcile", response=dict)
def reconcile(request: HttpRequest, effect_id: UUID, body: ReconcileIn):
    from interventions.reconcile import reconcile_effect
    from runs.services import effect_dict

    actor = _operator(request)
    effect = reconcile_effect(
        actor=actor,
        effect_id=effect_id,
        outcome=body.outcome,
        evidence=body.evidence,
        external_ref=body.external_ref,
        reason=body.reason,
        source="operator",
        override_reason=body.override_reason,
    )
    return effect_dict(effect)


@router.get("/contracts", response=dict)
def contracts(request: HttpRequest):
    """Machine-readable contracts of every intervention, the state table and the permission matrix."""
    return contracts_document()
