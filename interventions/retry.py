"""Retry creates *another attempt* -- with its own id, assigned when a worker claims it -- from a
named checkpoint, reusing the recorded idempotency keys. It is refused while any effect of the
previous attempt is in flight or unknown: reconcile first."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any, TypedDict

from django.utils import timezone

from core.actors import Actor
from core.errors import Conflict
from core.roles import ADMIN, INCIDENT_COMMANDER, OPERATOR
from interventions import cards, facts
from interventions.models import Intervention
from interventions.plugins import Answers, Console, Contract, Request, Row, Rows, Spec
from runs.models import Attempt, Checkpoint, Run
from runs.selectors import latest_checkpoint, unresolved_effects
from runs.services.decisions import apply_transition
from runs.services.lifecycle import set_resume_point
from runs.states import Event

DEFAULT_POLICY = {
    "max_attempts": 3,
    "backoff_s": 2,
    "backoff_factor": 2,
    "max_backoff_s": 300,
    "retryable": [],
    "non_retryable": ["invalid_input", "policy_violation", "authority"],
}


# (low, high) of each number in a policy; the API refuses anything else at the edge (api/schemas.py
# RetryPolicy), and this reader keeps the defaults for a value stored before it did.
POLICY_BOUNDS = {
    "max_attempts": (1, 100),
    "backoff_s": (0, 86_400),
    "backoff_factor": (1, 10),
    "max_backoff_s": (0, 86_400),
}


def _sane(name: str, value: Any) -> bool:
    if name in POLICY_BOUNDS:
        low, high = POLICY_BOUNDS[name]
        number = isinstance(value, int | float) and not isinstance(value, bool)
        return number and low <= value <= high  # NaN compares false: refused too
    if name in ("retryable", "non_retryable"):
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    return False


def policy(run: Run) -> dict[str, Any]:
    """The run's policy over the defaults. A stored value of the wrong type or out of bounds (a
    policy {"max_attempts": "never"} accepted before the edge checked it) falls back to its default:
    a recovery job or a retry preview must never fail on the policy and trap the run."""
    stored = run.retry_policy if isinstance(run.retry_policy, dict) else {}
    sane = {k: v for k, v in stored.items() if k in DEFAULT_POLICY and _sane(k, v)}
    return DEFAULT_POLICY | sane


def _last_attempt(run: Run) -> Attempt | None:
    return run.attempts.order_by("-number").first()


def _checkpoint(run: Run, req: Request) -> Checkpoint | None:
    return facts.chosen_checkpoint(run, req.options)


def _backoff(run: Run) -> int:
    p = policy(run)
    n = max(run.attempt_count - 1, 0)
    return int(min(p["backoff_s"] * (p["backoff_factor"] ** n), p["max_backoff_s"]))


class Eligibility(TypedDict):
    """Whether another attempt may start: the policy, the last attempt, and what stands in the way."""

    policy: Row
    last_attempt: Row | None
    problems: Rows


class RetryPreview(Eligibility):
    next_attempt: int
    backoff_s: float
    from_checkpoint: Row | int | None
    idempotency_keys: str


class RetryReceipt(TypedDict):
    state: str
    next_attempt: int
    note: str
    from_checkpoint: Row | None
    claimable_after: str | None
    previous_attempt: Row | None


def eligibility(run: Run, req: Request) -> Eligibility:
    p, last = policy(run), _last_attempt(run)
    failure = last.failure_class if last else ""
    unresolved = unresolved_effects(run)
    problems = []
    if unresolved:
        problems.append(
            {
                "error": "effects_unresolved",
                "detail": "the previous attempt is not accounted for: "
                f"{len(unresolved)} effect(s) in flight or unknown must be reconciled first",
                "effects": unresolved,
            }
        )
    if run.attempt_count >= p["max_attempts"]:
        problems.append(
            {
                "error": "retries_exhausted",
                "detail": f"{run.attempt_count} of {p['max_attempts']} attempts used; "
                "escalate: compensate, or close",
            }
        )
    if (
        failure
        and (failure in p["non_retryable"] or (p["retryable"] and failure not in p["retryable"]))
        and not req.override_reason
    ):
        problems.append(
            {
                "error": "not_retryable",
                "detail": f"failure class {failure!r} is not retryable under the policy",
            }
        )
    return {
        "policy": p,
        "last_attempt": {"number": last.number, "failure_class": failure, "id": str(last.pk)}
        if last
        else None,
        "problems": problems,
    }


def preview(run: Run, req: Request, actor: Actor) -> RetryPreview:
    info = eligibility(run, req)
    cp = latest_checkpoint(run) if req.options.get("checkpoint_seq") is None else None
    return {
        "policy": info["policy"],
        "last_attempt": info["last_attempt"],
        "problems": info["problems"],
        "next_attempt": run.attempt_count + 1,
        "backoff_s": _backoff(run),
        "from_checkpoint": {"seq": cp.seq, "step": cp.step}
        if cp
        else req.options.get("checkpoint_seq"),
        "idempotency_keys": "reused: effects already committed replay instead of repeating",
    }


def apply(run: Run, req: Request, actor: Actor, intervention: Intervention) -> RetryReceipt:
    info = eligibility(run, req)
    if info["problems"]:
        first = info["problems"][0]
        err = Conflict(first["detail"], state=run.state, problems=info["problems"])
        err.code = first["error"]
        raise err
    cp = _checkpoint(run, req)
    delay = _backoff(run)
    set_resume_point(run, cp, claimable_after=timezone.now() + timedelta(seconds=delay))
    apply_transition(
        run,
        Event.RETRY,
        actor=actor,
        reason=req.reason,
        data={"from_checkpoint": cp.seq if cp else None, "backoff_s": delay},
    )
    return {
        "state": run.state,
        "next_attempt": run.attempt_count + 1,
        "note": "the new attempt gets its own id when a worker claims it",
        "from_checkpoint": {"seq": cp.seq, "step": cp.step} if cp else None,
        "claimable_after": run.claimable_after.isoformat() if run.claimable_after else None,
        "previous_attempt": info["last_attempt"],
    }


# --- on the console: its preview card and receipt, drawn by console/cards.py and console/receipts.py


def retry_card(p: Mapping[str, Any]) -> Answers:
    last = p.get("last_attempt") or {}
    policy = p.get("policy") or {}
    cp = p.get("from_checkpoint")
    return [
        cards.answer(
            "next_attempt",
            "New attempt",
            f"attempt {p.get('next_attempt')} of {policy.get('max_attempts', '?')}, "
            f"claimable after {p.get('backoff_s', 0)} s backoff; it gets its own id when claimed",
        ),
        cards.answer(
            "from_checkpoint",
            "From",
            cards.checkpoint_text(cp) if isinstance(cp, dict) or cp is None else f"checkpoint {cp}",
        ),
        cards.answer("keys", "Idempotency keys", p.get("idempotency_keys", "")),
        cards.answer(
            "last_attempt",
            "Previous attempt",
            f"attempt {last.get('number')} ended with failure class "
            f"{last.get('failure_class') or 'none recorded'}"
            if last
            else "",
            empty="no attempt yet",
        ),
    ]


def retry_receipt(r: Mapping[str, Any]) -> Answers:
    prev = r.get("previous_attempt") or {}
    return [
        cards.answer(
            "next_attempt",
            "New attempt",
            f"attempt {r.get('next_attempt')}; {r.get('note', '')}; claimable",
            at=r.get("claimable_after"),
        ),
        cards.answer("from_checkpoint", "From", cards.checkpoint_text(r.get("from_checkpoint"))),
        cards.answer(
            "previous",
            "Previous attempt",
            f"attempt {prev.get('number')} ({prev.get('failure_class') or 'no failure class'})"
            if prev
            else "",
            empty="none",
        ),
    ]


def retry_blocking(p: Mapping[str, Any]) -> list[str]:
    return [pr["detail"] for pr in p.get("problems") or []]


def retry_more(p: Mapping[str, Any]) -> Answers:
    if not p.get("policy"):
        return []
    return [
        cards.answer(
            "policy",
            "Retry policy",
            "",
            cards.table(["policy"], [cards.row(cards.cell("value", p["policy"]))]),
        )
    ]


CONTRACTS = (
    Contract(
        kind="retry",
        event=Event.RETRY,
        preview=preview,
        apply=apply,
        spec=Spec(
            summary="another attempt with its own identity",
            stops=(),
            continues=("from a named checkpoint, reusing idempotency keys",),
            cascade="this run only",
            authority="unchanged",
            preconditions=(
                "no effect of the previous attempt in flight or unknown",
                "attempts left under the policy",
                "failure class retryable (or override)",
            ),
            claims=("refused_while_unknown", "new_attempt_own_id", "keys_reused"),
        ),
        may_issue=frozenset({OPERATOR, INCIDENT_COMMANDER, ADMIN}),
        console=Console(
            card=retry_card,
            receipt=retry_receipt,
            blocking=retry_blocking,
            more=retry_more,
            fields=("checkpoint_seq",),
            guard_note="overrides the retry policy's failure class check",
        ),
        order=40,
        owner_bound=True,
    ),
)
