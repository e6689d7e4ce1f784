"""Run-control endpoints: preview, issue, receipt, reconcile, approvals, contracts."""

from __future__ import annotations

from uuid import UUID

from django.http import HttpRequest
from ninja import Query, Router
from ninja.responses import Status

from api import responses as out
from api.auth import caller
from api.responses import ERRORS_READ, ERRORS_WRITE
from api.schemas import InterventionIn, PageIn, ReconcileIn
from core.actors import Actor
from core.errors import Forbidden, NotFound
from core.metrics import observe_intervention
from interventions import base
from interventions.contracts import contracts_document
from interventions.models import Intervention
from interventions.plugins import Request
from interventions.selectors import receipt_dict, tree_page
from runs.selectors import get_visible_run, visible_run

router = Router(tags=["run control"])


def _operator(request: HttpRequest) -> Actor:
    actor: Actor = caller(request)
    if actor.is_worker:
        raise Forbidden("a worker token can never issue an intervention")
    return actor


def _its_run(actor: Actor, intervention: Intervention | None) -> None:
    """The intervention's run, for one the actor may see; 404 naming the intervention otherwise
    (never its run: another team's run id is not the caller's to learn)."""
    if intervention is None or visible_run(actor, intervention.run_id) is None:
        raise NotFound("intervention does not exist", object="intervention")


def _req(body: InterventionIn) -> Request:
    return Request(
        kind=body.kind,
        reason=body.reason,
        scope=body.scope,
        options=body.options.as_dict(),
        override_reason=body.override_reason,
    )


@router.post("/runs/{run_id}/interventions/preview", response={200: out.PreviewOut, **ERRORS_WRITE})
def preview(request: HttpRequest, run_id: UUID, body: InterventionIn):
    actor = _operator(request)
    get_visible_run(actor, run_id)
    return base.preview(actor=actor, run_id=run_id, req=_req(body))


@router.post(
    "/runs/{run_id}/interventions",
    response={202: out.ReceiptOut, 200: out.ReceiptOut, **ERRORS_WRITE},
)
def issue(request: HttpRequest, run_id: UUID, body: InterventionIn):
    """202: issued, the receipt in the body. 200: the same actor sent the same request again (a
    cancel already under way): the original receipt, ``replayed`` true; nothing new was decided."""
    actor = caller(request)  # workers are refused inside base.issue, so the refusal is audited
    with observe_intervention(body.kind):
        intervention = base.issue(
            actor=actor,
            run_id=run_id,
            req=_req(body),
            seen_digest=body.preview_digest,
            seen_sections=body.preview_sections,
        )
    replayed = getattr(intervention, "replayed", False)
    return Status(200 if replayed else 202, receipt_dict(intervention) | {"replayed": replayed})


@router.get("/interventions/{intervention_id}", response={200: out.ReceiptOut, **ERRORS_READ})
def get_intervention(request: HttpRequest, intervention_id: UUID):
    actor = _operator(request)
    intervention = Intervention.objects.filter(pk=intervention_id).first()
    if intervention is None:
        raise NotFound(f"intervention {intervention_id} does not exist", object="intervention")
    _its_run(actor, intervention)
    return receipt_dict(intervention)


def _next(path: str, page: PageIn, shown: int, total: int) -> str | None:
    after = page.after + shown
    return f"/api/v1{path}?after={after}&limit={page.limit}" if after < total else None


@router.get(
    "/interventions/{intervention_id}/children",
    response={200: out.CascadePageOut, **ERRORS_READ},
)
def intervention_children(request: HttpRequest, intervention_id: UUID, page: Query[PageIn]):
    """The children a pause or cancel listed, past the first page its receipt shows."""
    from interventions.selectors import cascade_page

    actor = _operator(request)
    intervention = Intervention.objects.filter(pk=intervention_id).first()
    if intervention is None:
        raise NotFound(f"intervention {intervention_id} does not exist", object="intervention")
    _its_run(actor, intervention)
    listed = cascade_page(intervention, page.after, page.limit)
    path = f"/interventions/{intervention_id}/children"
    return listed | {"next": _next(path, page, len(listed["children"]), listed["total"])}


@router.get("/runs/{run_id}/tree", response={200: out.TreePageOut, **ERRORS_READ})
def run_tree(request: HttpRequest, run_id: UUID, page: Query[PageIn]):
    """The run's descendants as they are now, breadth first, a page at a time (a preview names the
    first page only)."""
    actor = caller(request)
    run = get_visible_run(actor, run_id)
    rows, total = tree_page(run, page.after, page.limit)
    return {
        "run_id": str(run.pk),
        "total": total,
        "children": rows,
        "next": _next(f"/runs/{run_id}/tree", page, len(rows), total),
    }


@router.get("/runs/{run_id}/interventions", response={200: out.ReceiptListOut, **ERRORS_READ})
def list_interventions(request: HttpRequest, run_id: UUID):
    actor = _operator(request)
    run = get_visible_run(actor, run_id)
    return {"interventions": [receipt_dict(i) for i in run.interventions.order_by("created_at")]}


@router.post("/effects/{effect_id}/reconcile", response={200: out.EffectOut, **ERRORS_WRITE})
def reconcile(request: HttpRequest, effect_id: UUID, body: ReconcileIn):
    from interventions.reconcile import reconcile_effect
    from runs.selectors import effect_dict

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


@router.get("/contracts", response={200: out.ContractsOut, **ERRORS_READ})
def contracts(request: HttpRequest):
    """Machine-readable contracts of every intervention, the state table and the permission matrix."""
    return contracts_document()
