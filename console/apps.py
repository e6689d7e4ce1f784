from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    """The operator console: its pages' templates live in console/templates/console/, named by page."""

    name = "console"
    verbose_name = "Operator console"
