"""Reading the audit trail: one filter, used by the console's audit page and the API alike."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Q, QuerySet

from core.filters import BadFilter, parse_id_prefix, prefix_range

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
    since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet[AuditEvent]:
    """Audit events matching every filter given (empty = no filter), unordered.

    ``action`` names an action or a family of them: ``intervention`` matches ``intervention.pause``,
    ``run.claim`` matches only itself. ``actor`` matches part of the actor's name, case-insensitive.
    ``run_id`` is a run id or its prefix (the 8 characters pages show); one that is not hexadecimal
    matches nothing (it cannot name a run). ``since`` / ``until`` bound ``created_at``."""
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
            low, high = prefix_range(parse_id_prefix("run", str(run_id)))
        except BadFilter:
            qs = qs.none()
        else:
            qs = qs.filter(run_id__gte=low, run_id__lte=high)
    if since is not None:
        qs = qs.filter(created_at__gte=since)
    if until is not None:
        qs = qs.filter(created_at__lte=until)
    if after_seq is not None:
        qs = qs.filter(seq__gt=after_seq)
    if before_seq is not None:
        qs = qs.filter(seq__lt=before_seq)
    return qs
