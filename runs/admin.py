from django.contrib import admin

from core.auth import actor_for_user
from runs.models import (
    Agent,
    ApiToken,
    Approval,
    ApprovalPolicy,
    Attempt,
    AuthorityGrant,
    Checkpoint,
    Effect,
    ExecutionLease,
    HistoryEvent,
    Run,
)
from runs.services.access import delete_token, revoke_token


class ReadOnlyAdmin(admin.ModelAdmin):
    """Run state changes only through services (so they are audited); the admin shows it."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class ApprovalPolicyInline(admin.TabularInline):
    """Shown, never edited here: policies change through runs.services.agents (audited)."""

    model = ApprovalPolicy
    fields = readonly_fields = ("tool", "action", "condition", "approver_role", "created_by")
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Agent)
class AgentAdmin(ReadOnlyAdmin):
    """Shown, never edited here: agents change through ``manage.py register_agent``
    (runs.services.agents, audited)."""

    list_display = ["name", "allowed_scopes", "approval_policies", "created_at"]
    inlines = [ApprovalPolicyInline]

    @admin.display(description="approval policies")
    def approval_policies(self, obj):
        return "; ".join(p.spec for p in obj.approval_policies.all()) or "—"


@admin.register(ApprovalPolicy)
class ApprovalPolicyAdmin(ReadOnlyAdmin):
    list_display = ["agent", "tool", "action", "condition", "approver_role", "created_by"]
    list_filter = ["agent", "tool"]


@admin.register(ApiToken)
class ApiTokenAdmin(ReadOnlyAdmin):
    """Read-only, with a revoke action and delete (runs.services.access, audited). Tokens are
    issued by create_worker_token / create_api_token, which show the secret once; nothing
    un-revokes one."""

    list_display = [
        "name",
        "kind",
        "prefix",
        "user",
        "agents",
        "created_at",
        "last_used_at",
        "revoked_at",
    ]
    list_filter = ["kind"]
    exclude = ["token_hash"]
    actions = ["revoke"]

    def has_delete_permission(self, request, obj=None):
        # Deleting is final like revoking (and a user's deletion takes their tokens with it).
        return super(ReadOnlyAdmin, self).has_delete_permission(request, obj)

    def delete_model(self, request, obj):
        delete_token(actor=_actor(request), token_id=obj.pk)

    def delete_queryset(self, request, queryset):
        for token in queryset:
            delete_token(actor=_actor(request), token_id=token.pk)

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request, queryset):
        actor, n = _actor(request), 0
        for token in queryset.filter(revoked_at__isnull=True):
            n += revoke_token(actor=actor, token_id=token.pk)
        self.message_user(request, f"revoked {n} token(s)")


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "agent",
        "state",
        "attempt_count",
        "fencing_token",
        "assignee",
        "decision_authority",
        "created_at",
    ]
    list_filter = ["state", "agent"]
    search_fields = ["id", "goal"]


@admin.register(Effect)
class EffectAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "run",
        "step",
        "tool",
        "action",
        "idempotency_key",
        "decision",
        "status",
        "late",
        "stale_lease",
        "declared_at",
    ]
    list_filter = ["status", "decision", "tool"]
    search_fields = ["idempotency_key", "run__id"]


for model in (Attempt, ExecutionLease, AuthorityGrant, Checkpoint, HistoryEvent, Approval):
    admin.site.register(model, ReadOnlyAdmin)


def _actor(request):
    return actor_for_user(request.user, request, component="admin")
