from django.contrib import admin

from audit.models import AuditEvent


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    """Audit review, read-only: the database refuses edits anyway (append-only trigger)."""

    list_display = [
        "seq",
        "created_at",
        "actor",
        "role",
        "action",
        "object_type",
        "object_id",
        "outcome",
        "reason",
    ]
    list_filter = ["outcome", "action", "actor_kind", "component"]
    search_fields = ["actor", "object_id", "reason", "run_id"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


from audit.access import admin as access_admin  # noqa: E402,F401  (audited User and Group pages)
