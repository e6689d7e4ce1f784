"""Authority grants and the effect ledger: what a run may do, and what escaped into the world."""

from __future__ import annotations

import uuid

import pgtrigger
from django.db import models
from django.utils import timezone


class AuthorityGrant(models.Model):
    ACTIVE, SUSPENDED, REVOKED, EXPIRED = "active", "suspended", "revoked", "expired"
    STATUSES = [ACTIVE, SUSPENDED, REVOKED, EXPIRED]

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    run = models.ForeignKey("runs.Run", on_delete=models.PROTECT, related_name="grants")
    scope = models.CharField(max_length=200)  # "tool:action" or "tool:*"
    issuer = models.CharField(max_length=150)
    # A child run's grant is delegated from its parent's: never wider, never outliving it.
    delegated_from = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="delegations"
    )
    granted_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    status = models.CharField(max_length=10, default=ACTIVE)
    changed_at = models.DateTimeField(null=True, blank=True)
    changed_by = models.CharField(max_length=150, blank=True)
    change_reason = models.TextField(blank=True)

    class Meta:
        ordering = ["granted_at"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(status__in=["active", "suspended", "revoked", "expired"]),
                name="grant_status_valid",
            ),
        ]

    def covers(self, tool: str, action: str) -> bool:
        return self.scope in (f"{tool}:{action}", f"{tool}:*")

    def effective_status(self, now=None) -> str:
        if self.status == self.ACTIVE and self.expires_at <= (now or timezone.now()):
            return self.EXPIRED
        return self.status


class EffectQuerySet(models.QuerySet):
    def unresolved(self) -> EffectQuerySet:
        """Authorised effects whose outcome is not known yet (in flight or unknown): the one rule for
        "unresolved" that finishing, compensating, retrying, recovery and every page read."""
        return self.filter(Effect.unresolved_q())


class Effect(models.Model):
    """One external side effect (or a denied attempt at one). The ledger answers "what escaped"."""

    AUTHORIZED, DENIED = "authorized", "denied"
    IN_FLIGHT, COMMITTED, FAILED, UNKNOWN = "in_flight", "committed", "failed", "unknown"
    # A late outcome contradicted a reconciled status: both facts are kept (``reconciliation`` and
    # ``discrepancy``) and an operator must look; the compensation plan offers to undo it.
    DISCREPANCY = "discrepancy"
    STATUSES = [IN_FLIGHT, COMMITTED, FAILED, UNKNOWN, DISCREPANCY, DENIED]
    UNRESOLVED = (IN_FLIGHT, UNKNOWN)
    ACTION, COMPENSATION = "action", "compensation"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    run = models.ForeignKey("runs.Run", on_delete=models.PROTECT, related_name="effects")
    attempt = models.ForeignKey(
        "runs.Attempt", null=True, blank=True, on_delete=models.PROTECT, related_name="effects"
    )
    kind = models.CharField(max_length=12, default=ACTION)
    compensates = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="compensations"
    )
    step = models.CharField(max_length=100)
    tool = models.CharField(max_length=100)
    action = models.CharField(max_length=100)
    idempotency_key = models.CharField(max_length=200)
    fingerprint = models.CharField(max_length=64)
    args = models.JSONField(default=dict, blank=True)
    fencing_token = models.BigIntegerField(null=True, blank=True)
    decision = models.CharField(max_length=10)
    denial_reason = models.CharField(max_length=50, blank=True)
    status = models.CharField(max_length=12)
    compensation = models.JSONField(null=True, blank=True)  # {"tool","action","args"} or null
    irreversible = models.BooleanField(default=False)
    compensation_status = models.CharField(
        max_length=12, blank=True
    )  # "", pending, compensated, failed
    external_ref = models.CharField(max_length=200, blank=True)
    outcome_detail = models.JSONField(default=dict, blank=True)
    declared_at = models.DateTimeField(default=timezone.now)
    outcome_at = models.DateTimeField(null=True, blank=True)
    late = models.BooleanField(
        default=False
    )  # outcome arrived after the run stopped authorising effects
    stale_lease = models.BooleanField(default=False)  # outcome reported with a fenced-out token
    reconciled = models.BooleanField(default=False)
    reconciliation = models.JSONField(null=True, blank=True)  # {outcome, evidence, by, at, source}
    # The late outcome that contradicted the reconciliation: {reported, reconciled, external_ref, at, ...}
    discrepancy = models.JSONField(null=True, blank=True)

    objects = EffectQuerySet.as_manager()

    class Meta:
        ordering = ["declared_at"]
        constraints = [
            # One authorised effect per key per run, across attempts; denied declarations are kept too.
            models.UniqueConstraint(
                fields=["run", "idempotency_key"],
                condition=models.Q(decision="authorized"),
                name="one_effect_per_idempotency_key",
            ),
            models.CheckConstraint(
                condition=models.Q(
                    status__in=[
                        "in_flight",
                        "committed",
                        "failed",
                        "unknown",
                        "discrepancy",
                        "denied",
                    ]
                ),
                name="effect_status_valid",
            ),
            models.CheckConstraint(
                condition=models.Q(decision__in=["authorized", "denied"]),
                name="effect_decision_valid",
            ),
            models.CheckConstraint(
                condition=(
                    models.Q(decision="denied", status="denied")
                    | (~models.Q(decision="denied") & ~models.Q(status="denied"))
                ),
                name="effect_denied_iff_status_denied",
            ),
        ]
        indexes = [
            models.Index(fields=["run", "status"]),
            # The run list's filters (runs/search.py): "touched tool:action", and the "needs
            # attention" view's effects nobody knows the outcome of.
            models.Index(fields=["tool", "action", "run"], name="effect_tool_action_run"),
            models.Index(
                fields=["run"],
                condition=models.Q(status__in=["unknown", "discrepancy"]),
                name="effect_look_at_run",
            ),
        ]
        # Effects by decision and status, and effects ever declared, kept by the database in
        # LedgerTally (below) in the transaction that changes them: /metrics sums a few rows
        # instead of counting the ledger (controlplane/metrics.py).
        triggers = [
            pgtrigger.Trigger(
                name="effect_tally_insert",
                level=pgtrigger.Statement,
                when=pgtrigger.After,
                operation=pgtrigger.Insert,
                referencing=pgtrigger.Referencing(new="new_effects"),
                func=(
                    "INSERT INTO runs_ledgertally (series, key, n)"
                    " SELECT 'effects', decision || '/' || status, COUNT(*) FROM new_effects"
                    " GROUP BY decision, status"
                    " UNION ALL SELECT 'effects_declared', decision, COUNT(*) FROM new_effects"
                    " GROUP BY decision; RETURN NULL;"
                ),
            ),
            pgtrigger.Trigger(
                name="effect_tally_delete",
                level=pgtrigger.Statement,
                when=pgtrigger.After,
                operation=pgtrigger.Delete,
                referencing=pgtrigger.Referencing(old="old_effects"),
                func=(
                    "INSERT INTO runs_ledgertally (series, key, n)"
                    " SELECT 'effects', decision || '/' || status, -COUNT(*) FROM old_effects"
                    " GROUP BY decision, status; RETURN NULL;"
                ),
            ),
            pgtrigger.Trigger(
                name="effect_tally_update",
                level=pgtrigger.Row,
                when=pgtrigger.After,
                operation=pgtrigger.Update,
                condition=pgtrigger.Q(old__status__df=pgtrigger.F("new__status"))
                | pgtrigger.Q(old__decision__df=pgtrigger.F("new__decision")),
                func=(
                    "INSERT INTO runs_ledgertally (series, key, n) VALUES"
                    " ('effects', OLD.decision || '/' || OLD.status, -1),"
                    " ('effects', NEW.decision || '/' || NEW.status, 1); RETURN NULL;"
                ),
            ),
        ]

    @property
    def unresolved(self) -> bool:
        return self.decision == self.AUTHORIZED and self.status in self.UNRESOLVED

    @classmethod
    def unresolved_q(cls, prefix: str = "") -> models.Q:
        """``Effect.objects.unresolved()`` as a Q, for filters through a relation (``"effects__"``)."""
        return models.Q(
            **{f"{prefix}decision": cls.AUTHORIZED, f"{prefix}status__in": list(cls.UNRESOLVED)}
        )


class LedgerTally(models.Model):
    """Signed counts the database writes (triggers on Effect and ExecutionLease), so that /metrics
    reads a few rows whatever the ledger's size, as RunTally does for runs. ``series`` names what is
    counted: ``effects`` (key ``decision/status``, a gauge), ``effects_declared`` (key the decision,
    only ever +1: a counter) and ``lease_expiries`` (key empty, a counter). Rows pile up until
    ``runs.services.tally.compact_tally`` folds them into one per (series, key). PostgreSQL only."""

    series = models.CharField(max_length=40)
    key = models.CharField(max_length=80, blank=True)
    n = models.BigIntegerField()

    def __str__(self) -> str:
        return f"{self.series}:{self.key} {self.n:+d}"
