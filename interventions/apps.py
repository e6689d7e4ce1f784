from django.apps import AppConfig


class InterventionsConfig(AppConfig):
    name = "interventions"
    verbose_name = "Interventions"
