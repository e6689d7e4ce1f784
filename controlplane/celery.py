import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

from celery.signals import beat_init, worker_init

from controlplane.telemetry import setup_tracing

app = Celery("controlplane")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


# Tracing is set up by the process that runs: the web process imports this module too (to publish),
# and sets up tracing as "controlplane" in asgi.py; setting it up here at import would name every
# process the worker. Tracing is configured once per process (controlplane/telemetry.py).
@worker_init.connect
def _trace_worker(**_kwargs) -> None:
    setup_tracing("controlplane-worker")


@beat_init.connect
def _trace_beat(**_kwargs) -> None:
    setup_tracing("controlplane-beat")
