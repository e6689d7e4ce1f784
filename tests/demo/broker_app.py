"""A Celery app for tests/demo/test_embedded_broker.py: the project's embedded broker settings (what
`make run` uses without REDIS_URL), one task that appends its tag to a file, and a fast beat."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("brokertest")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.beat_schedule = {"tick": {"task": "brokertest.record", "schedule": 0.5, "args": ("beat",)}}
app.conf.beat_schedule_filename = os.path.join(os.environ["BROKER_TEST_DIR"], "beat-schedule")
if os.environ.get("BROKER_TEST_FILESYSTEM"):  # the transport `make run` used before, for contrast
    folder = os.path.join(os.environ["BROKER_TEST_DIR"], "fs-broker")
    os.makedirs(folder, exist_ok=True)
    app.conf.broker_url, app.conf.broker_transport = "filesystem://", None
    app.conf.broker_transport_options = {
        "data_folder_in": folder,
        "data_folder_out": folder,
        # kombu writes its broadcast exchanges here; the default is ./control in the repository
        "control_folder": os.path.join(os.environ["BROKER_TEST_DIR"], "fs-control"),
    }


@app.task(name="brokertest.record")
def record(tag: str) -> None:
    with open(os.environ["BROKER_TEST_LOG"], "a") as f:
        f.write(f"{tag}\n")
