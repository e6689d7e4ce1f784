"""The conformance kit with ``--url``: the seven scenarios against the live control plane (daphne,
Celery worker + beat, PostgreSQL, Redis), an operator's interventions and reconciliation through
the API, real lease expiry and recovery; the CLI writes its Markdown, JSON and HTML evidence."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_the_kit_passes_a_minimal_agent_against_the_live_control_plane(live, tmp_path):
    operator = live["people"]["otto"].http.headers["Authorization"].split()[1]
    env = dict(os.environ, CONTROLPLANE_TOKEN=live["worker_secret"],
               CONTROLPLANE_OPERATOR_TOKEN=operator)  # fmt: skip
    scopes = ["inventory:*", "shipping:*", "payments:charge", "notifications:*"]
    cmd = [sys.executable, "-m", "controlplane_sdk.conformance", "tests.sdk.conformance_agents:sdk",
           "--url", live["url"], "--agent-name", "purchasing", "--out", str(tmp_path),
           *[a for s in scopes for a in ("--scope", s)]]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=280, env=env)
    evidence = json.loads((tmp_path / "conformance.json").read_text())
    failed = [(s["number"], s["error"]) for s in evidence["scenarios"] if s["status"] != "passed"]
    assert not failed, (failed, out.stdout[-3000:], out.stderr[-5000:])
    assert out.returncode == 0 and evidence["control_plane"] == live["url"]
    assert "7 of 7 scenarios passed against http" in (tmp_path / "conformance.html").read_text()
