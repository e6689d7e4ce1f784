"""DEBUG is off unless asked for and refused in production; no error page shows a secret.

Before: DEBUG defaulted to on outside production, and any request that made a view fail (a viewer
could trigger several) got Django's debug page, whose settings dump printed DATABASE_URL, REDIS_URL,
CELERY_BROKER_URL and the channel layer's hosts with their passwords (Django hides settings named
like PASS or KEY, not passwords inside URLs).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.http import HttpResponse
from django.test import Client, override_settings
from django.urls import path

from tests.live import ROOT

SECRET = "hunter2-s3cret"
LEAKY = {
    "DATABASE_URL": f"postgresql://cp:{SECRET}@db.internal:5432/cp",
    "REDIS_URL": f"redis://:{SECRET}@redis.internal:6379/0",
    "CELERY_BROKER_URL": f"redis://:{SECRET}@redis.internal:6379/0",
    "CHANNEL_LAYERS": {
        "default": {
            "BACKEND": "channels.layers.InMemoryChannelLayer",
            "CONFIG": {"hosts": [f"redis://:{SECRET}@redis.internal:6379/0"]},
        }
    },
}


def boom(request):
    database_url = LEAKY["DATABASE_URL"]  # noqa: F841  (a local the debug page would show)
    raise RuntimeError("a view failed")


def fine(request):
    return HttpResponse("ok")


urlpatterns = [path("boom/", boom), path("fine/", fine)]


def _settings_value(env: dict[str, str], expr: str) -> subprocess.CompletedProcess:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DEBUG", "CONTROLPLANE_PRODUCTION", "DB_SYNCHRONOUS_COMMIT")
    }
    code = f"import django; django.setup(); from django.conf import settings; print({expr})"
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=clean | {"DJANGO_SETTINGS_MODULE": "controlplane.settings"} | env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_debug_is_off_unless_explicitly_turned_on():
    assert _settings_value({}, "settings.DEBUG").stdout.strip() == "False"
    assert _settings_value({"DEBUG": "1"}, "settings.DEBUG").stdout.strip() == "True"


def test_production_refuses_debug():
    production = {
        "CONTROLPLANE_PRODUCTION": "1",
        "SECRET_KEY": "x" * 50,
        "ALLOWED_HOSTS": "cp.example",
    }
    ok = _settings_value(production, "settings.DEBUG")
    assert ok.returncode == 0 and ok.stdout.strip() == "False", ok.stderr
    refused = _settings_value(production | {"DEBUG": "1"}, "settings.DEBUG")
    assert refused.returncode != 0
    assert "DEBUG=1 is refused when CONTROLPLANE_PRODUCTION=1" in refused.stderr
    # the suite's cheap commits (make test) are never a production setting
    lax = _settings_value(production | {"DB_SYNCHRONOUS_COMMIT": "off"}, "settings.DEBUG")
    assert lax.returncode != 0 and "DB_SYNCHRONOUS_COMMIT must stay on" in lax.stderr


def _get_500(client: Client) -> str:
    client.raise_request_exception = False
    response = client.get("/boom/")
    assert response.status_code == 500
    return response.content.decode()


@pytest.mark.django_db
@override_settings(ROOT_URLCONF=__name__, **LEAKY)
def test_a_failing_view_shows_the_plain_500_page(cast):
    viewer = Client()
    viewer.force_login(cast["vera"][0])
    body = _get_500(viewer)
    assert SECRET not in body and "Traceback" not in body and "DATABASE_URL" not in body


@pytest.mark.django_db
@override_settings(ROOT_URLCONF=__name__, DEBUG=True, **LEAKY)
def test_even_with_debug_on_the_error_page_scrubs_passwords_from_urls(cast):
    viewer = Client()
    viewer.force_login(cast["vera"][0])
    body = _get_500(viewer)
    assert "DATABASE_URL" in body and "redis.internal" in body  # the debug page it is...
    assert SECRET not in body  # ...without the password, in settings and in the frame's locals


@pytest.mark.django_db
def test_an_unknown_page_is_the_plain_404(cast):
    viewer = Client()
    viewer.force_login(cast["vera"][0])
    response = viewer.get("/no-such-page/")
    assert response.status_code == 404
    body = response.content.decode()
    assert "URLconf" not in body and "DATABASE" not in body
