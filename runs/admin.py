from django import forms
from django.contrib import admin
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group, User
from django.core.exceptions import ValidationError

from core.auth import actor_for_user
from core.errors import DomainError
from core.roles import ROLES
from runs.models import (
    Agent,
    ApiToken,
    Approval,
    Attempt,
    AuthorityGrant,
    Checkpoint,
    Effect,
    ExecutionLease,
    HistoryEvent,
    Run,
)
from runs.services.accounts import (
    check_scopes,
    delete_user,
    register_agent,
    revoke_token,
    save_user,
    set_user_roles,
)


class ReadOnlyAdmin(admin.ModelAdmin):
    """Run state changes only through services (so they are audited); the admin shows it."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class AgentForm(forms.ModelForm):
    class Meta:
        model = Agent
        fields = ["name", "description", "allowed_scopes"]

    def clean_allowed_scopes(self):
        scopes = self.cleaned_data["allowed_scopes"] or []
        if not isinstance(scopes, list) or not all(isinstance(s, str) for s in scopes):
            raise ValidationError('a list of scopes, e.g. ["payments:charge", "inventory:*"]')
        try:
            return check_scopes(scopes)
        except DomainError as err:
            raise ValidationError(err.detail)


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    """Saves go through ``register_agent`` (audited). The name is the agent's identity: fixed once
    registered. Agents are never deleted (their runs keep pointing at them)."""

    form = AgentForm
    list_display = ["name", "allowed_scopes", "created_at"]
    fields = ["name", "description", "allowed_scopes", "current_versions", "created_at"]
    readonly_fields = ["current_versions", "created_at"]

    def get_readonly_fields(self, request, obj=None):
        return [*self.readonly_fields, "name"] if obj is not None else self.readonly_fields

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        saved, _ = register_agent(
            actor=_actor(request),
            name=obj.name,
            scopes=obj.allowed_scopes or [],
            description=obj.description,
        )
        obj.pk = saved.pk


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Read-only, with one action: revoke (through ``revoke_token``, audited). Tokens are issued by
    create_worker_token / create_api_token, which show the secret once; nothing un-revokes one."""

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

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request, queryset):
        actor, n = _actor(request), 0
        for token in queryset.filter(revoked_at__isnull=True):
            n += revoke_token(actor=actor, token_id=token.pk)
        self.message_user(request, f"revoked {n} token(s)")


class AuditedUserAdmin(UserAdmin):
    """Django's user admin, with every save, role change and delete going through the accounts
    services (audited). Roles are groups: the groups field is applied by ``set_user_roles``."""

    def save_model(self, request, obj, form, change):
        save_user(actor=_actor(request), user=obj, changed=form.changed_data, created=not change)

    def save_related(self, request, form, formsets, change):
        groups = form.cleaned_data.pop("groups", None)  # not saved by the form: by the service
        super().save_related(request, form, formsets, change)
        if groups is not None:
            others = [g.name for g in groups if g.name not in ROLES]
            if others:
                form.instance.groups.add(*Group.objects.filter(name__in=others))
            set_user_roles(
                actor=_actor(request),
                user=form.instance,
                roles=[g.name for g in groups if g.name in ROLES],
            )

    def delete_model(self, request, obj):
        delete_user(actor=_actor(request), user=obj)

    def delete_queryset(self, request, queryset):
        for user in queryset:
            delete_user(actor=_actor(request), user=user)


class RoleGroupAdmin(GroupAdmin):
    """Roles are a fixed set (core.roles): shown, not edited here."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


def _actor(request):
    return actor_for_user(request.user, request, component="admin")


admin.site.unregister(User)
admin.site.register(User, AuditedUserAdmin)
admin.site.unregister(Group)
admin.site.register(Group, RoleGroupAdmin)


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
