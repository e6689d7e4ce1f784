from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "audit"
    verbose_name = "Audit"

    def ready(self) -> None:
        from .models import AuditEvent
        from .registry import register_append_only

        register_append_only(AuditEvent)
        from .access import receivers  # noqa: F401  (connects the login/logout/lockout receivers)
