"""The global audit log: append-only (PostgreSQL triggers refuse UPDATE, DELETE and TRUNCATE),
hash-chained, one row per decision."""

from __future__ import annotations

import uuid

from django.db import models
from django.utils import timezone

from .triggers import append_only


class AuditEvent(models.Model):
    ALLOWED, DENIED, ERROR = "allowed", "denied", "error"

    seq = models.BigIntegerField(unique=True)
    event_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    created_at = models.DateTimeField(default=timezone.now)
    actor_kind = models.CharField(max_length=10)
    actor = models.CharField(max_length=150)
    role = models.CharField(max_length=50, blank=True)
    on_behalf_of = models.CharField(max_length=150, blank=True)
    action = models.CharField(max_length=60, db_index=True)
    object_type = models.CharField(max_length=30)
    object_id = models.CharField(max_length=64)
    run_id = models.UUIDField(null=True, blank=True, db_index=True)
    reason = models.TextField(blank=True)
    outcome = models.CharField(max_length=10)
    component = models.CharField(max_length=30)
    source_ip = models.CharField(max_length=64, blank=True)
    user_agent = models.CharField(max_length=300, blank=True)
    request_id = models.CharField(max_length=64, blank=True)
    # For run control: state before/after, attempt, checkpoint, authority before/after, unresolved effects.
    context = models.JSONField(default=dict, blank=True)
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)

    class Meta:
        ordering = ["seq"]
        # The audit page's time range (console/audit.py): seq order, bounded by time.
        indexes = [models.Index(fields=["created_at"], name="audit_created_at")]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(outcome__in=["allowed", "denied", "error"]),
                name="audit_outcome_valid",
            ),
        ]
        triggers = append_only("audit")

    def __str__(self) -> str:
        return f"#{self.seq} {self.actor} {self.action} {self.object_type}:{self.object_id} {self.outcome}"

    def hashed_fields(self) -> dict:
        return {
            "seq": self.seq,
            "event_id": str(self.event_id),
            "created_at": self.created_at,
            "actor_kind": self.actor_kind,
            "actor": self.actor,
            "role": self.role,
            "on_behalf_of": self.on_behalf_of,
            "action": self.action,
            "object_type": self.object_type,
            "object_id": self.object_id,
            "run_id": str(self.run_id) if self.run_id else None,
            "reason": self.reason,
            "outcome": self.outcome,
            "component": self.component,
            "source_ip": self.source_ip,
            "user_agent": self.user_agent,
            "request_id": self.request_id,
            "context": self.context,
        }


class AuditChainHead(models.Model):
    """Singleton row locked FOR UPDATE by every audit writer, so concurrent writers never fork the chain.

    The lock is taken at a decision's first audit write and held until its COMMIT: a decision that
    writes more after its audit row (history, notify, a second audit row) holds it for that too.
    """

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    seq = models.BigIntegerField(default=0)
    hash = models.CharField(max_length=64)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=models.Q(id=1), name="audit_chain_head_singleton")
        ]
