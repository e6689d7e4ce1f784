from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    name = "notifications"
    verbose_name = "Notifications"

    def ready(self) -> None:
        # The outbox job kinds, the admin-only permission row and the approval-request hook are
        # registered before any request or task runs.
        from core.roles import ADMIN, declare_permission
        from notifications import jobs
        from runs.services import records

        declare_permission("manage_channels", frozenset({ADMIN}))
        if jobs.on_approval_requested not in records.APPROVAL_REQUESTED:
            records.APPROVAL_REQUESTED.append(jobs.on_approval_requested)
