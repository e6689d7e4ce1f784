"""The machine-readable contracts: what each intervention stops, what continues, cascade, effect on
authority, who may issue it, preconditions and follow-up jobs. Served at GET /api/v1/contracts,
rendered on the contracts page, and checked claim by claim by tests/interventions/test_contracts.py.

Roles and state edges are not repeated here: they are read from core.roles and runs.states.
"""

from __future__ import annotations

from typing import Any

from core.roles import PERMISSIONS
from interventions.base import OWNER_BOUND
from runs.states import TRANSITIONS, Event, as_table

CONTRACT_SPECS: dict[str, dict[str, Any]] = {
    "pause": {
        "event": Event.PAUSE,
        "summary": "preserves the run: stops new progress",
        "stops": [
            "authorisation of new effects, from the commit on",
            "new steps (directive 'pause')",
        ],
        "continues": [
            "in-flight effects may complete; outcomes are recorded (flagged late)",
            "timers fire and are recorded",
            "deadlines keep running",
            "signals and operator messages are recorded",
        ],
        "cascade": "operator's choice: scope 'run' or 'tree'; children are listed either way",
        "authority": "unchanged by default (receipt lists active grants and expiry); option suspend_authority",
        "jobs": [],
        "claims": [
            "new_effects_denied_after_commit",
            "inflight_outcome_recorded",
            "timers_continue",
            "children_listed",
        ],
    },
    "resume": {
        "event": Event.RESUME,
        "summary": "a new decision against a changed world",
        "stops": [],
        "continues": ["the run, from the named checkpoint, once revalidation passes"],
        "cascade": "this run only",
        "authority": "checked, not changed",
        "jobs": [
            "revalidation: boundary, versions, assumptions, unknown effects, authority, replayed steps"
        ],
        "claims": ["blocked_by_failing_check_unless_override", "resumes_from_named_checkpoint"],
    },
    "cancel": {
        "event": Event.CANCEL,
        "summary": "stops future work; committed effects stay committed",
        "stops": [
            "authorisation of new effects",
            "new steps (directive 'cancel'); forced at lease expiry, or at once by a second cancel",
            "a recovery or compensation under way (a compensation step already called finishes)",
        ],
        "continues": ["in-flight effects' outcomes are recorded"],
        "cascade": "scope 'run' or 'tree'",
        "authority": "unchanged",
        "jobs": [],
        "claims": ["committed_effects_listed_with_compensations", "never_marks_undone"],
    },
    "retry": {
        "event": Event.RETRY,
        "summary": "another attempt with its own identity",
        "stops": [],
        "continues": ["from a named checkpoint, reusing idempotency keys"],
        "cascade": "this run only",
        "authority": "unchanged",
        "preconditions": [
            "no effect of the previous attempt in flight or unknown",
            "attempts left under the policy",
            "failure class retryable (or override)",
        ],
        "jobs": [],
        "claims": ["refused_while_unknown", "new_attempt_own_id", "keys_reused"],
    },
    "reconcile": {
        "event": None,
        "summary": "settle effects of unknown outcome from the external system's answer or evidence",
        "stops": [],
        "continues": ["everything"],
        "cascade": "this run only",
        "authority": "unchanged",
        "jobs": [
            "ask each registered reconciler by idempotency key; 'never seen' is failed only once the "
            "lease is fenced and the key voided by the adapter, or the commit window passed"
        ],
        "claims": ["evidence_recorded", "unknown_until_known", "late_contradiction_is_discrepancy"],
    },
    "compensate": {
        "event": Event.COMPENSATE,
        "summary": "semantic repair of committed effects, in reverse order",
        "stops": ["the run's execution"],
        "continues": ["the compensation plan, executed by Celery with retries"],
        "cascade": "this run only",
        "authority": "compensations are ledger effects with their own idempotency keys",
        "jobs": ["execute the compensation plan; ends completed, partially_failed or failed"],
        "claims": ["reverse_order", "irreversible_called_out", "each_compensation_once"],
    },
    "transfer": {
        "event": None,
        "summary": "changes accountability: assignment, execution lease, decision authority",
        "stops": [],
        "continues": ["the run, unchanged"],
        "cascade": "this run only",
        "authority": "decision rights move to the new owner; grants are handed over as they are",
        "jobs": [],
        "claims": ["facets_separate", "former_owner_rejected"],
    },
    "recover": {
        "event": Event.RECOVER,
        "summary": "reconcile durable state with the world after a worker disappears",
        "stops": [],
        "continues": ["replay, redrive, retry, compensate or escalate, with the reason it is safe"],
        "cascade": "this run only",
        "authority": "the dead worker's fencing token is refused",
        "jobs": [
            "recovery: rebuild from checkpoint + history, verify chain, check versions, reconcile, choose"
        ],
        "claims": ["orphan_detected", "chain_verified", "zombie_refused"],
    },
    "approve": {
        "event": Event.APPROVE,
        "summary": "a planned human-in-the-loop boundary: approve the exact action",
        "stops": [],
        "continues": ["the run, with a single-use approval bound to the action's digest"],
        "cascade": "this run only",
        "authority": "one declaration matching the digest",
        "jobs": [],
        "claims": [
            "four_eyes",
            "digest_bound",
            "single_use",
            "policy_required_by_registration",
            "policy_role_wins",
            "superseded_when_the_run_moves_on",
        ],
    },
    "reject": {
        "event": Event.REJECT,
        "summary": "refuse the requested action",
        "stops": ["the requested action"],
        "continues": ["the run, which learns the rejection"],
        "cascade": "this run only",
        "authority": "unchanged",
        "jobs": [],
        "claims": ["four_eyes"],
    },
    "revoke_authority": {
        "event": None,
        "summary": "withdraw grants for future use",
        "stops": ["declarations needing the grant, from the commit on"],
        "continues": ["requests a remote system already accepted cannot be recalled (listed)"],
        "cascade": "grants delegated from it (child runs) are revoked too",
        "authority": "revoked (final)",
        "jobs": [],
        "claims": ["denied_after_commit", "cascades_to_delegations"],
    },
    "suspend_authority": {
        "event": None,
        "summary": "suspend grants until restored",
        "stops": ["declarations needing the grant"],
        "continues": ["in-flight requests"],
        "cascade": "delegated grants too",
        "authority": "suspended",
        "jobs": [],
        "claims": [],
    },
    "restore_authority": {
        "event": None,
        "summary": "restore suspended grants",
        "stops": [],
        "continues": ["declarations may be authorised again"],
        "cascade": "delegated grants too",
        "authority": "active again (never a revoked grant)",
        "jobs": [],
        "claims": [],
    },
    "freeze_capability": {
        "event": None,
        "summary": "hold back one tool:action on the run, whatever its grants say",
        "stops": ["declarations of that tool:action (capability_frozen), from the commit on"],
        "continues": [
            "in-flight requests (cannot be recalled; listed)",
            "every other capability",
            "the grants themselves (unchanged)",
        ],
        "cascade": "this run only; a fleet operation freezes a filter's runs, one decision each",
        "authority": "grants unchanged; the capability is frozen until restored",
        "jobs": [],
        "claims": ["denied_after_commit"],
    },
    "restore_capability": {
        "event": None,
        "summary": "lift a capability freeze",
        "stops": [],
        "continues": ["declarations of that tool:action are decided by the grants again"],
        "cascade": "this run only",
        "authority": "unchanged",
        "jobs": [],
        "claims": [],
    },
    "close": {
        "event": Event.CLOSE,
        "summary": "the accountable owner ends the case",
        "stops": ["everything, for good"],
        "continues": [],
        "cascade": "this run only",
        "authority": "unchanged",
        "jobs": [],
        "claims": [],
    },
}


def contract_for(kind: str) -> dict[str, Any]:
    spec = dict(CONTRACT_SPECS[kind])
    event = spec.pop("event")
    spec["kind"] = kind
    spec["event"] = event.value if event else None
    spec["may_issue"] = sorted(PERMISSIONS.get(kind, frozenset()))
    spec["honours_decision_authority"] = kind in OWNER_BOUND
    spec["override_roles"] = sorted(PERMISSIONS["override"])
    spec["from_states"] = (
        sorted(s.value for s, edges in TRANSITIONS.items() if event in edges)
        if event
        else "any but closed"
    )
    spec["transitions"] = [row for row in as_table() if event and row["event"] == event.value]
    spec["reason_required"] = True
    return spec


def contracts_document() -> dict[str, Any]:
    return {
        "contracts": {kind: contract_for(kind) for kind in CONTRACT_SPECS},
        "state_machine": as_table(),
        "permissions": {k: sorted(v) for k, v in PERMISSIONS.items()},
    }
