from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "audit"
    verbose_name = "Audit"

    def ready(self) -> None:
        from . import signals  # noqa: F401  (connects the login/logout/lockout receivers)
