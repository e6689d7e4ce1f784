"""Reading the audit trail: one filter, used by the console's audit page and the API alike."""

from __future__ import annotations

import uuid

from django.db.models import Q, QuerySet

from .models import AuditEvent


def audit_events(
    *,
    action: str = "",
    actor: str = "",
    outcome: str = "",
    object_type: str = "",
    component: str = "",
    run_id: str = "",
    after_seq: int | None = None,
    before_seq: int | None = None,
) -> QuerySet[AuditEvent]:
    """Audit events matching every filter given (empty = no filter), unordered.

    ``action`` names an action or a family of them: ``intervention`` matches ``intervention.pause``,
    ``run.claim`` matches only itself. ``actor`` matches part of the actor's name, case-insensitive.
    A ``run_id`` that is not a UUID matches nothing (it cannot name a run)."""
    qs = AuditEvent.objects.all()
    if action:
        family = action if action.endswith(".") else action + "."
        qs = qs.filter(Q(action=action.rstrip(".")) | Q(action__startswith=family))
    if actor:
        qs = qs.filter(actor__icontains=actor)
    if outcome:
        qs = qs.filter(outcome=outcome)
    if object_type:
        qs = qs.filter(object_type=object_type)
    if component:
        qs = qs.filter(component=component)
    if run_id:
        try:
            qs = qs.filter(run_id=uuid.UUID(str(run_id)))
        except ValueError:
            qs = qs.none()
    if after_seq is not None:
        qs = qs.filter(seq__gt=after_seq)
    if before_seq is not None:
        qs = qs.filter(seq__lt=before_seq)
    return qs
