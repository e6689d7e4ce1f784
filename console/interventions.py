"""Console intervention dialogs: choose a kind -> preview (interventions.base.preview) -> confirm
(interventions.base.issue) -> receipt; the reconcile form; the approvals inbox; the contracts page.

The edge parses the form into a :class:`Request` and maps domain errors to the dialog with their
HTTP status. The services decide and enforce everything again (role, decision authority, state table).
"""

from __future__ import annotations

import json
import re
from typing import Any
from uuid import UUID

from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import reswap, retarget

from console.cards import preview_card
from console.common import (
    ConsoleRequest,
    console_view,
    is_fragment,
    kind_label,
    present,
    visible_run_or_404,
)
from console.receipts import receipt_context, visible_intervention_or_404
from console.reports import report_for
from console.run_moved import basis_now, moved
from console.run_page import detail_context, needs_role
from core.auth import actor_for_user
from core.errors import DomainError, Forbidden, Invalid
from core.limits import parse_seq
from core.metrics import observe_intervention
from core.roles import ROLES, may, roles_of
from interventions import base
from interventions.approvals import SATISFIES
from interventions.contracts import contracts_document, permission_rows
from interventions.facts import committed_effects
from interventions.models import Intervention
from interventions.plugins import REGISTRY, Request, owner_bound
from interventions.reconcile import reconcile_effect
from interventions.registry import redact
from interventions.revalidation import build_report
from interventions.transfer import FACETS
from interventions.triage import waiting_words
from runs.models import AuthorityGrant, Run
from runs.selectors import (
    approval_progress,
    approvals_to_decide,
    checkpoint_choices,
    effect_dict,
    effect_with_run,
    grants_in,
    pending_approval,
    pending_approvals,
    people_with_roles,
    role_holders,
    run_with_people,
)
from runs.states import State, as_table
from runs.team_scope import team_slugs_of

FLAGS = ("suspend_authority", "reobserve_assumptions")
PREFERENCES = ("redrive", "compensate", "escalate")
HEADLINE = ("kind", "run_id", "state", "allowed", "next_state", "scope")


# --- parsing --------------------------------------------------------------------------------------


def _fields(kind: str) -> tuple[str, ...]:
    """The form fields a kind's dialog reads into options (its contract's own; none if unknown)."""
    contract = REGISTRY.get(kind)
    return contract.console.fields if contract else ()


def request_from(kind: str, data: QueryDict) -> Request:
    """The form (or the query string) as a service Request. Bad input is a 422 here, at the edge."""
    options: dict[str, Any] = {}
    for name in _fields(kind):
        if name in FLAGS:
            if data.get(name) in ("on", "1", "true"):
                options[name] = True
        elif name in ("facets", "compensate_first"):  # checkboxes: every ticked value
            if data.getlist(name):
                options[name] = data.getlist(name)
        elif name == "checkpoint_seq":
            raw = data.get(name, "").strip()
            if raw:
                try:
                    options[name] = parse_seq(raw)  # digits only, inside bigint
                except ValueError:
                    raise Invalid(
                        "checkpoint must be a whole number", field="options.checkpoint_seq"
                    ) from None
        elif value := data.get(name, "").strip():
            options["scope" if name in ("grant_scope", "capability") else name] = value
    scope = data.get("scope", "run") or "run"
    if scope not in ("run", "tree"):
        raise Invalid("scope must be 'run' or 'tree'", field="scope")
    return Request(
        kind=kind,
        reason=data.get("reason", "").strip(),
        scope=scope,
        options=options,
        override_reason=data.get("override_reason", "").strip(),
    )


def posted_sections(posted: str) -> dict[str, str] | None:
    """The preview's section digests as the operator's form carried them (None if unreadable)."""
    try:
        before = json.loads(posted) if posted else {}
    except ValueError:
        return None
    if not isinstance(before, dict) or not before:
        return None
    return {str(k): str(v) for k, v in before.items()}


def changed_sections(posted: str, sections_now: Any) -> list[str]:
    """The preview sections whose digest differs from the ones the operator's form carried."""
    before = posted_sections(posted) or {}
    if not before:
        return []
    return [k.replace("_", " ") for k, v in sections_now.items() if before.get(k) != v]


# A Python list in a service's message ("role(s) ['operator'] may not ...") read as words.
LIST_TEXT = re.compile(r"\[((?:'[^'\]]*'(?:, )?)*)\]")


def humane(detail: str) -> str:
    return LIST_TEXT.sub(lambda m: m.group(1).replace("'", "") or "none", detail)


# What each field a service names is called on the form (console/templates/console/intervention_dialog.html).
FIELD_LABELS = {
    "reason": "Reason",
    "scope": "Scope",
    "kind": "Intervention",
    "preview_digest": "Preview",
    "override_reason": "Override reason",
    "options": "Grant or scope",
    "options.to": "To (person)",
    "options.to_worker": "To worker",
    "options.facets": "Facets to move",
    "options.grant_id": "Grant",
    "options.scope": "Grant scope",
    "options.approval_id": "Approval",
    "options.checkpoint_seq": "From checkpoint",
    "options.capability": "Capability",
    "options.prefer": "Preferred next action",
    "evidence": "Evidence",
    "outcome": "Outcome",
}
OPTION_NAME = re.compile(r"\boptions\.([a-z_]+)")


def field_label(field: str) -> str:
    return FIELD_LABELS.get(field) or field.removeprefix("options.").replace("_", " ").capitalize()


def sentence(detail: str) -> str:
    """A service's message as a sentence an operator reads: no ``options.`` prefixes, no Python
    lists, a capital and a full stop."""
    text = OPTION_NAME.sub(lambda m: field_label(f"options.{m.group(1)}").lower(), humane(detail))
    text = text.strip()
    text = text[:1].upper() + text[1:]
    return text if text.endswith((".", "?", "!")) else text + "."


def error_dict(err: DomainError) -> dict[str, Any]:
    field = str(err.extra.get("field") or "")
    extra = {k: v for k, v in err.extra.items() if k not in ("problems", "field", "preview_digest")}
    said = sentence(err.detail)
    return {
        "status": err.status,
        "code": err.code,
        "field": field,
        "label": field_label(field) if field else "",
        "sentence": f"{field_label(field)}: {said[:1].lower() + said[1:]}" if field else said,
        "detail": humane(err.detail),
        "extra": present(extra) if extra else None,
        "problems": [
            {"detail": sentence(str(p.get("detail") or p.get("error") or ""))}
            for p in err.extra.get("problems") or []
            if isinstance(p, dict)
        ],
    }


def first_open_hint(err: DomainError) -> str:
    """On a dialog's first open, a preview that needs input the operator has not given yet is a
    prompt, not an error (a transfer without a person, a revoke without a grant)."""
    field = str(err.extra.get("field") or "")
    what = field_label(field).lower() if field else "the fields above"
    return f"Choose {what} to see what confirming would do; nothing changes until you confirm."


# --- the dialog -----------------------------------------------------------------------------------


def _defaults(run: Run, kind: str, params: QueryDict) -> QueryDict:
    """First values so the first preview says something -- never for a destructive choice: a
    hurried operator must pick the grant to revoke or suspend; only a restore (the undo) and an
    approval the run holds alone are chosen for them."""
    data = params.copy()
    if kind in ("approve", "reject") and not data.get("approval_id"):
        pending = list(pending_approvals(run)[:2])
        if len(pending) == 1:
            data["approval_id"] = str(pending[0].pk)
    if kind == "restore_authority" and not data.get("grant_id") and not data.get("grant_scope"):
        grant = grants_in(run, AuthorityGrant.SUSPENDED).first()
        if grant:
            data["grant_id"] = str(grant.pk)
    if kind == "transfer" and not data.getlist("facets"):
        data.setlist("facets", ["assignment", "decision_authority"])
    return data


def dialog_context(
    request: ConsoleRequest, run: Run, req: Request, form: QueryDict
) -> dict[str, Any]:
    roles, owner = request.roles, run.decision_authority
    not_owner = owner_bound(req.kind) and owner is not None and owner.pk != request.user.pk
    contract = REGISTRY.get(req.kind)
    guard_note = contract.console.guard_note if contract else ""
    show_override = (not_owner and may(roles, "override")) or bool(
        contract and guard_note and may(roles, contract.guard_right)
    )
    ctx: dict[str, Any] = {
        "run": run,
        "kind": req.kind,
        "label": kind_label(req.kind),
        "spec": contract.spec.as_dict() if contract else {},
        "scoped": bool(contract and contract.scoped),
        "fields": _fields(req.kind),
        "form": form,
        "facets_checked": form.getlist("facets"),
        "show_override": show_override,
        "guard_note": guard_note,
        "not_owner": not_owner,
        "owner": owner,
        "may_override": may(roles, "override"),
        "origin": form.get("origin", "run"),
    }
    if "checkpoint_seq" in ctx["fields"]:
        ctx["checkpoints"] = checkpoint_choices(run)
    if "compensate_first" in ctx["fields"]:  # redrive: each committed effect, kept unless ticked
        ctx["committed"] = committed_effects(run)
        ctx["compensate_checked"] = form.getlist("compensate_first")
    if "to" in ctx["fields"]:
        ctx["users"] = people_with_roles(ROLES)
        ctx["all_facets"] = FACETS
    if "approval_id" in ctx["fields"]:
        ctx["approvals"] = pending_approvals(run)
    if "grant_id" in ctx["fields"]:
        ctx["grants"] = grants_in(run)
    if "prefer" in ctx["fields"]:
        ctx["preferences"] = PREFERENCES
    return ctx


def with_preview(request: ConsoleRequest, run: Run, req: Request, ctx: dict[str, Any]) -> int:
    """Adds the preview card (or the domain error it raised) and the run's basis to ctx; returns
    the HTTP status."""
    ctx["basis"] = basis_now(run)  # before the preview: a fact committed meanwhile shows as moved
    try:
        if not may(request.roles, req.kind):
            raise Forbidden(refusal(request.roles, req.kind), kind=req.kind)
        shown = base.preview(actor=request.actor, run_id=run.pk, req=req)
    except DomainError as err:
        ctx["error"], ctx["error_obj"] = error_dict(err), err
        return err.status
    ctx["preview"] = {k: shown.get(k) for k in HEADLINE}
    reobserve = bool(req.options.get("reobserve_assumptions"))
    dry_run = _dry_run(run, reobserve) if req.kind == "resume" else None
    ctx["card"] = preview_card(shown, dry_run=dry_run)
    asked = (shown.get("shown") or {}).get("requested_by")
    if req.kind in ("approve", "reject") and request.actor.label in (asked, run.created_by):
        ctx["card"]["blocking"].append(
            "four eyes: you requested this approval or started the run; another approver decides"
        )
    if req.kind in ("approve", "reject"):
        ctx["card"]["progress"] = _multi_party_progress(run, req.options.get("approval_id"))
    ctx["digest"] = shown["digest"]
    ctx["section_digests"] = base.section_digests(shown)
    ctx["sections"] = json.dumps(ctx["section_digests"], separators=(",", ":"))
    return 200


def _multi_party_progress(run: Run, approval_id: Any) -> dict[str, Any] | None:
    """A multi-party approval's progress for the preview card: who approved, who is still needed
    (None for a one-approver approval, which has nothing to show)."""
    try:
        wanted = UUID(str(approval_id))
    except ValueError:
        return None
    approval = pending_approval(run, wanted)
    if approval is None or not approval.steps:
        return None
    return approval_progress(approval)


def _dry_run(run: Run, reobserve: bool) -> dict[str, Any]:
    """The revalidation report as it would come out now: the job's own checks (build_report), the
    assumption checkers' read-only observations included, and the operator's "re-observe" choice
    applied, with nothing written (the job records what it re-observes). Network reads, outside any
    transaction (this view opens none); the job checks again after confirm."""
    try:
        report, _ = build_report(run, reobserve=reobserve)
    except Exception as exc:  # a checker that fails must not break the dialog; say so instead
        return {"error": f"a check could not run now ({exc})"[:300], "checks": []}
    return report.as_dict()


@console_view
@require_GET
def intervention_new(request: ConsoleRequest, run_id: UUID) -> HttpResponse:
    """Open the dialog for one kind, with its first preview."""
    run = visible_run_or_404(request.actor, run_id)
    kind = request.GET.get("kind", "")
    if kind not in REGISTRY:
        raise Http404("unknown intervention kind")
    if not may(request.roles, kind):
        ctx = {
            "run": run,
            "kind": kind,
            "label": kind_label(kind),
            "error": error_dict(Forbidden(refusal(request.roles, kind))),
        }
        return render(request, "console/intervention_dialog.html#dialog", ctx, status=403)
    form = _defaults(run, kind, request.GET)
    req = _safe_request(kind, form)
    ctx = dialog_context(request, run, req, form)
    # A preview refusal is shown in the dialog, which itself opened fine; input not given yet is a
    # prompt (nothing was typed: an error before any input would only alarm).
    with_preview(request, run, req, ctx)
    refused = ctx.pop("error_obj", None)
    if isinstance(refused, Invalid):
        ctx["hint"] = first_open_hint(refused)
        del ctx["error"]
    return render(request, "console/intervention_dialog.html#dialog", ctx)


@console_view
@require_POST
def intervention_preview(request: ConsoleRequest, run_id: UUID) -> HttpResponse:
    """Re-preview as the options change (hx-trigger="change" on the form), or (``check``) say in
    place whether the run moved on since the preview shown: 204 while it has not."""
    run = visible_run_or_404(request.actor, run_id)
    kind = request.POST.get("kind", "")
    ctx: dict[str, Any] = {"run": run, "kind": kind}
    if request.POST.get("check"):
        shown = request.POST.get("preview_basis", "")
        ctx |= {"basis": shown, "moved": moved(shown, basis_now(run))}
        if not ctx["moved"]:
            return HttpResponse(status=204)
        return render(request, "console/intervention_dialog.html#moved", ctx)
    try:
        req = request_from(kind, request.POST)
    except DomainError as err:
        ctx["error"] = error_dict(err)
        return render(request, "console/intervention_dialog.html#preview", ctx, status=err.status)
    status = with_preview(request, run, req, ctx)
    return render(request, "console/intervention_dialog.html#preview", ctx, status=status)


@console_view
@require_POST
def intervention_issue(request: ConsoleRequest, run_id: UUID) -> HttpResponse:
    """Confirm: one call to interventions.base.issue, then the receipt (and fresh run sections)."""
    run = visible_run_or_404(request.actor, run_id)
    kind = request.POST.get("kind", "")
    try:
        req = request_from(kind, request.POST)
        # The digest of the preview shown is checked by the service under the run lock: a confirm
        # of a preview the run has moved on from (or of other options) is refused, 409.
        with observe_intervention(req.kind):
            intervention = base.issue(
                actor=request.actor,
                run_id=run.pk,
                req=req,
                seen_digest=request.POST.get("preview_digest", ""),
                seen_sections=posted_sections(request.POST.get("preview_sections", "")),
            )
    except DomainError as err:
        return refused(request, run, kind, err)
    return receipt_response(request, intervention, request.POST.get("origin", "run"))


def refusal(roles: frozenset[str], action: str) -> str:
    """ "Your role (operator) may not compensate: needs incident commander or admin — currently: …"."""
    mine = ", ".join(r.replace("_", " ") for r in sorted(roles)) or "none"
    return f"your role ({mine}) may not {action.replace('_', ' ')}: {needs_role(action, role_holders())}"


def refused(request: ConsoleRequest, run: Run, kind: str, err: DomainError) -> HttpResponse:
    """A refused confirm redraws the preview only (HX-Retarget): the error above a fresh preview,
    or, for a stale one, the new preview and what changed. The form's fields are not redrawn, so
    what the operator typed (and where the cursor was) stays as it was."""
    run.refresh_from_db()  # the fresh preview's basis is the run as it is now
    ctx: dict[str, Any] = {"run": run, "kind": kind, "error": error_dict(err)}
    if kind in REGISTRY and may(request.roles, kind):
        with_preview(request, run, _safe_request(kind, request.POST), ctx)
        ctx["error"] = error_dict(err)  # the confirm's refusal, not the fresh preview's
        if err.code == "preview_stale" and "section_digests" in ctx:
            ctx["changed"] = changed_sections(
                request.POST.get("preview_sections", ""), ctx["section_digests"]
            )
    response = render(request, "console/intervention_dialog.html#preview", ctx, status=err.status)
    return reswap(retarget(response, "#preview"), "outerHTML")


def _safe_request(kind: str, data: QueryDict) -> Request:
    try:
        return request_from(kind, data)
    except DomainError:
        return Request(kind=kind, reason="")


def receipt_response(
    request: ConsoleRequest, intervention: Intervention, origin: str
) -> HttpResponse:
    run = run_with_people(intervention.run_id)
    ctx = job_context(intervention) | receipt_context(intervention) | {"run": run}
    html: str = render_to_string("console/intervention_dialog.html#receipt", ctx, request=request)
    # The page behind the dialog refreshes in the same response, so it is current even without a socket.
    html += out_of_band(request, run, origin)
    return HttpResponse(html)


def out_of_band(request: ConsoleRequest, run: Run, origin: str) -> str:
    if origin == "inbox":
        return render_to_string(
            "console/approvals.html#inbox", inbox_context(request.actor) | {"oob": True}
        )
    return render_to_string(
        "console/run_detail.html#sections",
        detail_context(run, request.user, request.roles) | {"oob": True},
    )


@console_view
@require_GET
def intervention_job(request: ConsoleRequest, intervention_id: UUID) -> HttpResponse:
    """The receipt's job status, re-read after every push (and every few seconds while pending)."""
    intervention, _ = visible_intervention_or_404(request.actor, intervention_id)
    return render(request, "console/intervention_dialog.html#job", job_context(intervention))


def job_context(intervention: Intervention) -> dict[str, Any]:
    """The receipt's follow-up job: its status, and its report when the kind has one
    (console/templates/console/job_reports.html); a job without one answers in the receipt's lines."""
    return {"i": intervention, "rep": report_for(intervention)}


# --- reconcile one effect -------------------------------------------------------------------------


@console_view
@require_http_methods(["GET", "POST"])
def reconcile(request: ConsoleRequest, effect_id: UUID) -> HttpResponse:
    effect = effect_with_run(effect_id)
    if effect is None:
        raise Http404("no such effect")
    run = visible_run_or_404(request.actor, effect.run_id)
    ctx = {
        "run": run,
        "effect": effect_dict(effect),
        "form": request.POST if request.method == "POST" else {},
    }
    if not may(request.roles, "reconcile"):
        ctx["error"] = error_dict(Forbidden(refusal(request.roles, "reconcile")))
        return render(request, "console/intervention_dialog.html#reconcile", ctx, status=403)
    if request.method == "GET":
        return render(request, "console/intervention_dialog.html#reconcile", ctx)
    try:
        if (
            not request.POST.get("evidence", "").strip()
            or not request.POST.get("reason", "").strip()
        ):
            raise Invalid("evidence and a reason are both required", field="evidence")
        settled = reconcile_effect(
            actor=request.actor,
            effect_id=effect.pk,
            outcome=request.POST.get("outcome", ""),
            evidence=request.POST["evidence"].strip(),
            external_ref=request.POST.get("external_ref", "").strip()[:200],
            reason=request.POST["reason"].strip(),
            source="operator",
            override_reason=request.POST.get("override_reason", "").strip()[:2000],
        )
    except DomainError as err:
        # Into the form's error slot only: the dialog and what the operator typed hold still.
        ctx["error"] = error_dict(err)
        response = render(
            request, "console/intervention_dialog.html#reconcile-error", ctx, status=err.status
        )
        return reswap(retarget(response, "#reconcile-error"), "innerHTML")
    ctx |= {"effect": effect_dict(settled), "done": present(settled.reconciliation)}
    html = render_to_string(
        "console/intervention_dialog.html#reconciled", ctx, request=request
    ) + out_of_band(request, run, "run")
    return HttpResponse(html)


# --- approvals inbox ------------------------------------------------------------------------------


def inbox_context(actor) -> dict[str, Any]:
    """Pending approvals this user's roles may decide (required role satisfied, permission to approve),
    or whose open step names a team of theirs: one row per decision (run + action digest), sensitive
    args masked by the adapter's redaction; and what waits on other people, with who may decide it
    (so "nothing for you" is not "nothing")."""
    roles = actor.roles
    decidable = [required for required, satisfied_by in SATISFIES.items() if satisfied_by & roles]
    my_teams: frozenset[str] | None = None  # read once, when a team step first asks
    rows: list[dict[str, Any]] = []
    others: list[dict[str, Any]] = []
    seen: set[tuple[Any, str]] = set()
    deciding = may(roles, "approve") or may(roles, "reject")
    now = timezone.now()
    holders: dict[str, list[str]] | None = None
    for a in approvals_to_decide(actor, list(SATISFIES)):
        if (a.run_id, a.digest) in seen:
            continue  # the same decision asked twice: it is decided once
        seen.add((a.run_id, a.digest))
        progress = approval_progress(a) if a.steps else None
        # multi-party: theirs when a step of the open stage needs a role they satisfy or is a
        # team step of one of their teams
        open_now = (
            [s for s in progress["steps"] if s["open"] and s["still_needed"]] if progress else []
        )
        needed = [s["role"] for s in open_now if not s["team"]] if progress else [a.required_role]
        if any(s["team"] for s in open_now) and my_teams is None:
            my_teams = team_slugs_of(actor.user_id)
        mine = deciding and (
            any(r in decidable for r in needed)
            or any(s["team"] and s["team"] in (my_teams or ()) for s in open_now)
        )
        self_asked = actor.label in (a.requested_by, a.run.created_by)
        row = {
            "a": a,
            "progress": progress,
            "args": present(redact(a.tool, a.args)),
            "self": self_asked,
            "waiting": waiting_words(a, now),
        }
        if mine and not self_asked:
            rows.append(
                row | {"may_approve": may(roles, "approve"), "may_reject": may(roles, "reject")}
            )
            continue
        if mine:  # four eyes: shown with the user's own, refused by the service, decided by others
            rows.append(
                row | {"may_approve": may(roles, "approve"), "may_reject": may(roles, "reject")}
            )
        holders = role_holders() if holders is None else holders
        others.append(row | {"needs": _deciders(a, holders)})
    return {"rows": rows, "others": others, "decidable": decidable, "roles": roles}


def _deciders(a, holders: dict[str, list[str]]) -> str:
    """ "needs approver — currently: april, ian, ada" (not who asked: four eyes)."""
    role = a.required_role
    if a.steps:  # multi-party: the open stage's first step still short of people
        open_now = [s for s in approval_progress(a)["steps"] if s["open"] and s["still_needed"]]
        if open_now and open_now[0]["team"]:  # a team step: its members who may still decide
            names = open_now[0]["may_decide"] or []
            return (
                f"needs {open_now[0]['still_needed']} from team {open_now[0]['team']} — "
                f"currently: {', '.join(names) if names else 'nobody'}"
            )
        role = open_now[0]["role"] if open_now else role
    roles = [r for r in ROLES if r in SATISFIES.get(role, frozenset({"admin"}))]
    asked = {a.requested_by, a.run.created_by}
    names = [
        n for n in dict.fromkeys(n for r in roles for n in holders.get(r, [])) if n not in asked
    ]
    words = role.replace("_", " ")
    return f"needs {words} — currently: {', '.join(names) if names else 'nobody'}"


@console_view
@require_GET
def approvals_inbox(request: ConsoleRequest) -> HttpResponse:
    ctx = inbox_context(request.actor) | {"nav": "approvals"}
    return render(
        request,
        "console/approvals.html#inbox" if is_fragment(request) else "console/approvals.html",
        ctx,
    )


def render_inbox_push(user) -> str:
    return render_to_string(
        "console/approvals.html#inbox",
        inbox_context(actor_for_user(user, None, component="console")) | {"oob": True},
    )


# --- contracts page -------------------------------------------------------------------------------


@console_view
@require_GET
def contracts_page(request: HttpRequest) -> HttpResponse:
    doc = contracts_document()
    by_state: dict[str, list[dict[str, Any]]] = {s.value: [] for s in State}
    for row in as_table():
        by_state[str(row["from"])].append(row)
    matrix = [
        {"action": action, "cells": [role in roles for role in ROLES]}
        for action, roles in permission_rows().items()
    ]
    return render(
        request,
        "console/contracts.html",
        {
            # The per-run contracts, then those over a scope of the fleet (interventions/intake.py).
            "contracts": [
                {"kind": k, "label": kind_label(k), **c}
                for k, c in (doc["contracts"] | doc["fleet_contracts"]).items()
            ],
            "by_state": by_state,
            "matrix": matrix,
            "roles_header": ROLES,
            "nav": "contracts",
            "my_roles": roles_of(request.user),
        },
    )
