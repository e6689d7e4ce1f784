"""Celery discovers tasks here. Contract modules define their own jobs (shared_task) next to the
contract they serve; importing them registers the tasks."""

from interventions import jobs  # noqa: F401  (the job sweep)
from interventions.base import _load

_load()
