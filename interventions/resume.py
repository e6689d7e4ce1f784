"""Resume is a *new decision* against a changed world: the run enters ``revalidating``, a Celery job
builds the RevalidationReport, and only if every check passes -- or a permitted role overrode the
failing ones with a reason -- does the run become claimable again from the named checkpoint."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

from celery import shared_task
from django.db import transaction
from django.utils import timezone

from core.actors import Actor, system_actor
from core.roles import ADMIN, INCIDENT_COMMANDER, OPERATOR
from interventions import cards, facts, jobs
from interventions.base import finish_job, lock_pending_job
from interventions.models import Intervention
from interventions.plugins import Answers, Console, Contract, Request, Row, Rows, Spec
from interventions.revalidation import build_report
from runs.models import Run
from runs.selectors import latest_checkpoint, starting_checkpoint, unresolved_effects
from runs.services.decisions import apply_transition
from runs.services.history import append_history
from runs.services.lifecycle import set_resume_point
from runs.states import Event, State


class ResumePreview(TypedDict):
    resume_from: Row | None
    revalidation: str
    override: bool
    unresolved_effects: Rows
    timers_fired_while_paused: Rows
    checkpoint_seq: int | None
    re_executes: Rows  # each step that runs again, each effect with its idempotency protection


class ResumeReceipt(TypedDict):
    state: str
    resume_from: Row | None
    job: Row


def preview(run: Run, req: Request, actor: Actor) -> ResumePreview:
    cp = starting_checkpoint(run)
    return {
        "resume_from": facts.resume_point(run),
        "revalidation": "a job checks the boundary, versions, assumptions, unknown effects, authority and replayed "
        "steps; any failing check blocks the resume unless overridden with a reason",
        "override": bool(req.override_reason),
        "unresolved_effects": unresolved_effects(run),
        "timers_fired_while_paused": [t for t in facts.timers(run) if t["status"] == "fired"],
        "checkpoint_seq": cp.seq if cp else None,
        # Each step that runs again from the checkpoint, each effect it repeats with its protection.
        "re_executes": facts.re_executes(run, cp or latest_checkpoint(run)),
    }


def apply(run: Run, req: Request, actor: Actor, intervention: Intervention) -> ResumeReceipt:
    cp = starting_checkpoint(run)
    apply_transition(
        run,
        Event.RESUME,
        actor=actor,
        reason=req.reason,
        data={"override": bool(req.override_reason)},
    )
    Intervention.objects.filter(pk=intervention.pk).update(status=Intervention.PENDING)
    intervention.status = Intervention.PENDING
    job = jobs.enqueue("revalidation", intervention.pk, run)
    return {
        "state": run.state,
        "resume_from": {"seq": cp.seq, "step": cp.step} if cp else None,
        "job": {"kind": "revalidation", "status": "queued", "id": str(job.pk)},
    }


@shared_task(acks_late=True)
def revalidate_run(intervention_id: str) -> dict[str, Any]:
    """Idempotent: a second delivery finds the job done or the intervention concluded: nothing."""
    return jobs.perform("revalidation", intervention_id, lambda: _revalidate(intervention_id))


def _revalidate(intervention_id: str) -> dict[str, Any]:
    intervention = Intervention.objects.select_related("run__agent").get(pk=intervention_id)
    if intervention.status != Intervention.PENDING:
        return {"skipped": "already concluded"}
    report, refreshed = build_report(
        intervention.run, reobserve=bool(intervention.options.get("reobserve_assumptions"))
    )
    return conclude_resume(intervention_id, report.as_dict(), refreshed)


def conclude_resume(
    intervention_id: str, report: dict[str, Any], refreshed: list
) -> dict[str, Any]:
    actor = system_actor("revalidation")
    with transaction.atomic(durable=True):
        locked = lock_pending_job(intervention_id, State.REVALIDATING)
        if locked is None:
            return {"skipped": "already concluded, or the run has moved on"}
        intervention, run = locked
        for assumption, current in refreshed:
            append_history(
                run,
                "assumption_reobserved",
                {
                    "key": assumption.key,
                    "was": assumption.value,
                    "now": current,
                    "by": intervention.actor_label,
                },
                actor=actor,
            )
            assumption.value, assumption.observed_at = current, timezone.now()
            assumption.save(update_fields=["value", "observed_at"])
        overridden = not report["ok"] and bool(intervention.override_reason)
        append_history(
            run,
            "revalidation",
            {"ok": report["ok"], "failing": report["failing"], "overridden": overridden},
            actor=actor,
        )
        if report["ok"] or overridden:
            # Pin the checkpoint the pause left as the one to start from; a retry's backoff stands.
            set_resume_point(run, starting_checkpoint(run), claimable_after=run.claimable_after)
            why = (
                "all checks passed"
                if report["ok"]
                else f"override by {intervention.actor_label}: {intervention.override_reason}"
            )
            apply_transition(
                run,
                Event.REVALIDATION_PASSED,
                actor=actor,
                reason=why,
                data={"report": report["failing"], "override": overridden},
            )
            status = Intervention.COMPLETED
        else:
            apply_transition(
                run,
                Event.REVALIDATION_BLOCKED,
                actor=actor,
                reason="resume blocked: " + ", ".join(report["failing"]),
                data={"failing": report["failing"]},
            )
            status = Intervention.FAILED
        finish_job(
            intervention,
            status,
            {
                "kind": "revalidation",
                "report": report,
                "overridden": overridden,
                "outcome": "resumed" if status == Intervention.COMPLETED else "blocked",
                "state": run.state,
            },
        )
    return report


# --- on the console: its preview card and receipt, drawn by console/cards.py and console/receipts.py


CHECK_LABELS = {
    "boundary": "Checkpoint boundary",
    "versions": "Versions",
    "assumptions": "Assumptions",
    "unknown_effects": "Unknown effects",
    "authority": "Authority now",
    "replay": "Steps that run again",
}


def checks_table(report: dict[str, Any]) -> dict[str, Any]:
    return cards.table(
        ["check", "result", "what it found"],
        [
            cards.row(
                cards.cell("text", CHECK_LABELS.get(c["name"], c["name"])),
                cards.cell("status", "pass" if c["ok"] else "fail"),
                cards.cell("text", c.get("summary", "")),
                mark="" if c["ok"] else "fail",
                testid=f"check-{c['name']}",
            )
            for c in report.get("checks") or []
        ],
    )


def replay_table(
    report: Mapping[str, Any], steps: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The replay check's steps (a report), else the preview's own ``re_executes``."""
    replay = next((c for c in report.get("checks") or [] if c["name"] == "replay"), None)
    rows = []
    for step in (replay or {}).get("details") or steps or []:
        if not step.get("effects"):
            rows.append(
                cards.row(
                    cards.cell("code", step.get("step")),
                    cards.cell("text", "no effect"),
                    cards.cell("text", ""),
                    cards.cell("text", ""),
                    cards.cell("text", "runs again"),
                )
            )
        for e in step.get("effects") or []:
            rows.append(
                cards.row(
                    cards.cell("code", step.get("step")),
                    cards.effect_cell(e),
                    cards.cell("code", e.get("idempotency_key")),
                    cards.cell("status", e.get("status")),
                    cards.cell(
                        "text",
                        e.get("protection")
                        or ("replays the recorded result" if e.get("protected") else "UNPROTECTED"),
                    ),
                    mark="" if e.get("protected") else "fail",
                )
            )
    return cards.table(
        ["step", "effect", "idempotency key", "recorded", "when it runs again"], rows
    )


def resume_card(p: Mapping[str, Any]) -> Answers:
    fired = p.get("timers_fired_while_paused") or []
    report = p.get("dry_run") or {}
    failing = report.get("failing") or []
    if report.get("error"):
        checks = cards.answer("checks", "Checks now", f"could not check now: {report['error']}")
    else:
        checks = cards.answer(
            "checks",
            "Checks now",
            ("every check passes now" if not failing else "failing now: " + ", ".join(failing))
            + "; the revalidation job checks again on confirm"
            + (" and your override is used for a failing check" if p.get("override") else ""),
            checks_table(report),
            tone="bad" if failing else "",
        )
    return [
        checks,
        cards.answer(
            "runs_again",
            "Runs again",
            f"from {cards.checkpoint_text(p.get('resume_from'))}",
            replay_table(report, p.get("re_executes")),
            empty="no step with effects runs again",
        ),
        cards.answer(
            "timers_fired",
            "Timers fired while paused",
            "",
            cards.table(
                ["timer", "fired"],
                [
                    cards.row(cards.cell("code", t["name"]), cards.cell("time", t["fire_at"]))
                    for t in fired
                ],
            ),
            empty="none: delivered on resume if any fire",
        ),
    ]


def resume_receipt(r: Mapping[str, Any]) -> Answers:
    return [
        cards.answer("resume_from", "Runs again from", cards.checkpoint_text(r.get("resume_from"))),
        cards.answer(
            "checks",
            "Revalidation",
            "the report below lists each check as pass or fail and the steps that run again",
        ),
    ]


CONTRACTS = (
    Contract(
        kind="resume",
        event=Event.RESUME,
        preview=preview,
        apply=apply,
        spec=Spec(
            summary="a new decision against a changed world",
            stops=(),
            continues=("the run, from the named checkpoint, once revalidation passes",),
            cascade="this run only",
            authority="checked, not changed",
            jobs=(
                "revalidation: boundary, versions, assumptions, unknown effects, authority, replayed steps",
            ),
            claims=("blocked_by_failing_check_unless_override", "resumes_from_named_checkpoint"),
        ),
        may_issue=frozenset({OPERATOR, INCIDENT_COMMANDER, ADMIN}),
        console=Console(
            card=resume_card,
            receipt=resume_receipt,
            fields=("reobserve_assumptions",),
            guard_note="overrides a failing revalidation",
        ),
        order=20,
        guard_right="override_revalidation",
        owner_bound=True,
    ),
)
jobs.register_kind("revalidation", revalidate_run, jobs.give_up_intervention)
