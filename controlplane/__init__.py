"""controlplane: governs state, authority, scheduling and interventions of AI-agent runs."""

from .celery import app as celery_app

__all__ = ["celery_app"]
