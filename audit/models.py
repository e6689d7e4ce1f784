"""The audit log: append-only (PostgreSQL triggers refuse UPDATE, DELETE and TRUNCATE), one row per
decision, hash-chained per chain: each run has its own chain (``run:<id>``), everything else
(accounts, tokens, agents, policies, refusals outside a run) goes to the ``system`` chain, and the rows
written before chains were split stay verifiable as the frozen ``legacy`` chain. A periodic signed
Merkle checkpoint over every chain's head (audit/anchors/) ties the chains together."""

from __future__ import annotations

import uuid

from django.db import models
from django.utils import timezone

from .triggers import append_only

LEGACY = "legacy"  # the single global chain of before per-chain audit; frozen, verified as it was
SYSTEM = "system"


class AuditEvent(models.Model):
    ALLOWED, DENIED, ERROR = "allowed", "denied", "error"

    # Global order for reading (pages, ``after_seq``), from a PostgreSQL sequence: not gap-free and not
    # evidence. The evidence is the position in the chain (``chain``, ``chain_seq``), which is hashed.
    seq = models.BigIntegerField(unique=True)
    chain = models.CharField(max_length=64)
    chain_seq = models.BigIntegerField()
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
            models.UniqueConstraint(fields=["chain", "chain_seq"], name="audit_chain_position"),
            models.CheckConstraint(
                condition=models.Q(outcome__in=["allowed", "denied", "error"]),
                name="audit_outcome_valid",
            ),
        ]
        triggers = append_only("audit")

    def __str__(self) -> str:
        what = f"{self.action} {self.object_type}:{self.object_id} {self.outcome}"
        return f"{self.chain}#{self.chain_seq} {self.actor} {what}"

    def hashed_fields(self) -> dict:
        """What the hash covers. ``seq`` is the position in the chain; the legacy chain's rows were
        hashed before chains had names (their position was the global seq, equal to ``chain_seq``)."""
        named = {} if self.chain == LEGACY else {"chain": self.chain}
        return named | {
            "seq": self.chain_seq,
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


class AuditChain(models.Model):
    """The head of one chain: its last position and hash. Every append moves it in the same statement
    as the INSERT (audit/chain/append.py), so its row lock, held to COMMIT, orders that chain's writers and
    nothing else: decisions on different runs never wait for each other here.

    ``prev_hash`` is the hash before the last append, so the append's RETURNING can hand the new row
    its link. On PostgreSQL a column ``xid`` (xid8, not in the model) records the transaction of the
    last append: the anchor writer uses it to sign only the heads that moved since the last anchor."""

    key = models.CharField(max_length=64, primary_key=True)
    seq = models.BigIntegerField(default=0)
    hash = models.CharField(max_length=64)
    prev_hash = models.CharField(max_length=64)
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.key}#{self.seq}"


class SsoIdentity(models.Model):
    """The person an identity provider vouches for, bound by what never changes at the IdP: its issuer
    and the subject (``iss``, ``sub``). The username is only what the person is called here: an IdP
    rename changes it (audited), never the account. Written by audit.access.sso only."""

    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    user = models.ForeignKey("auth.User", on_delete=models.CASCADE, related_name="sso_identities")
    created_at = models.DateTimeField(default=timezone.now)
    last_login_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["issuer", "subject"], name="sso_identity_issuer_subject"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.issuer} {self.subject} -> {self.user_id}"
