"""Each log record is written once: the dev server's request lines used to appear twice in `make run`
(Django's own "django" console handler, active with DEBUG, plus propagation to our root handler)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EMIT = """
import logging, django
django.setup()
for name in ("django.channels.server", "django.request", "api.runs", "controlplane_sdk"):
    logging.getLogger(name).warning("marker-%s", name)
"""


@pytest.mark.parametrize("debug", ["1", "0"])
def test_each_record_is_written_once(debug):
    env = {
        **os.environ,
        "DEBUG": debug,
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "LOG_LEVEL": "INFO",
    }
    out = subprocess.run(
        [sys.executable, "-c", EMIT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    lines = (out.stdout + out.stderr).splitlines()
    for name in ("django.channels.server", "django.request", "api.runs", "controlplane_sdk"):
        assert sum(f"marker-{name}" in line for line in lines) == 1, (name, lines)
