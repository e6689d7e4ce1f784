"""Standing capability freezes: a rule over a scope of the fleet, not a one-off selection.

``freeze`` holds back one ``tool:action`` (or ``tool:*``: the whole tool) over everything, an agent's
runs, or the runs a filter describes, until ``restore``: every run it covers, including those created,
claimed, resumed, retried or delegated to after it was set, has its declarations of it denied
``capability_frozen``, naming the freeze, who set it and why (runs/services/freeze.py reads it in the
declaration's one facts statement). Restore lifts it for all of them at once. Each has a preview (a
pure read, with a digest a confirm sends back), a receipt and an audit event; a refusal is audited
too (runs.services.decisions.decision). Per-run freezes (interventions/freeze.py) are separate and
unchanged by either.

Both are fleet contracts (``FLEET_CONTRACTS`` below, interventions/plugins.py): ``standing_freeze``
and ``standing_restore``, each with its permission row (plus ``fleet``), its entry on the contracts
page, its API (api/freezes.py) and its console form (the fleet page). They are the only freeze over a
scope of the fleet: the fleet operation kinds that once froze a one-off selection run by run are
retired (interventions/fleet/selection.py; docs/operator/fleet.md#standing-freezes).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Count
from django.http import QueryDict
from django.utils import timezone

from audit.services import record_audit
from core.actors import Actor
from core.errors import Conflict, Forbidden, Invalid, NotFound, PreviewStale
from core.roles import ADMIN, INCIDENT_COMMANDER, SECURITY_RESPONDER, may
from interventions.freeze import scope_of
from interventions.plugins import FleetContract, Spec
from runs.freezes import FILTER_KEYS, freeze_dict, live_standing, run_filter, runs_covered
from runs.models import DEFAULT_TEAM, Agent, Effect, StandingFreeze
from runs.search import BadFilter
from runs.services.decisions import decision
from runs.services.teams import team_for_rule
from runs.team_scope import crosses_teams, rule_team, rule_team_slug, rules_scoped, scoped

PREVIEW_ROWS = 25


def authorize(actor: Actor, kind: str = "standing_freeze") -> None:
    """``kind``: standing_freeze (set one) or standing_restore (lift one); each with ``fleet``."""
    if actor.is_worker:
        raise Forbidden("a worker token can never freeze a capability")
    if not (may(actor.roles, "fleet") and may(actor.roles, kind)):
        what = "restore" if kind == "standing_restore" else "set"
        raise Forbidden(
            f"role(s) {sorted(actor.roles) or ['none']} may not {what} a standing freeze",
            kind=kind,
        )


def scope(
    actor: Actor, over: str, agent: str = "", filter_text: str = "", team: str = ""
) -> StandingFreeze:
    """An unsaved freeze holding the checked scope and team (refusals name the field): the team
    is the one named, else the actor's (docs/operator/teams.md); an agent the actor may not see is
    refused as one that does not exist, and a team's freeze names an agent of that team."""
    if over not in StandingFreeze.OVER:
        raise Invalid(f"over must be one of {StandingFreeze.OVER}", field="over")
    owner = team_for_rule(actor, team)
    if over == StandingFreeze.AGENT:
        agents = scoped(Agent.objects.all(), actor)
        found = agents.filter(name=agent).first() if agent else None
        if found is None:
            raise Invalid(f"no agent named {agent!r}", field="agent")
        if owner is not None and (found.team_id or 0) != (
            0 if owner.slug == DEFAULT_TEAM else owner.pk
        ):
            raise Invalid(f"agent {agent!r} is not in team {owner.slug!r}", field="agent")
        return StandingFreeze(over=over, agent=found, team=owner)
    if agent:
        raise Invalid("agent is only for over=agent", field="agent")
    if over == StandingFreeze.FILTER:
        return StandingFreeze(over=over, run_filter=canonical_filter(filter_text), team=owner)
    if filter_text:
        raise Invalid("filter is only for over=filter", field="filter")
    return StandingFreeze(over=over, team=owner)


def canonical_filter(text: str) -> str:
    query = QueryDict(text)
    for key in query:
        if key not in FILTER_KEYS:
            raise Invalid(
                f"a standing freeze covers runs by what they are, not by {key!r}: use "
                f"{sorted(FILTER_KEYS)}",
                field=f"filter.{key}",
            )
    try:
        flt = run_filter(text)
    except BadFilter as err:
        raise Invalid(err.detail, field=f"filter.{err.field}") from None
    if flt.is_empty:
        raise Invalid(
            "choose the runs: by agent, owner, goal text, id or tool touched", field="filter"
        )
    return flt.to_query()


def _in_flight(runs: Any, capability: str) -> dict[str, Any]:
    tool, _, action = capability.partition(":")
    effects = Effect.objects.filter(
        run__in=runs, decision=Effect.AUTHORIZED, status=Effect.IN_FLIGHT, tool=tool
    )
    if action != "*":
        effects = effects.filter(action=action)
    rows = [
        {
            "id": str(e.pk),
            "run_id": str(e.run_id),
            "step": e.step,
            "tool": e.tool,
            "action": e.action,
            "idempotency_key": e.idempotency_key,
            "declared_at": e.declared_at.isoformat(),
        }
        for e in effects.order_by("declared_at")[:PREVIEW_ROWS]
    ]
    return {"count": effects.count(), "effects": rows}


def _facts(freeze: StandingFreeze, restoring: bool) -> dict[str, Any]:
    """What a freeze (or its restore) touches today: the runs it covers, by state, and what is in
    flight under the capability across them."""
    covered = runs_covered(freeze)
    by_state = {
        r["state"]: r["n"] for r in covered.values("state").annotate(n=Count("id")).order_by()
    }
    shown = [
        {"id": str(r.pk), "agent": r.agent.name, "state": r.state}
        for r in covered.select_related("agent").order_by("-created_at")[:PREVIEW_ROWS]
    ]
    cap = freeze.capability
    return {
        "capability": cap,
        "over": freeze.over,
        "scope": freeze.scope_label,
        "team": rule_team_slug(freeze),
        "covers_now": sum(by_state.values()),
        "covers_by_state": by_state,
        "runs": shown,
        "covers_later": "runs created, claimed, resumed, retried or delegated to from now on, "
        "while they are in its scope",
        "new_declarations": (
            f"declarations of {cap} by every covered run are decided by its grants again"
            if restoring
            else f"declarations of {cap} by every covered run are denied (capability_frozen) "
            "from the commit on, naming this freeze, who set it and why"
        ),
        "per_run_freezes": "unchanged: a run's own freezes stand until restored on that run",
        "in_flight": {} if restoring else _in_flight(covered.values("pk"), cap),
        "cannot_recall": None
        if restoring
        else "in-flight effects below were dispatched already: they may still complete",
    }


def _digest(shown: dict[str, Any]) -> str:
    body = json.dumps(
        {k: v for k, v in shown.items() if k != "digest"}, sort_keys=True, default=str
    )
    return hashlib.sha256(body.encode()).hexdigest()[:32]


def _check_digest(shown: dict[str, Any], seen: str) -> None:
    if seen and seen != shown["digest"]:
        raise PreviewStale(
            f"the fleet changed since the preview you confirmed (now {shown['covers_now']} run(s) "
            f"covered, {shown['in_flight'].get('count', 0)} effect(s) in flight): preview again",
            field="digest",
            digest=shown["digest"],
            covers_now=shown["covers_now"],
        )


def _already(freeze: StandingFreeze) -> StandingFreeze | None:
    return (
        live_standing(freeze.capability)
        .filter(
            over=freeze.over, agent=freeze.agent, run_filter=freeze.run_filter, team=freeze.team
        )
        .first()
    )


def preview_freeze(
    *,
    actor: Actor,
    capability: str,
    over: str,
    agent: str = "",
    filter_text: str = "",
    team: str = "",
) -> dict[str, Any]:
    """What setting the freeze would do. Changes nothing."""
    authorize(actor)
    freeze = scope(actor, over, agent, filter_text, team)
    freeze.capability = scope_of({"scope": capability})
    live = _already(freeze)
    shown = _facts(freeze, restoring=False) | {
        "blocked_by": [f"already frozen over {freeze.scope_label} (freeze {live.pk})"]
        if live
        else []
    }
    return shown | {"digest": _digest(shown)}


def set_freeze(
    *,
    actor: Actor,
    capability: str,
    over: str,
    reason: str,
    agent: str = "",
    filter_text: str = "",
    digest: str = "",
    team: str = "",
) -> tuple[StandingFreeze, dict[str, Any]]:
    """One transaction: the freeze row and its audit event. Returns the freeze and its receipt."""
    freeze_id = uuid.uuid4()
    with decision(actor, "capability.standing_freeze", "standing_freeze", freeze_id):
        authorize(actor)
        if not reason.strip():
            raise Invalid("a reason is required for every freeze", field="reason")
        shown = preview_freeze(
            actor=actor,
            capability=capability,
            over=over,
            agent=agent,
            filter_text=filter_text,
            team=team,
        )
        if shown["blocked_by"]:
            raise Conflict(shown["blocked_by"][0], capability=shown["capability"])
        _check_digest(shown, digest)
        freeze = scope(actor, over, agent, filter_text, team)
        freeze.id, freeze.capability = freeze_id, shown["capability"]
        freeze.reason, freeze.frozen_by, freeze.frozen_at = reason, actor.label, timezone.now()
        try:
            with transaction.atomic():  # a savepoint: a twin set at the same moment loses cleanly
                freeze.save(force_insert=True)
        except IntegrityError:
            raise Conflict(
                f"{freeze.capability} was frozen over {freeze.scope_label} meanwhile",
                capability=freeze.capability,
            ) from None
        receipt = _recorded(freeze, shown, actor, "capability.standing_freeze", reason)
    return freeze, receipt


def _locked(freeze_id: Any, actor: Actor) -> StandingFreeze:
    qs = StandingFreeze.objects.select_for_update(of=("self",)).select_related("agent", "team")
    freeze = rules_scoped(qs, actor).filter(pk=freeze_id).first()
    if freeze is None:  # or another team's: as absent (docs/operator/teams.md)
        raise NotFound(f"standing freeze {freeze_id} does not exist", object="standing_freeze")
    return freeze


def get_freeze(freeze_id: Any, actor: Actor) -> StandingFreeze:
    """The freeze, if ``actor`` may know of it (their teams' or every team's); else 404."""
    qs = rules_scoped(StandingFreeze.objects.select_related("agent", "team"), actor)
    freeze = qs.filter(pk=freeze_id).first()
    if freeze is None:  # or another team's: as absent (docs/operator/teams.md)
        raise NotFound(f"standing freeze {freeze_id} does not exist", object="standing_freeze")
    return freeze


def _may_restore(actor: Actor, freeze: StandingFreeze) -> None:
    """Every team's freeze is lifted only under cross_team: it covers other teams' runs too."""
    if rule_team(freeze) is None and actor.team_scoped:
        raise Forbidden(
            "this freeze covers every team's runs: restoring it needs the cross_team right",
            field="team",
        )


def preview_restore(*, actor: Actor, freeze_id: Any) -> dict[str, Any]:
    authorize(actor, "standing_restore")
    freeze = get_freeze(freeze_id, actor)
    _may_restore(actor, freeze)
    shown = _facts(freeze, restoring=True) | {
        "freeze": freeze_dict(freeze),
        "blocked_by": [] if freeze.live else [f"restored already by {freeze.lifted_by}"],
    }
    return shown | {"digest": _digest(shown)}


def restore_freeze(
    *, actor: Actor, freeze_id: Any, reason: str, digest: str = ""
) -> tuple[StandingFreeze, dict[str, Any]]:
    """Lift it for every run it covers, at once: one row, one audit event."""
    with decision(actor, "capability.standing_restore", "standing_freeze", freeze_id):
        authorize(actor, "standing_restore")
        if not reason.strip():
            raise Invalid("a reason is required to restore a freeze", field="reason")
        freeze = _locked(freeze_id, actor)
        _may_restore(actor, freeze)
        if not freeze.live:
            raise Conflict(
                f"restored already by {freeze.lifted_by} at {freeze.lifted_at.isoformat()}"
                if freeze.lifted_at
                else "restored already",
                freeze=str(freeze.pk),
            )
        shown = preview_restore(actor=actor, freeze_id=freeze.pk)
        _check_digest(shown, digest)
        freeze.lifted_at, freeze.lifted_by, freeze.lift_reason = timezone.now(), actor.label, reason
        freeze.save(update_fields=["lifted_at", "lifted_by", "lift_reason"])
        receipt = _recorded(freeze, shown, actor, "capability.standing_restore", reason)
    return freeze, receipt


def _recorded(
    freeze: StandingFreeze, shown: dict[str, Any], actor: Actor, action: str, reason: str
) -> dict[str, Any]:
    """The receipt, audited with it (inside the decision's transaction)."""
    receipt = {
        "freeze": freeze_dict(freeze),
        "by": actor.label,
        "covers_now": shown["covers_now"],
        "covers_by_state": shown["covers_by_state"],
        "new_declarations": shown["new_declarations"],
        "per_run_freezes": shown["per_run_freezes"],
        "in_flight": shown["in_flight"],
        "preview_digest": shown["digest"],
    }
    # Under the cross_team right on every team's or another team's freeze: said so, as on runs.
    marked = {"cross_team": True} if crosses_teams(actor, freeze) else {}
    record_audit(
        actor=actor,
        action=action,
        object_type="standing_freeze",
        object_id=freeze.pk,
        reason=reason,
        context=receipt | marked,
    )
    return receipt


def freezes(actor: Actor, *, live_only: bool = False) -> list[StandingFreeze]:
    """The freezes ``actor`` may know of (their teams' and every team's), newest first."""
    qs = rules_scoped(StandingFreeze.objects.select_related("agent", "team"), actor)
    qs = qs.order_by("-frozen_at")
    return list(qs.filter(lifted_at__isnull=True) if live_only else qs[:100])


def run_count(freeze: StandingFreeze) -> int:
    return runs_covered(freeze).count()


RECEIPT = (
    "freeze",
    "by",
    "covers_now",
    "covers_by_state",
    "new_declarations",
    "per_run_freezes",
    "in_flight",
    "preview_digest",
)
WHO = frozenset({INCIDENT_COMMANDER, SECURITY_RESPONDER, ADMIN})

FLEET_CONTRACTS = (
    FleetContract(
        kind="standing_freeze",
        spec=Spec(
            summary="freeze a capability over everything, an agent or a filter of runs, until restored",
            stops=(
                "declarations of the capability (tool:action, or tool:* for the whole tool) by every "
                "run in scope: denied capability_frozen, naming the freeze, who set it and why",
            ),
            continues=(
                "runs in scope keep running; other capabilities are decided by their grants",
                "effects already in flight under the capability (the preview lists them: they may "
                "still complete)",
                "per-run freezes (their own contract), untouched",
            ),
            cascade="every run in scope, present and future: created, claimed, resumed, retried or "
            "delegated to after it",
            authority="grants unchanged: the freeze is checked at each declaration",
            claims=("standing_freeze_covers_later_runs",),
        ),
        may_issue=WHO,
        order=10,
        preview=preview_freeze,
        issue=set_freeze,
        audit="capability.standing_freeze",
        receipt=RECEIPT,
        endpoints=("POST /api/v1/fleet/freezes/preview", "POST /api/v1/fleet/freezes"),
        console="/fleet/#standing-freezes-panel",
    ),
    FleetContract(
        kind="standing_restore",
        spec=Spec(
            summary="lift a standing freeze for every run it covers, at once",
            stops=(),
            continues=(
                "declarations of the capability by every covered run: decided by their grants again",
                "per-run freezes, and other standing freezes of the capability, stand",
            ),
            cascade="every run the freeze covered, at once",
            authority="unchanged",
        ),
        may_issue=WHO,
        order=20,
        preview=preview_restore,
        issue=restore_freeze,
        audit="capability.standing_restore",
        receipt=RECEIPT,
        endpoints=(
            "POST /api/v1/fleet/freezes/{freeze_id}/restore/preview",
            "POST /api/v1/fleet/freezes/{freeze_id}/restore",
        ),
        console="/fleet/#standing-freezes-panel",
    ),
)
