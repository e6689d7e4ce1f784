"""Registered agents and the machine/personal tokens that act on the API."""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone


class Agent(models.Model):
    """An agent kind that may start runs, and the authority scopes its runs may ever hold."""

    name = models.SlugField(max_length=100, unique=True)
    description = models.TextField(blank=True)
    allowed_scopes = models.JSONField(
        default=list, help_text="e.g. ['payments:charge', 'inventory:*']"
    )
    # Versions a worker of this agent currently runs (reported at claim): what "now" means when a
    # resume or recovery compares a run's pinned versions.
    current_versions = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    # Owning team (runs.models.teams): NULL = the default team. Expand-only: no backfill.
    team = models.ForeignKey(
        "runs.Team", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )

    def __str__(self) -> str:
        return self.name


class ApprovalPolicy(models.Model):
    """A rule of the agent's registration: a declaration of ``tool:action`` whose args match
    ``condition`` needs an approval by ``approver_role`` (runs.conditions parses the condition; an
    empty one matches every call). Written only by runs.services.agents (audited)."""

    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="approval_policies")
    tool = models.CharField(max_length=100)
    action = models.CharField(max_length=100, help_text="an action name, or * for every action")
    condition = models.CharField(max_length=200, blank=True, help_text="e.g. amount>200")
    approver_role = models.CharField(max_length=50, default="approver")
    # Multi-party: StepSpec.as_json() rows (runs.conditions). Empty: one person of approver_role.
    steps = models.JSONField(default=list, db_default=[], blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    created_by = models.CharField(max_length=150, blank=True)

    class Meta:
        ordering = ["agent", "tool", "action", "id"]
        verbose_name_plural = "approval policies"

    def __str__(self) -> str:
        return self.spec

    @property
    def spec(self) -> str:
        """The ``--approval`` spelling: ``tool:action [condition] role``."""
        if not self.steps:
            parts = [f"{self.tool}:{self.action}", self.condition, self.approver_role]
            return " ".join(p for p in parts if p)
        from runs.conditions import StepSpec

        words = [f"{self.tool}:{self.action}", self.condition]
        stage = 0
        for i, raw in enumerate(self.steps):
            step = StepSpec(**raw)
            if i:
                words.append("then" if step.stage != stage else "and")
            stage = step.stage
            words.append(step.spec)
        return " ".join(w for w in words if w)


class ApiToken(models.Model):
    """A bearer token. Only a SHA-256 of the secret is stored; the prefix lets people tell tokens apart.

    kind=worker: a machine identity for agent workers, scoped to agents (empty = any agent); it can
    never issue an intervention. kind=operator: a personal token acting as its user (scripts).
    """

    WORKER, OPERATOR = "worker", "operator"
    PREFIX_LEN = 8

    kind = models.CharField(max_length=10, choices=[(WORKER, WORKER), (OPERATOR, OPERATOR)])
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, db_index=True)
    token_hash = models.CharField(max_length=64, unique=True)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE
    )
    agents = models.JSONField(default=list, blank=True, help_text="agent names; empty = any agent")
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # Owning team (runs.models.teams): NULL = the default team. Expand-only: no backfill.
    team = models.ForeignKey(
        "runs.Team", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=models.Q(kind__in=["worker", "operator"]), name="apitoken_kind_valid"
            ),
            models.CheckConstraint(
                condition=models.Q(kind="worker") | models.Q(user__isnull=False),
                name="operator_token_has_user",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind}:{self.name} ({self.prefix}…)"

    @staticmethod
    def hash_secret(secret: str) -> str:
        return hashlib.sha256(secret.encode()).hexdigest()

    @classmethod
    def issue(
        cls, *, kind: str, name: str, user=None, agents: list[str] | None = None
    ) -> tuple[ApiToken, str]:
        """Create a token and return it with the plaintext secret, which is never stored."""
        tag = "cpw" if kind == cls.WORKER else "cpo"
        secret = f"{tag}_{secrets.token_urlsafe(32)}"
        token = cls.objects.create(
            kind=kind,
            name=name,
            user=user,
            agents=agents or [],
            prefix=secret[: cls.PREFIX_LEN],
            token_hash=cls.hash_secret(secret),
        )
        return token, secret

    def may_act_for(self, agent_name: str) -> bool:
        return not self.agents or agent_name in self.agents
