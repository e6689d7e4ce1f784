"""Revoke, suspend or restore an authority grant: withdraw credentials / tool grants for *future* use.

From the commit on, a declaration needing the grant is denied (declare_effect walks the grant and its
delegation chain under the same run lock and answers authority_revoked / authority_suspended). What a
remote system already accepted cannot be recalled: the receipt says so and names the in-flight
effects that used the scope.

Cascade: a child run's grants are delegated from its parent's, so revoking or suspending a grant does
the same to every grant delegated from it, recursively. Restore is only from ``suspended`` (revoked is
final) and brings back the delegated grants that were suspended *by that cascade* -- a child grant
suspended on its own stays suspended until restored on its own.

Not owner-bound: a security responder does not wait for the run's decision authority (recorded all
the same). Allowed in every state except ``closed``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, TypedDict

from django.utils import timezone

from audit.services import record_audit
from core.actors import Actor
from core.errors import Conflict, Invalid
from core.roles import ADMIN, INCIDENT_COMMANDER, SECURITY_RESPONDER
from interventions import cards
from interventions.models import Intervention
from interventions.plugins import Answers, Console, Contract, Request, Rows, Spec
from runs.models import AuthorityGrant, Effect, Run
from runs.selectors import authority_envelope, unresolved_effects
from runs.services.decisions import lock_run, notify_run_changed
from runs.services.history import append_history
from runs.states import State

# kind -> (verb, statuses it acts on, status it sets)
CHANGES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "revoke_authority": (
        "revoke",
        (AuthorityGrant.ACTIVE, AuthorityGrant.SUSPENDED),
        AuthorityGrant.REVOKED,
    ),
    "suspend_authority": ("suspend", (AuthorityGrant.ACTIVE,), AuthorityGrant.SUSPENDED),
    "restore_authority": ("restore", (AuthorityGrant.SUSPENDED,), AuthorityGrant.ACTIVE),
}
CASCADE_MARK = "cascaded from grant "
NOT_RECALLED = (
    "requests already accepted by a remote system cannot be recalled: the in-flight effects below may "
    "still commit, and their outcomes will be recorded"
)


def _selected(run: Run, req: Request) -> list[AuthorityGrant]:
    grant_id, scope = req.options.get("grant_id"), req.options.get("scope")
    if bool(grant_id) == bool(scope):
        raise Invalid("give exactly one of options.grant_id or options.scope", field="options")
    grants = AuthorityGrant.objects.filter(run=run).order_by("granted_at")
    if grant_id:
        try:
            grants = grants.filter(pk=uuid.UUID(str(grant_id)))
        except ValueError:
            raise Invalid("options.grant_id must be a UUID", field="options.grant_id") from None
    else:
        if not isinstance(scope, str) or ":" not in scope:
            raise Invalid(
                "options.scope must look like 'tool:action' or 'tool:*'", field="options.scope"
            )
        tool, _, action = scope.partition(":")
        # "tool:*" selects every grant of the tool; "tool:action" the grants naming exactly that.
        grants = (
            grants.filter(scope__startswith=f"{tool}:")
            if action == "*"
            else grants.filter(scope=scope)
        )
    found = list(grants)
    if not found:
        raise Invalid(f"this run holds no grant matching {grant_id or scope!r}", field="options")
    return found


def _cascade(grant: AuthorityGrant, kind: str) -> list[AuthorityGrant]:
    """The grants delegated from ``grant`` (child runs, their children, ...) that the change reaches.
    Revoke and suspend reach every depth. Restore reaches only grants suspended by a cascade, and
    does not pass through a grant it does not restore (that one still blocks its delegations)."""
    acts_on = CHANGES[kind][1]
    out, frontier = [], [grant.pk]
    while frontier:
        children = list(
            AuthorityGrant.objects.filter(delegated_from_id__in=frontier).order_by("granted_at")
        )
        reached = [
            c
            for c in children
            if c.status in acts_on
            and (kind != "restore_authority" or c.change_reason.startswith(CASCADE_MARK))
        ]
        out.extend(reached)
        frontier = [c.pk for c in (reached if kind == "restore_authority" else children)]
    return out


def _grant_row(g: AuthorityGrant, now) -> dict[str, Any]:
    return {
        "id": str(g.pk),
        "run": str(g.run_id),
        "scope": g.scope,
        "status": g.effective_status(now),
        "expires_at": g.expires_at.isoformat(),
        "delegated_from": str(g.delegated_from_id) if g.delegated_from_id else None,
    }


def _in_flight_using(grants: list[AuthorityGrant]) -> list[dict[str, Any]]:
    rows, seen = [], set()
    for run_id in dict.fromkeys(g.run_id for g in grants):
        run_grants = [g for g in grants if g.run_id == run_id]
        for effect in Effect.objects.filter(
            run_id=run_id, decision=Effect.AUTHORIZED, status=Effect.IN_FLIGHT
        ):
            if effect.pk not in seen and any(
                g.covers(effect.tool, effect.action) for g in run_grants
            ):
                seen.add(effect.pk)
                rows.append(
                    {
                        "id": str(effect.pk),
                        "run": str(run_id),
                        "step": effect.step,
                        "tool": effect.tool,
                        "action": effect.action,
                        "idempotency_key": effect.idempotency_key,
                        "declared_at": effect.declared_at.isoformat(),
                        "note": "already dispatched: cannot be recalled; may still complete",
                    }
                )
    return rows


def _plan(
    run: Run, req: Request
) -> tuple[list[AuthorityGrant], list[AuthorityGrant], list[dict[str, Any]]]:
    """(grants selected, grants the change reaches incl. cascade, grants skipped with why)."""
    _, acts_on, _ = CHANGES[req.kind]
    selected, changing, skipped = _selected(run, req), [], []
    for grant in selected:
        if grant.status not in acts_on:
            skipped.append(
                {
                    "id": str(grant.pk),
                    "scope": grant.scope,
                    "status": grant.status,
                    "why": "revoked is final"
                    if grant.status == AuthorityGrant.REVOKED
                    else f"a {grant.status} grant cannot be {CHANGES[req.kind][0]}d",
                }
            )
            continue
        changing.append(grant)
        changing.extend(_cascade(grant, req.kind))
    return selected, list({g.pk: g for g in changing}.values()), skipped


class AuthorityPreview(TypedDict):
    """What revoking, suspending or restoring grants would change."""

    change: str
    grants: Rows
    will_change: Rows
    skipped: Rows
    cascade: Rows
    blocked_by: list[str]
    new_declarations: str
    cannot_recall: str | None
    in_flight_effects: Rows


class AuthorityReceipt(TypedDict):
    state: str
    change: str
    changed: Rows
    skipped: Rows
    authority_before: Rows
    authority_after: Rows
    children_authority_after: dict[str, Rows]
    new_declarations: str
    cannot_recall: str | None
    in_flight_effects: Rows


def preview(run: Run, req: Request, actor: Actor) -> AuthorityPreview:
    now = timezone.now()
    selected, changing, skipped = _plan(run, req)
    roots = {g.pk for g in selected}
    return {
        "change": CHANGES[req.kind][0],
        "grants": [_grant_row(g, now) for g in selected],
        "will_change": [_grant_row(g, now) for g in changing],
        "skipped": skipped,
        "cascade": [_grant_row(g, now) for g in changing if g.pk not in roots],
        "blocked_by": ["the run is closed: its authority can no longer change"]
        if run.state == State.CLOSED
        else [],
        "new_declarations": (
            "authorised again"
            if req.kind == "restore_authority"
            else "needing these grants are denied from the commit on"
        ),
        "cannot_recall": NOT_RECALLED if req.kind != "restore_authority" else None,
        "in_flight_effects": _in_flight_using(changing),
    }


def _check_restorable(grant: AuthorityGrant) -> None:
    source = grant.delegated_from
    while source is not None:
        if source.status != AuthorityGrant.ACTIVE:
            raise Conflict(
                f"grant {grant.scope} is delegated from grant {source.pk} which is {source.status}; "
                "restore that one first",
                grant=str(grant.pk),
                source=str(source.pk),
            )
        source = source.delegated_from


def _commit(
    changing: list[AuthorityGrant], roots: set, req: Request, actor: Actor, target: str, now
) -> list[dict[str, Any]]:
    changed = []
    for grant in changing:
        if req.kind == "restore_authority":
            _check_restorable(grant)
        was = grant.status
        mark = "" if grant.pk in roots else f"{CASCADE_MARK}{grant.delegated_from_id}: "
        # Compare-and-swap on the status we planned from: a concurrent change wins and we say so.
        updated = AuthorityGrant.objects.filter(pk=grant.pk, status=was).update(
            status=target,
            changed_at=now,
            changed_by=actor.label,
            change_reason=f"{mark}{req.reason}",
        )
        if updated != 1:
            raise Conflict(f"grant {grant.scope} changed meanwhile; try again", grant=str(grant.pk))
        grant.status = target
        changed.append({**_grant_row(grant, now), "was": was, "cascaded": grant.pk not in roots})
    return changed


def apply(run: Run, req: Request, actor: Actor, intervention: Intervention) -> AuthorityReceipt:
    if run.state == State.CLOSED:
        raise Conflict("the run is closed: its authority can no longer change", state=run.state)
    verb, _, target = CHANGES[req.kind]
    now = timezone.now()
    selected, changing, skipped = _plan(run, req)
    if not changing:
        raise Conflict(
            f"no grant to {verb}: "
            + "; ".join(f"{s['scope']} is {s['status']} ({s['why']})" for s in skipped),
            state=run.state,
            grants=skipped,
        )
    roots = {g.pk for g in selected}
    runs = {run.pk: run}
    for run_id in sorted({g.run_id for g in changing} - {run.pk}, key=str):
        runs[run_id] = lock_run(run_id)  # child runs: their history and envelope change too
    before = {pk: authority_envelope(r) for pk, r in runs.items()}
    changed = _commit(changing, roots, req, actor, target, now)
    in_flight = _in_flight_using(changing)
    after = {pk: authority_envelope(r) for pk, r in runs.items()}
    for grant, row in zip(changing, changed, strict=False):
        record_audit(
            actor=actor,
            action=f"authority.{verb}",
            object_type="grant",
            object_id=grant.pk,
            run_id=grant.run_id,
            reason=req.reason,
            context={
                "intervention": str(intervention.pk),
                "grant": row,
                "before": row["was"],
                "after": target,
                "authority_before": before[grant.run_id],
                "authority_after": after[grant.run_id],
                "in_flight_effects": [e for e in in_flight if e["run"] == str(grant.run_id)],
                "unresolved_effects": unresolved_effects(runs[grant.run_id]),
            },
        )
    for pk, r in runs.items():
        append_history(
            r,
            f"authority_{'restored' if target == AuthorityGrant.ACTIVE else target}",
            {
                "grants": [c for c in changed if c["run"] == str(pk)],
                "reason": req.reason,
                "intervention": str(intervention.pk),
                "authority_after": after[pk],
            },
            actor=actor,
        )
        notify_run_changed(r)
    return {
        "state": run.state,
        "change": verb,
        "changed": changed,
        "skipped": skipped,
        "authority_before": before[run.pk],
        "authority_after": after[run.pk],
        "children_authority_after": {str(pk): env for pk, env in after.items() if pk != run.pk},
        "new_declarations": (
            f"declarations needing these grants are denied (authority_{target}) from this commit on"
            if req.kind != "restore_authority"
            else "declarations covered by these grants are authorised again"
        ),
        "cannot_recall": NOT_RECALLED if req.kind != "restore_authority" else None,
        "in_flight_effects": in_flight,
    }


# --- on the console: its preview card and receipt, drawn by console/cards.py and console/receipts.py


def authority_card(p: Mapping[str, Any]) -> Answers:
    changing = p.get("will_change") or []
    cascade = p.get("cascade") or []
    return [
        cards.answer(
            "grants",
            f"Grants to {p.get('change')}",
            f"{len(changing)} grant(s), {len(cascade)} of them delegated from the selected ones"
            if changing
            else "",
            cards.grants_table(changing),
            empty="no grant matches",
        ),
        cards.answer("declarations", "New declarations", p.get("new_declarations", "")),
        cards.answer(
            "may_still_complete",
            "Already dispatched",
            p.get("cannot_recall") or "",
            cards.in_flight_table(p.get("in_flight_effects") or []),
            empty="nothing in flight under these grants",
        ),
    ]


def authority_receipt(r: Mapping[str, Any]) -> Answers:
    return [
        cards.answer(
            "changed",
            f"Grants {r.get('change')}d",
            "",
            cards.grants_table(r.get("changed") or [], was=True),
            empty="none",
        ),
        cards.answer("declarations", "New declarations", r.get("new_declarations", "")),
        cards.answer(
            "may_still_complete",
            "Already dispatched",
            r.get("cannot_recall") or "",
            cards.in_flight_table(r.get("in_flight_effects") or []),
            empty="nothing in flight under these grants",
        ),
    ]


def authority_blocking(p: Mapping[str, Any]) -> list[str]:
    out = list(p.get("blocked_by") or [])
    if not p.get("will_change") and not p.get("blocked_by"):
        out.append(f"no grant to {p.get('change')}: choose an active grant or another scope")
    return out


def _grants(data: Mapping[str, Any]) -> set[str]:
    """The statuses among the run's grants (the run page's facts): what a button has to act on."""
    return {g["status"] for g in data["authority"]}


# The kinds of this module share their console pieces.
AUTHORITY_CONSOLE = Console(
    card=authority_card,
    receipt=authority_receipt,
    blocking=authority_blocking,
    fields=("grant_id", "grant_scope"),
)

CONTRACTS = (
    Contract(
        kind="revoke_authority",
        event=None,
        preview=preview,
        apply=apply,
        spec=Spec(
            summary="withdraw grants for future use",
            stops=("declarations needing the grant, from the commit on",),
            continues=("requests a remote system already accepted cannot be recalled (listed)",),
            cascade="grants delegated from it (child runs) are revoked too",
            authority="revoked (final)",
            claims=("denied_after_commit", "cascades_to_delegations"),
        ),
        may_issue=frozenset({INCIDENT_COMMANDER, SECURITY_RESPONDER, ADMIN}),
        console=replace(
            AUTHORITY_CONSOLE,
            danger=True,
            offered=lambda d: bool(_grants(d) & {"active", "suspended"}),
        ),
        order=110,
    ),
    Contract(
        kind="suspend_authority",
        event=None,
        preview=preview,
        apply=apply,
        spec=Spec(
            summary="suspend grants until restored",
            stops=("declarations needing the grant",),
            continues=("in-flight requests",),
            cascade="delegated grants too",
            authority="suspended",
        ),
        may_issue=frozenset({INCIDENT_COMMANDER, SECURITY_RESPONDER, ADMIN}),
        console=replace(AUTHORITY_CONSOLE, offered=lambda d: "active" in _grants(d)),
        order=120,
    ),
    Contract(
        kind="restore_authority",
        event=None,
        preview=preview,
        apply=apply,
        spec=Spec(
            summary="restore suspended grants",
            stops=(),
            continues=("declarations may be authorised again",),
            cascade="delegated grants too",
            authority="active again (never a revoked grant)",
        ),
        may_issue=frozenset({SECURITY_RESPONDER, ADMIN}),
        console=replace(AUTHORITY_CONSOLE, offered=lambda d: "suspended" in _grants(d)),
        order=130,
    ),
)
