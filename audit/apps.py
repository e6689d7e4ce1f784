from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "audit"
    verbose_name = "Audit"

    def ready(self) -> None:
        from .integrity import register_append_only
        from .models import AuditEvent

        register_append_only(AuditEvent)
        from . import signals  # noqa: F401  (connects the login/logout/lockout receivers)
