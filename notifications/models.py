"""A notification channel and one delivery of one approval to it. Written only by
notifications.services and notifications.jobs; every change of a channel is audited."""

from __future__ import annotations

import uuid
from typing import Any

from django.db import models
from django.utils import timezone

__all__ = ["Channel", "Delivery"]

# A channel this many failed deliveries in a row is shown as failing (channel page and run page).
FAILING_AFTER = 5


class Channel(models.Model):
    WEBHOOK, SLACK, EMAIL = "webhook", "slack", "email"
    KINDS = [WEBHOOK, SLACK, EMAIL]

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=100, unique=True)
    kind = models.CharField(max_length=10)
    enabled = models.BooleanField(default=True)
    # webhook and slack: where to POST (a Slack incoming-webhook URL is itself a secret: masked).
    url = models.CharField(max_length=500, blank=True)
    # email: Django's SMTP backend with these settings, to these addresses.
    recipients = models.JSONField(default=list, blank=True)
    smtp_host = models.CharField(max_length=200, blank=True)
    smtp_port = models.PositiveIntegerField(default=25)
    smtp_username = models.CharField(max_length=200, blank=True)
    smtp_use_tls = models.BooleanField(default=False)
    from_email = models.CharField(max_length=200, blank=True)
    # The webhook signing key or the SMTP password, encrypted (notifications/secrets.py): both must be
    # read back to sign or to log in, so a hash would not do. Never shown; the pages show a mask.
    secret_encrypted = models.TextField(blank=True)
    # The approval roles (or on-call group names) this channel tells; empty = every approval.
    roles = models.JSONField(default=list, blank=True)
    # Escalation: a pending approval this channel told, undecided after this many seconds, is sent
    # again to the channels serving ``escalate_to`` (a role or an on-call group).
    escalate_after_s = models.PositiveIntegerField(null=True, blank=True)
    escalate_to = models.CharField(max_length=100, blank=True)
    # Health, written by every delivery: failures in a row, the last error.
    consecutive_failures = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    last_failure_at = models.DateTimeField(null=True, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    created_by = models.CharField(max_length=150, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(kind__in=["webhook", "slack", "email"]),
                name="channel_kind_valid",
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} channel {self.name}"

    @property
    def failing(self) -> bool:
        return self.consecutive_failures >= FAILING_AFTER

    def serves(self, role: str) -> bool:
        return not self.roles or role in self.roles

    def serves_approval(self, approval: Any) -> bool:
        """The approval's role, or a team one of its steps names (``team:payments`` in ``roles``:
        the channel of that team's people)."""
        teams = {f"team:{s['team']}" for s in approval.steps or () if s.get("team")}
        return self.serves(approval.required_role) or bool(teams & set(self.roles))


class Delivery(models.Model):
    """One message about one approval to one channel; its outbox job (kind ``notify``) retries it
    with backoff until it is sent. ``reason``: requested, escalated or test."""

    REQUESTED, ESCALATED, TEST = "requested", "escalated", "test"
    PENDING, SENT = "pending", "sent"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="deliveries")
    approval = models.ForeignKey(
        "runs.Approval", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    run = models.ForeignKey(
        "runs.Run", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    reason = models.CharField(max_length=10, default=REQUESTED)
    status = models.CharField(max_length=10, default=PENDING)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            # One message per approval, channel and reason: a re-run fan-out or escalation scan
            # cannot send it twice.
            models.UniqueConstraint(
                fields=["approval", "channel", "reason"],
                condition=models.Q(approval__isnull=False),
                name="one_delivery_per_approval_channel_reason",
            ),
            models.CheckConstraint(
                condition=models.Q(status__in=["pending", "sent"]), name="delivery_status_valid"
            ),
        ]
