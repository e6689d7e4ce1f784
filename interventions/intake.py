"""Hold intake: new runs of an agent, of a tool (runs holding a grant on it) or of everything are
accepted and queued but not claimed, until the hold is released. Runs already started are not
touched (pause or cancel them if they must stop). Release is one action: every queued run of the
scope becomes claimable again and the workers long-polling for its agents are woken.

Both are fleet contracts (``FLEET_CONTRACTS``, interventions/plugins.py): a preview (a pure read with
its digest), a decision in one transaction with its audit event, a receipt, a permission row.

No claim after the hold commits: the hold's transaction locks the agent rows in scope FOR UPDATE
(a run being created takes KEY SHARE on its agent at COMMIT, so it commits after the hold) and then
every queued run in scope FOR UPDATE (a claim holds its run's lock from ``lock_run`` to COMMIT, so a
claim in progress commits before the hold and a later one reads the hold in its facts,
runs/services/facts.py). tests/interventions/test_intake_race.py races them on PostgreSQL.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from django.db import IntegrityError, connection
from django.db.models import QuerySet
from django.utils import timezone

from audit.services import record_audit
from core import pg
from core.actors import Actor
from core.errors import Conflict, Forbidden, Invalid, NotFound, PreviewStale
from core.roles import ADMIN, INCIDENT_COMMANDER, may
from interventions.plugins import FleetContract, Spec
from runs.models import Agent, IntakeHold, Run, Team
from runs.services.decisions import decision
from runs.services.intake import held_q, live_holds, scope_label
from runs.services.teams import team_for_rule
from runs.states import State
from runs.team_scope import crosses_teams, rule_team, rule_team_slug, rules_scoped, scoped
from runs.work import NOTIFY_CHANNEL, work_key

QUEUE_ROWS = 50  # queued runs listed by age; the rest are counted
STARTED = (State.RUNNING, State.AWAITING_APPROVAL, State.PAUSING, State.PAUSED)


def check_scope(scope: Any, target: Any, actor: Actor | None = None) -> tuple[str, str]:
    if scope not in IntakeHold.SCOPES:
        raise Invalid(f"scope must be one of {list(IntakeHold.SCOPES)}", field="scope")
    target = (target or "").strip() if isinstance(target, str) else target
    if scope == IntakeHold.ALL:
        if target:
            raise Invalid("a hold of everything names no target", field="target")
        return scope, ""
    if not isinstance(target, str) or not target or len(target) > 100 or ":" in target:
        raise Invalid(f"target must name the {scope} to hold (no ':')", field="target")
    agents = Agent.objects.filter(name=target)
    if actor is not None:  # another team's agent: as one that does not exist
        agents = scoped(agents, actor)
    if scope == IntakeHold.AGENT and not agents.exists():
        raise Invalid(f"no agent named {target!r}", field="target")
    return scope, target


def _authorize(actor: Actor, kind: str) -> None:
    if actor.is_worker:
        raise Forbidden("a worker token can never hold or release intake")
    if not may(actor.roles, kind):
        raise Forbidden(f"role(s) {sorted(actor.roles) or ['none']} may not {kind}", kind=kind)


def _covered(holds: list[IntakeHold]) -> QuerySet[Run]:
    return Run.objects.filter(held_q(holds)) if holds else Run.objects.none()


def queue(holds: list[IntakeHold], now: Any = None, actor: Actor | None = None) -> dict[str, Any]:
    """The queued runs ``holds`` cover, oldest first, with their age in seconds (those ``actor``
    may see: every team's hold holds other teams' runs too)."""
    now = now or timezone.now()
    queued = _covered(holds).filter(state=State.QUEUED).select_related("agent")
    if actor is not None:
        queued = scoped(queued, actor)
    rows = list(queued.order_by("created_at")[:QUEUE_ROWS])
    return {
        "count": queued.count(),
        "oldest_age_s": round((now - rows[0].created_at).total_seconds(), 1) if rows else None,
        "runs": [
            {
                "id": str(r.pk),
                "agent": r.agent.name,
                "goal": r.goal[:120],
                "queued_at": r.created_at.isoformat(),
                "age_s": round((now - r.created_at).total_seconds(), 1),
            }
            for r in rows
        ],
    }


def _draft(scope: str, target: str, team: Team | None) -> IntakeHold:
    return IntakeHold(scope=scope, target=target, team=team, reason="preview", held_by="")


def _digest(content: dict[str, Any]) -> str:
    """Over what the decision depends on: the scope and whether (which) hold is live. Not the
    queue: runs keep arriving and ageing, and a hold covers the new ones all the same."""
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:32]


def hold_preview(*, actor: Actor, scope: Any, target: Any, team: str = "") -> dict[str, Any]:
    _authorize(actor, "hold_intake")
    scope, target = check_scope(scope, target, actor)
    return _hold_preview(scope, target, team_for_rule(actor, team))


def _hold_preview(scope: str, target: str, team: Team | None) -> dict[str, Any]:
    live = IntakeHold.objects.filter(
        scope=scope, target=target, team=team, released_at__isnull=True
    ).first()
    blocked = (
        [f"intake is already held for {scope_label(scope, target)} by {live.held_by}"]
        if live
        else []
    )
    draft = _draft(scope, target, team)
    covered = _covered([draft])
    return {
        "kind": "hold_intake",
        "scope": scope,
        "target": target,
        "team": rule_team_slug(draft),
        "covers": scope_label(scope, target),
        "new_runs": "accepted and queued, not claimed, from the commit on, until released",
        "queued": queue([draft]),
        "started_runs": covered.filter(state__in=STARTED).count(),
        "continues": "runs already started are not touched (pause or cancel them to stop them)",
        "blocked_by": blocked,
        "digest": _digest(
            {
                "kind": "hold_intake",
                "scope": scope,
                "target": target,
                "team": rule_team_slug(draft),
                "blocked": blocked,
            }
        ),
    }


def _check_digest(shown: dict[str, Any], seen: str | None) -> None:
    if seen and seen != shown["digest"]:
        raise PreviewStale(
            "intake changed since the preview you confirmed: review the new preview, then confirm",
            field="preview_digest",
            preview_digest=shown["digest"],
        )


def _lock_scope(holds: list[IntakeHold]) -> None:
    """The agent rows in scope, then the queued runs in scope, FOR UPDATE (see the module's note)."""
    if not pg.enabled(connection):
        return  # SQLite serialises writers already
    agents = Agent.objects.all()
    if holds[0].scope == IntakeHold.AGENT:
        agents = agents.filter(name=holds[0].target)
    list(agents.order_by("pk").select_for_update().values_list("pk", flat=True))
    runs = _covered(holds).filter(state=State.QUEUED).order_by("pk")
    list(runs.select_for_update(of=("self",)).values_list("pk", flat=True))


def hold_intake(
    *,
    actor: Actor,
    scope: Any,
    target: Any,
    reason: str,
    seen_digest: str | None = None,
    team: str = "",
) -> IntakeHold:
    with decision(actor, "intervention.hold_intake", "intake_hold", f"{scope}:{target or '*'}"):
        _authorize(actor, "hold_intake")
        if not (reason or "").strip():
            raise Invalid("a reason is required for every intervention", field="reason")
        scope, target = check_scope(scope, target, actor)
        owner = team_for_rule(actor, team)
        _lock_scope([_draft(scope, target, owner)])
        shown = _hold_preview(scope, target, owner)
        _check_digest(shown, seen_digest)
        if shown["blocked_by"]:
            raise Conflict(shown["blocked_by"][0], scope=scope, target=target)
        now = timezone.now()
        try:
            hold = IntakeHold.objects.create(
                scope=scope,
                target=target,
                team=owner,
                reason=reason,
                held_by=actor.name,
                role=actor.role,
                held_at=now,
            )
        except IntegrityError as err:  # one_live_intake_hold: a concurrent hold of the scope won
            raise Conflict(f"intake is already held for {scope_label(scope, target)}") from err
        hold.receipt = {
            "kind": "hold_intake",
            "hold": str(hold.pk),
            "issued_by": actor.name,
            "role": actor.role,
            "reason": reason,
            "covers": shown["covers"],
            "team": shown["team"],
            "at": now.isoformat(),
            "new_runs": shown["new_runs"],
            "queued_at_hold": shown["queued"]["count"],
            "continues": shown["continues"],
            "preview_digest": shown["digest"],
        }
        hold.save(update_fields=["receipt"])
        record_audit(
            actor=actor,
            action="intervention.hold_intake",
            object_type="intake_hold",
            object_id=hold.pk,
            reason=reason,
            context=hold.receipt | _marked(actor, hold),
        )
    return hold


def _marked(actor: Actor, hold: IntakeHold) -> dict[str, Any]:
    """Under the cross_team right on every team's or another team's hold: said so, as on runs."""
    return {"cross_team": True} if crosses_teams(actor, hold) else {}


def get_hold(hold_id: Any, actor: Actor) -> IntakeHold:
    """The hold, if ``actor`` may know of it (their teams' or every team's); else 404."""
    hold = rules_scoped(IntakeHold.objects.select_related("team"), actor).filter(pk=hold_id).first()
    if hold is None:  # or another team's: as absent (docs/operator/teams.md)
        raise NotFound(f"intake hold {hold_id} does not exist", object="intake_hold")
    return hold


def _may_release(actor: Actor, hold: IntakeHold) -> None:
    """Every team's hold is released only under cross_team: it holds other teams' runs too."""
    if rule_team(hold) is None and actor.team_scoped:
        raise Forbidden(
            "this hold covers every team's runs: releasing it needs the cross_team right",
            field="team",
        )


def release_preview(*, actor: Actor, hold_id: Any) -> dict[str, Any]:
    _authorize(actor, "release_intake")
    hold = get_hold(hold_id, actor)
    _may_release(actor, hold)
    return _release_preview(hold)


def _release_preview(hold: IntakeHold) -> dict[str, Any]:
    blocked = [] if hold.live else [f"released already, by {hold.released_by}"]
    # The holds that may cover the same runs: every team's, and (for a team's) that team's.
    others = [
        h
        for h in live_holds()
        if h.pk != hold.pk and (hold.team_id is None or h.team_id in (None, hold.team_id))
    ]
    waiting = queue([hold])
    still = set(
        _covered(others)
        .filter(pk__in=[r["id"] for r in waiting["runs"]])
        .values_list("pk", flat=True)
    )
    return {
        "kind": "release_intake",
        "hold": str(hold.pk),
        "covers": scope_label(hold.scope, hold.target),
        "team": rule_team_slug(hold),
        "held_by": hold.held_by,
        "held_at": hold.held_at.isoformat(),
        "held_reason": hold.reason,
        "queued": waiting,
        "becomes_claimable": "every queued run of the scope, oldest first, from the commit on",
        # A run another live hold also covers stays held: named, so release does not surprise.
        "still_held": [str(pk) for pk in still],
        "other_holds": [scope_label(h.scope, h.target) for h in others],
        "blocked_by": blocked,
        "digest": _digest({"kind": "release_intake", "hold": str(hold.pk), "blocked": blocked}),
    }


def _wake_workers(agent_ids: list[int]) -> None:
    """pg_notify is transactional: the workers long-polling for these agents wake after COMMIT."""
    if agent_ids and pg.enabled(connection):
        with connection.cursor() as cur:
            cur.execute(
                "SELECT " + ", ".join(["pg_notify(%s, %s)"] * len(agent_ids)),
                [v for pk in agent_ids for v in (NOTIFY_CHANNEL, work_key(pk))],
            )


def release_intake(
    *, actor: Actor, hold_id: Any, reason: str, seen_digest: str | None = None
) -> IntakeHold:
    with decision(actor, "intervention.release_intake", "intake_hold", hold_id):
        _authorize(actor, "release_intake")
        if not (reason or "").strip():
            raise Invalid("a reason is required for every intervention", field="reason")
        locked = IntakeHold.objects.select_for_update(of=("self",)).select_related("team")
        hold = rules_scoped(locked, actor).filter(pk=hold_id).first()
        if hold is None:  # or another team's: as absent (docs/operator/teams.md)
            raise NotFound(f"intake hold {hold_id} does not exist", object="intake_hold")
        _may_release(actor, hold)
        shown = _release_preview(hold)
        _check_digest(shown, seen_digest)
        if shown["blocked_by"]:
            raise Conflict(shown["blocked_by"][0], hold=str(hold.pk))
        now = timezone.now()
        queued = _covered([hold]).filter(state=State.QUEUED)
        agents = sorted(set(queued.values_list("agent_id", flat=True)))
        hold.released_at, hold.released_by, hold.release_reason = now, actor.name, reason
        hold.receipt = {
            **hold.receipt,
            "release": {
                "kind": "release_intake",
                "issued_by": actor.name,
                "role": actor.role,
                "reason": reason,
                "at": now.isoformat(),
                "released_runs": shown["queued"]["count"],
                "still_held": shown["still_held"],
                "held_for_s": round((now - hold.held_at).total_seconds(), 1),
                "preview_digest": shown["digest"],
            },
        }
        hold.save(update_fields=["released_at", "released_by", "release_reason", "receipt"])
        _wake_workers(agents)
        record_audit(
            actor=actor,
            action="intervention.release_intake",
            object_type="intake_hold",
            object_id=hold.pk,
            reason=reason,
            context={
                "hold": str(hold.pk),
                "covers": shown["covers"],
                "team": shown["team"],
                **hold.receipt["release"],
                **_marked(actor, hold),
            },
        )
    return hold


def hold_dict(
    hold: IntakeHold, with_queue: bool = True, actor: Actor | None = None
) -> dict[str, Any]:
    out = {
        "id": str(hold.pk),
        "scope": hold.scope,
        "target": hold.target,
        "covers": scope_label(hold.scope, hold.target),
        "team": rule_team_slug(hold),  # "*": every team's runs
        "reason": hold.reason,
        "held_by": hold.held_by,
        "held_at": hold.held_at.isoformat(),
        "live": hold.live,
        "released_at": hold.released_at.isoformat() if hold.released_at else None,
        "released_by": hold.released_by,
        "receipt": hold.receipt,
    }
    return out | ({"queued": queue([hold], actor=actor)} if with_queue and hold.live else {})


def intake_state(actor: Actor) -> dict[str, Any]:
    """The live holds with their queues, and the recent released ones (the console's and API's
    read): those ``actor`` may know of, each queue within the runs they may see."""
    live = live_holds(actor)
    released = IntakeHold.objects.filter(released_at__isnull=False).select_related("team")
    recent = rules_scoped(released, actor).order_by("-released_at")[:10]
    return {
        "holds": [hold_dict(h, actor=actor) for h in live],
        "queued": queue(live, actor=actor),
        "released": [hold_dict(h, with_queue=False) for h in recent],
    }


FLEET_CONTRACTS = (
    FleetContract(
        kind="hold_intake",
        spec=Spec(
            summary="accept and queue new runs of an agent, a tool or everything, but start none",
            stops=(
                "claims of queued runs in scope (not_claimable, naming the hold), from the commit on",
            ),
            continues=(
                "runs already started (untouched)",
                "creating runs: they are accepted and queued, visible with their age",
            ),
            cascade="every run of the scope, present and future, until released",
            authority="unchanged",
            claims=("no_claim_after_hold",),
        ),
        may_issue=frozenset({INCIDENT_COMMANDER, ADMIN}),
        order=30,
        preview=hold_preview,
        issue=hold_intake,
        audit="intervention.hold_intake",
        receipt=(
            "hold",
            "issued_by",
            "role",
            "reason",
            "covers",
            "at",
            "new_runs",
            "queued_at_hold",
            "continues",
            "preview_digest",
        ),
        endpoints=("POST /api/v1/intake/holds/preview", "POST /api/v1/intake/holds"),
        console="/intake/",
    ),
    FleetContract(
        kind="release_intake",
        spec=Spec(
            summary="lift an intake hold: its queued runs become claimable, oldest first",
            stops=(),
            continues=("claims of the scope's queued runs (workers are woken)",),
            cascade="every queued run of the hold's scope, at once",
            authority="unchanged",
        ),
        may_issue=frozenset({INCIDENT_COMMANDER, ADMIN}),
        order=40,
        preview=release_preview,
        issue=release_intake,
        audit="intervention.release_intake",
        receipt=(
            "issued_by",
            "role",
            "reason",
            "at",
            "released_runs",
            "still_held",
            "held_for_s",
            "preview_digest",
        ),
        endpoints=(
            "POST /api/v1/intake/holds/{hold_id}/release/preview",
            "POST /api/v1/intake/holds/{hold_id}/release",
        ),
        console="/intake/",
    ),
)
