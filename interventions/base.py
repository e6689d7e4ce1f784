"""What every intervention shares: request, permission and decision-authority checks, scope,
preview -> issue -> receipt, and the one transaction each decision runs in.

Each contract module (pause.py, resume.py, ...) declares a :class:`~interventions.plugins.Contract`
with a ``preview`` (pure read) and an ``apply`` (the change, called with the run locked inside the
transaction); interventions/plugins.py registers it when the app is ready.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any, Protocol

from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from audit.services import record_audit
from core.actors import Actor
from core.errors import (
    Conflict,
    Forbidden,
    Invalid,
    NotDecisionAuthority,
    NotFound,
    PreviewStale,
)
from core.live import announce
from core.roles import may
from interventions.models import Intervention
from interventions.plugins import Contract, Request, get_contract, owner_bound
from runs.models import Approval, Run
from runs.selectors import descendants, run_snapshot
from runs.services.decisions import decision, lock_run
from runs.states import Event, transition
from runs.team_scope import may_know


def children_in_scope(run: Run, req: Request, event: Event | None) -> list[dict[str, Any]]:
    """Children are always listed, with whether this intervention reaches them and why not."""
    rows = []
    for child in descendants(run):
        in_scope = req.scope == "tree"
        applies = event is None or transition(child.state, event) is not None
        rows.append(
            {
                "id": str(child.pk),
                "agent": child.agent.name,
                "state": child.state,
                "parent": str(child.parent_id),
                "in_scope": in_scope,
                "will_change": in_scope and applies,
                "note": ""
                if not in_scope
                else ("" if applies else f"{event} does not apply to a {child.state} run"),
            }
        )
    return rows


def authorize(actor: Actor, run: Run, req: Request) -> dict[str, Any]:
    """Role permission, then decision authority. Returns what to record about any override."""
    if actor.is_worker:
        raise Forbidden("a worker token can never issue an intervention")
    if not may(actor.roles, req.kind):
        raise Forbidden(
            f"role(s) {sorted(actor.roles) or ['none']} may not {req.kind}", kind=req.kind
        )
    owner = run.decision_authority
    if owner_bound(req.kind) and owner is not None and owner.pk != actor.user_id:
        if not req.override:
            raise NotDecisionAuthority(
                f"{owner.username} holds decision authority over this run; an override "
                "with a reason by an incident commander is required",
                decision_authority=owner.username,
            )
        if not may(actor.roles, "override"):
            raise NotDecisionAuthority(
                f"role(s) {sorted(actor.roles)} may not override {owner.username}'s "
                "decision authority",
                decision_authority=owner.username,
            )
        return {
            "override": True,
            "overridden": owner.username,
            "override_reason": req.override_reason,
        }
    if req.override:
        # An override of a guard (failing revalidation, a non-retryable failure class) is a decision
        # only some roles may take; it is recorded as an override like any other.
        right = get_contract(req.kind).guard_right
        if not may(actor.roles, right):
            raise Forbidden(
                f"role(s) {sorted(actor.roles)} may not override ({right})", kind=req.kind
            )
        return {"override": True, "overridden": "guard", "override_reason": req.override_reason}
    return {"override": False}


def check_transition(run: Run, event: Event | None) -> None:
    if event is not None and transition(run.state, event) is None:
        raise Conflict(
            f"{event.value} is not allowed while the run is {run.state}", state=run.state
        )


def user_for(actor: Actor):
    return get_user_model().objects.filter(pk=actor.user_id).first() if actor.user_id else None


def _shown(run: Run, req: Request, actor: Actor, contract: Contract) -> dict[str, Any]:
    """The preview as the operator sees it: the headline, the contract's sections and its digest."""
    step = transition(run.state, contract.event) if contract.event else None
    shown = {
        "kind": req.kind,
        "run_id": str(run.pk),
        "state": run.state,
        "allowed": contract.event is None or step is not None,
        "next_state": step.target.value if step else run.state,
        "scope": req.scope,
        **contract.preview(run, req, actor),
    }
    digest = preview_digest(req, shown)
    sections = section_digests(shown)
    # Remembered briefly, so a confirm that sends only the digest still hears what changed.
    cache.set(f"preview-sections:{digest}", sections, PREVIEW_MEMORY_S)
    return shown | {"digest": digest, "sections": sections}


PREVIEW_MEMORY_S = 3600
# Not part of what a preview says: its own digests.
_NOT_SHOWN = ("digest", "sections")


def preview_digest(req: Request, shown: dict[str, Any]) -> str:
    """A hash of what the preview showed and of the request it answered (not the reason text). A
    confirm carrying it is refused if the run has moved on since: what is issued is what was shown."""
    preview = {k: v for k, v in shown.items() if k not in _NOT_SHOWN}
    lease = (preview.get("current") or {}).get("execution_lease")
    if isinstance(lease, dict):
        # A live lease's expiry moves with every heartbeat; who holds it is what the preview says.
        preview["current"] = {
            **preview["current"],
            "execution_lease": {**lease, "expires_at": None},
        }
    content = {
        "request": {"kind": req.kind, "scope": req.scope, "options": req.options},
        "override": req.override,
        "preview": preview,
    }
    text = json.dumps(_jsonable(content), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def section_digests(shown: dict[str, Any]) -> dict[str, str]:
    """One short hash per preview section, so an edge can name which sections a stale confirm missed.
    A short scalar section (the state, whether it is allowed) is kept as ``=value`` instead: the
    refusal can then say what it was and what it is now."""
    out = {}
    for key, value in shown.items():
        if key in _NOT_SHOWN:
            continue
        if value is None or isinstance(value, (str, bool, int, float)) and len(str(value)) <= 40:
            out[key] = f"={value}"
        else:
            text = json.dumps(_jsonable(value), sort_keys=True, default=str)
            out[key] = hashlib.sha256(text.encode()).hexdigest()[:8]
    return out


def differences(seen: dict[str, str], now: dict[str, str]) -> list[dict[str, Any]]:
    """The sections of a preview that moved, with what they were and are when they are scalars."""
    out = []
    for key in now.keys() | seen.keys():
        if seen.get(key) == now.get(key):
            continue
        row: dict[str, Any] = {"section": key}
        for side, value in (("was", seen.get(key)), ("now", now.get(key))):
            if isinstance(value, str) and value.startswith("="):
                row[side] = value[1:]
        out.append(row)
    return sorted(out, key=lambda r: (r["section"] not in ("state", "allowed"), r["section"]))


def _said(row: dict[str, Any]) -> str:
    name = row["section"].replace("_", " ")
    if "was" in row and "now" in row:
        return f"{name} was {row['was']}, now {row['now']}"
    return f"{name} changed"


class Parent(Protocol):
    """A parent record taking part in each of its runs' decisions (a fleet operation)."""

    def before(self) -> None:
        """First thing in the decision's transaction, before the run lock: lock the parent, refuse
        (a DomainError) if it no longer wants this decision."""

    def after(self, intervention: Intervention) -> None:
        """Once the receipt is written, in the same transaction: link it to the parent."""


def check_digest(
    req: Request,
    shown: dict[str, Any],
    seen: str | None,
    seen_sections: dict[str, str] | None = None,
) -> None:
    """Refuse a confirm whose preview (``seen``) no longer matches what the run would do now, naming
    the difference: from the sections the caller sent back, else from the preview remembered under
    its digest."""
    if not seen or seen == shown["digest"]:
        return
    before = seen_sections or cache.get(f"preview-sections:{seen}") or {}
    changed = differences(before, shown["sections"]) if before else []
    named = "; ".join(_said(r) for r in changed[:4]) or "the preview you confirmed is not the run's"
    raise PreviewStale(
        f"the run changed since the preview you confirmed ({named}): review the new preview, "
        "then confirm",
        field="preview_digest",
        preview_digest=shown["digest"],
        state=shown["state"],
        changed=changed,
    )


def preview(*, actor: Actor, run_id: Any, req: Request) -> dict[str, Any]:
    """What would happen if confirmed, with its digest. Changes nothing (and is not audited)."""
    contract = get_contract(req.kind)
    run = Run.objects.select_related("agent", "assignee", "decision_authority").get(pk=run_id)
    authorize(actor, run, req)
    return _shown(run, req, actor, contract)


def issue(
    *,
    actor: Actor,
    run_id: Any,
    req: Request,
    policy: str = "",
    seen_digest: str | None = None,
    seen_sections: dict[str, str] | None = None,
    parent: Parent | None = None,
) -> Intervention:
    """One transaction: lock, authorise, check the table, apply, record intervention + history + audit.

    ``policy``: the control plane issuing on its own (a system actor, e.g. recovery of an orphan). It
    has no role to check and no answer to a decision authority, so those checks are skipped and the
    policy is recorded in their place, on the receipt and in the audit context.

    ``seen_digest``: the digest of the preview the operator confirmed; checked under the run lock, so
    a change committed between the preview and the confirm is caught (PreviewStale, 409, naming what
    changed: ``seen_sections`` are the preview's ``sections`` as the caller had them). It is kept on
    the receipt (``decided_on_preview``).

    A contract's ``repeat`` answers a request that repeats a decision already taken: the original
    intervention (marked ``replayed``; nothing new is decided, the replay is audited) or a Conflict.

    ``parent``: a record this decision belongs to (interventions/fleet/operations.py); its lock is taken before
    the run's, so a halt of the parent and this decision are serialised."""
    with decision(actor, f"intervention.{req.kind}", "run", run_id, run_id):
        if parent is not None:
            parent.before()
        if policy and actor.kind != "system":
            raise Forbidden("only the control plane itself issues by policy")
        if not req.reason.strip():
            raise Invalid("a reason is required for every intervention", field="reason")
        if req.scope not in ("run", "tree"):
            raise Invalid("scope must be 'run' or 'tree'", field="scope")
        contract = get_contract(
            req.kind
        )  # inside: an unknown kind is a refused decision, audited too
        run = lock_run(run_id)
        if not may_know(actor, run):  # another team's run: as absent (docs/operator/teams.md)
            raise NotFound(f"run {run_id} does not exist", object="run")
        override: dict[str, Any] = (
            {"override": False, "policy": policy} if policy else authorize(actor, run, req)
        )
        if contract.repeat is not None and (original := contract.repeat(run, req, actor)):
            record_audit(
                actor=actor,
                action="intervention.replayed",
                object_type="intervention",
                object_id=original.pk,
                run_id=run.pk,
                reason=req.reason,
                context={"kind": req.kind, "original": str(original.pk), "state": run.state},
            )
            original.replayed = True  # type: ignore[attr-defined]
            return original
        check_transition(run, contract.event)
        shown = _shown(run, req, actor, contract)
        check_digest(req, shown, seen_digest, seen_sections)
        intervention = Intervention.objects.create(
            run=run,
            kind=req.kind,
            actor=user_for(actor),
            actor_label=actor.label,
            role=actor.role,
            reason=req.reason,
            scope=req.scope,
            options=req.options,
            override=override["override"],  # an intervention by policy is never an override
            override_reason=req.override_reason,
            preview=_jsonable(shown),
            status=Intervention.APPLIED,
        )
        receipt = contract.apply(run, req, actor, intervention)
        receipt = {
            "kind": req.kind,
            "issued_by": actor.name,
            "role": actor.role,
            "reason": req.reason,
            "scope": req.scope,
            "decided_on_preview": seen_digest or None,
            **override,
            **receipt,
        }
        intervention.receipt = _jsonable(receipt)
        intervention.save(update_fields=["receipt", "status"])
        if parent is not None:
            parent.after(intervention)
        announce(run.pk, "intervention", intervention.pk)
        record_audit(
            actor=actor,
            action=f"intervention.{req.kind}",
            object_type="intervention",
            object_id=intervention.pk,
            run_id=run.pk,
            reason=req.reason,
            context={"intervention": str(intervention.pk), **override, "after": run_snapshot(run)},
        )
    return intervention


def lock_pending_job(intervention_id: Any, state: str) -> tuple[Intervention, Run] | None:
    """For a follow-up job concluding its intervention, inside the caller's transaction: lock the
    intervention, then its run (always in that order), and return both -- or None if a previous
    delivery already concluded it or the run has moved on, so a redelivered job does nothing."""
    intervention = Intervention.objects.select_for_update().get(pk=intervention_id)
    run = lock_run(intervention.run_id)
    if intervention.status != Intervention.PENDING or run.state != state:
        return None
    return intervention, run


def finish_job(intervention: Intervention, status: str, result: dict[str, Any]) -> None:
    """Record a follow-up job's result on the receipt (inside the caller's transaction)."""
    intervention.receipt = _jsonable({**intervention.receipt, "job": {"status": status, **result}})
    intervention.status = status
    intervention.completed_at = timezone.now()
    intervention.save(update_fields=["receipt", "status", "completed_at"])
    announce(intervention.run_id, "intervention", intervention.pk)


def pending_approvals(run: Run) -> list[dict[str, Any]]:
    return [
        {"id": str(a.pk), "tool": a.tool, "action": a.action, "status": a.status}
        for a in Approval.objects.filter(run=run, status=Approval.PENDING)
    ]


def _jsonable(value: Any) -> Any:
    from audit.chain.hashing import normalise

    return normalise(value)


def on_commit(fn: Callable[[], Any]) -> None:
    transaction.on_commit(fn)
