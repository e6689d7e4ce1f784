from django.apps import AppConfig


class InterventionsConfig(AppConfig):
    name = "interventions"
    verbose_name = "Interventions"

    def ready(self) -> None:
        # Every contract module declares its contract(s); importing the app's modules here fills the
        # registry (and registers their Celery tasks and outbox job kinds) before any request or task.
        from interventions.plugins import discover

        discover()
