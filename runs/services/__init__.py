"""Services are the only writers of run state. Views, API, tasks and commands call these."""

from .effects import (
    declare_effect,
    effect_dict,
    fingerprint,
    record_outcome,
    record_outcome_with,
)
from .lifecycle import (
    claim_run,
    create_run,
    expire_leases,
    finish_attempt,
    heartbeat,
    release_lease,
)
from .records import append_events, fire_due_timers, request_approval, write_checkpoint

__all__ = [
    "append_events",
    "claim_run",
    "create_run",
    "declare_effect",
    "effect_dict",
    "expire_leases",
    "finish_attempt",
    "fingerprint",
    "fire_due_timers",
    "heartbeat",
    "record_outcome",
    "record_outcome_with",
    "release_lease",
    "request_approval",
    "write_checkpoint",
]
