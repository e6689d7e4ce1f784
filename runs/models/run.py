"""Run, Attempt, ExecutionLease and Approval: who executes what, under which lease."""

from __future__ import annotations

import uuid
from typing import Any

import pgtrigger
from django.conf import settings
from django.db import models
from django.utils import timezone

from runs.states import State, state_edges

STATE_CHOICES = [(s.value, s.value) for s in State]
# The body of the statement-level tally triggers: the inserted or deleted runs, counted per agent
# and state ({rows} is the statement's transition table).
TALLY_SQL = (
    "INSERT INTO runs_runtally (agent_id, state, n)"
    " SELECT agent_id, state, {sign}COUNT(*) FROM {rows} GROUP BY agent_id, state;"
    " RETURN NULL;"
)


class Run(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # agent, state, created_at: no single-column index of their own. Each leads a keyset index below,
    # which answers the same lookups, and every run UPDATE that moves ``updated_at`` (every history
    # append) writes an entry into each of the run's indexes.
    agent = models.ForeignKey(
        "runs.Agent", on_delete=models.PROTECT, related_name="runs", db_index=False
    )
    goal = models.TextField()
    input = models.JSONField(default=dict, blank=True)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="children"
    )
    root = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    versions = models.JSONField(default=dict, blank=True)  # code, model, tools{}, config_hash
    state = models.CharField(max_length=20, choices=STATE_CHOICES, default=State.QUEUED)
    state_changed_at = models.DateTimeField(default=timezone.now)
    # Monotonic per run: every claim increments it; a write carrying an older token is refused.
    fencing_token = models.BigIntegerField(default=0)
    attempt_count = models.PositiveIntegerField(default=0)
    current_attempt = models.ForeignKey(
        "runs.Attempt", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The checkpoint the next attempt starts from (set by pause, retry, recovery); null = latest.
    resume_checkpoint = models.ForeignKey(
        "runs.Checkpoint", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Three separate ownership facets (the execution lease is the third, in ExecutionLease).
    assignee = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="assigned_runs",
    )
    decision_authority = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="decided_runs",
    )
    retry_policy = models.JSONField(default=dict, blank=True)
    # The agent's team when the run was created (a child: its parent's); never changes after. No
    # index of its own (see above: every history append writes each index); lists filter it.
    team = models.ForeignKey(
        "runs.Team",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        db_index=False,
    )
    claimable_after = models.DateTimeField(null=True, blank=True)  # retry backoff
    execution_pin = models.CharField(
        max_length=150, blank=True
    )  # transfer: only this worker may claim next
    deadline = models.DateTimeField(null=True, blank=True)
    created_by = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    history_head = models.CharField(max_length=64, blank=True)  # hash of the latest history event
    history_seq = models.PositiveIntegerField(default=0)
    checkpoint_seq = models.PositiveIntegerField(default=0)

    # Not a column: set by runs.services.lifecycle.create_run on the instance it returns (the grants it wrote
    # with the run), so runs.selectors.run_detail need not read back what was just written.
    new_grants: list[Any] | None = None

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(state__in=[s.value for s in State]), name="run_state_valid"
            ),
            models.CheckConstraint(
                condition=models.Q(fencing_token__gte=0), name="run_fencing_token_nonnegative"
            ),
        ]
        # Keyset pages of the run list (runs/search.py): each sort key ends with the id.
        indexes = [
            models.Index(fields=["created_at", "id"], name="run_created_keyset"),
            models.Index(fields=["updated_at", "id"], name="run_updated_keyset"),
            models.Index(fields=["state", "created_at", "id"], name="run_state_keyset"),
            models.Index(fields=["agent", "created_at", "id"], name="run_agent_keyset"),
        ]
        # The state machine in the database: an UPDATE of ``state`` along no edge of runs/states.py
        # is refused, whoever writes it. Generated from the table; a change to the table shows up as
        # a pending migration (tests/runs/test_state_trigger.py checks there is none). Its WHEN clause
        # keeps PostgreSQL from calling it on the UPDATEs that leave ``state`` alone (every history
        # append moves the run's head): those were always allowed.
        triggers = [
            pgtrigger.FSM(
                name="run_state_transitions",
                field="state",
                transitions=state_edges(),
                condition=pgtrigger.AnyChange("state"),
            ),
            # Runs per (agent, state), kept by the database in RunTally (below): a run inserted,
            # deleted, or moved to another state or agent writes its +1 / -1 in the same
            # transaction. Inserts and deletes per statement (a COPY of 100,000 runs writes one row
            # per agent and state), updates per row and only when the state or agent changed.
            pgtrigger.Trigger(
                name="run_tally_insert",
                level=pgtrigger.Statement,
                when=pgtrigger.After,
                operation=pgtrigger.Insert,
                referencing=pgtrigger.Referencing(new="new_runs"),
                func=TALLY_SQL.format(rows="new_runs", sign=""),
            ),
            pgtrigger.Trigger(
                name="run_tally_delete",
                level=pgtrigger.Statement,
                when=pgtrigger.After,
                operation=pgtrigger.Delete,
                referencing=pgtrigger.Referencing(old="old_runs"),
                func=TALLY_SQL.format(rows="old_runs", sign="-"),
            ),
            pgtrigger.Trigger(
                name="run_tally_update",
                level=pgtrigger.Row,
                when=pgtrigger.After,
                operation=pgtrigger.Update,
                condition=pgtrigger.Q(old__state__df=pgtrigger.F("new__state"))
                | pgtrigger.Q(old__agent_id__df=pgtrigger.F("new__agent_id")),
                func=(
                    "INSERT INTO runs_runtally (agent_id, state, n) VALUES"
                    " (OLD.agent_id, OLD.state, -1), (NEW.agent_id, NEW.state, 1); RETURN NULL;"
                ),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.agent_id}:{str(self.id)[:8]} ({self.state})"


class RunTally(models.Model):
    """Runs per agent and state, as signed counts the database writes (the ``run_tally_*`` triggers
    on Run): the run list's counts per state are a sum over this small table instead of a count
    of every run, and exact, since each count commits with the change that made it. Rows pile up
    (one or two per state change) until ``runs.services.tally.compact_tally`` folds them into one
    per (agent, state). PostgreSQL only: on SQLite, which installs no triggers, it stays empty and
    the list counts the runs (runs/search.py ``state_counts``)."""

    agent_id = models.BigIntegerField()
    state = models.CharField(max_length=20)
    n = models.BigIntegerField()

    def __str__(self) -> str:
        return f"{self.agent_id}:{self.state} {self.n:+d}"


class Attempt(models.Model):
    RUNNING, SUCCEEDED, FAILED, ABANDONED, STOPPED = (
        "running",
        "succeeded",
        "failed",
        "abandoned",
        "stopped",
    )
    OUTCOMES = [RUNNING, SUCCEEDED, FAILED, ABANDONED, STOPPED]

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="attempts")
    number = models.PositiveIntegerField()
    worker = models.CharField(max_length=150)
    worker_versions = models.JSONField(default=dict, blank=True)
    started_from = models.ForeignKey(
        "runs.Checkpoint", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    started_at = models.DateTimeField(default=timezone.now)
    ended_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=12, default=RUNNING)
    failure_class = models.CharField(max_length=100, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["run", "number"]
        constraints = [
            models.UniqueConstraint(fields=["run", "number"], name="attempt_number_unique_per_run"),
            models.CheckConstraint(
                condition=models.Q(
                    outcome__in=["running", "succeeded", "failed", "abandoned", "stopped"]
                ),
                name="attempt_outcome_valid",
            ),
        ]


class ExecutionLease(models.Model):
    ACTIVE, RELEASED, EXPIRED = "active", "released", "expired"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="leases")
    attempt = models.ForeignKey(Attempt, on_delete=models.PROTECT, related_name="leases")
    worker = models.CharField(max_length=150)
    fencing_token = models.BigIntegerField()
    ttl_s = models.PositiveIntegerField()
    granted_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    heartbeats = models.PositiveIntegerField(default=0)
    status = models.CharField(max_length=10, default=ACTIVE)
    ended_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.CharField(max_length=100, blank=True)

    class Meta:
        constraints = [
            # At most one live lease per run, enforced by the database.
            models.UniqueConstraint(
                fields=["run"], condition=models.Q(status="active"), name="one_active_lease_per_run"
            ),
            models.UniqueConstraint(
                fields=["run", "fencing_token"], name="lease_fencing_token_unique"
            ),
            models.CheckConstraint(
                condition=models.Q(status__in=["active", "released", "expired"]),
                name="lease_status_valid",
            ),
        ]
        # Lease expiries, counted by the database in LedgerTally (runs/models/ledger.py) as each
        # lease ends expired: a counter for /metrics that costs a few rows, not a count of leases.
        triggers = [
            pgtrigger.Trigger(
                name="lease_expiry_tally",
                level=pgtrigger.Row,
                when=pgtrigger.After,
                operation=pgtrigger.Update,
                condition=pgtrigger.Q(old__status__df=pgtrigger.F("new__status"))
                & pgtrigger.Q(new__status="expired"),
                func=(
                    "INSERT INTO runs_ledgertally (series, key, n)"
                    " VALUES ('lease_expiries', '', 1); RETURN NULL;"
                ),
            ),
        ]

    def is_live(self, now=None) -> bool:
        return self.status == self.ACTIVE and self.expires_at > (now or timezone.now())


class Approval(models.Model):
    PENDING, APPROVED, REJECTED, TIMED_OUT = "pending", "approved", "rejected", "timed_out"
    # The run moved on (cancelled, retried, recovered, a new attempt) before anyone decided.
    SUPERSEDED = "superseded"
    STATUSES = [PENDING, APPROVED, REJECTED, TIMED_OUT, SUPERSEDED]

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="approvals")
    attempt = models.ForeignKey(Attempt, on_delete=models.PROTECT, related_name="approvals")
    requested_by = models.CharField(max_length=150)
    tool = models.CharField(max_length=100)
    action = models.CharField(max_length=100)
    args = models.JSONField(default=dict, blank=True)
    # Binds the decision to the exact action: sha256 of tool, action, args, run and attempt.
    digest = models.CharField(max_length=64)
    reason = models.TextField(blank=True)
    required_role = models.CharField(max_length=50, default="approver")
    # The agent's policy that required this approval (its role wins over the worker's), if any.
    policy = models.ForeignKey(
        "runs.ApprovalPolicy", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    status = models.CharField(max_length=10, default=PENDING)
    deadline = models.DateTimeField(null=True, blank=True)
    requested_at = models.DateTimeField(default=timezone.now)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_reason = models.TextField(blank=True)
    shown = models.JSONField(default=dict, blank=True)  # what the approver was shown
    consumed_by = models.ForeignKey(
        "runs.Effect", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Multi-party: the policy's steps that apply to these args, with each step's opened_at and
    # deadline once its stage opens (runs.services.approvals.plan_steps). Empty: one approver.
    steps = models.JSONField(default=list, db_default=[], blank=True)
    stage = models.PositiveSmallIntegerField(default=0, db_default=0)  # the stage now open
    # The worker's deadline_s for the whole request: every stage's deadline stays within it.
    overall_deadline = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-requested_at"]
        # The "needs attention" view reads the runs with a pending approval (runs/search.py).
        indexes = [
            models.Index(
                fields=["run"], condition=models.Q(status="pending"), name="approval_pending_run"
            )
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(
                    status__in=["pending", "approved", "rejected", "timed_out", "superseded"]
                ),
                name="approval_status_valid",
            ),
        ]


class ApprovalDecision(models.Model):
    """One person's decision on a multi-party approval, counted in one step. A person counts once per
    approval (unique), and the decision names the digest it was made on."""

    APPROVED, REJECTED = "approved", "rejected"

    approval = models.ForeignKey(Approval, on_delete=models.PROTECT, related_name="decisions")
    step = models.PositiveSmallIntegerField()  # index into approval.steps
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT)
    decided_by_label = models.CharField(max_length=150)
    role = models.CharField(max_length=50)
    decision = models.CharField(max_length=10)
    digest = models.CharField(max_length=64)
    reason = models.TextField(blank=True)
    decided_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["decided_at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["approval", "decided_by"], name="approval_decision_one_per_person"
            ),
            models.CheckConstraint(
                condition=models.Q(decision__in=["approved", "rejected"]),
                name="approval_decision_valid",
            ),
        ]
