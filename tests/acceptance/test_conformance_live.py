"""The conformance kit with ``--url``: the seven scenarios against the live control plane (daphne,
Celery worker + beat, PostgreSQL, Redis), an operator's interventions and reconciliation through
the API, real lease expiry and recovery; the CLI writes its Markdown, JSON and HTML evidence.

One minimal agent per way of writing one (the SDK, LangGraph, the OpenAI Agents SDK, an MCP client
behind the MCP gateway), each run by ``python -m controlplane_sdk.conformance`` as an author would,
all four at once against the one control plane: most of a kit's time is waiting for a lease to
expire, and the four wait together."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

#: the agent registered on the control plane -> the kit's builder (tests/sdk/conformance_agents.py)
AGENTS = {
    "kit-sdk": "sdk_offworld",
    "kit-langgraph": "langgraph_offworld",
    "kit-openai-agents": "openai_agents_offworld",
    "kit-mcp-gateway": "mcp_gateway_offworld",
}
SCOPES = [f"kit.{tool}:*" for tool in ("inventory", "shipping", "payments", "notifications")]


def test_the_kit_passes_one_minimal_agent_per_adapter_against_the_live_control_plane(
    live, tmp_path
):
    from runs.models import Agent, ApiToken

    for name in AGENTS:
        Agent.objects.create(name=name, allowed_scopes=SCOPES, description="conformance kit")
    _, worker = ApiToken.issue(kind=ApiToken.WORKER, name="kit-worker", agents=list(AGENTS))
    operator = live["people"]["otto"].http.headers["Authorization"].split()[1]
    env = dict(os.environ, CONTROLPLANE_TOKEN=worker, CONTROLPLANE_OPERATOR_TOKEN=operator,
               OPENAI_AGENTS_DISABLE_TRACING="1")  # fmt: skip
    t0, kits = time.monotonic(), {}
    for name, builder in AGENTS.items():
        out = tmp_path / name
        out.mkdir()
        cmd = [sys.executable, "-m", "controlplane_sdk.conformance",
               f"tests.sdk.conformance_agents:{builder}",
               "--url", live["url"], "--agent-name", name, "--out", str(out),
               *[a for s in SCOPES for a in ("--scope", s)]]  # fmt: skip
        log = (out / "kit.log").open("w")
        kits[name] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), out)
    for proc, _ in kits.values():
        try:
            proc.wait(timeout=max(1.0, 270 - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            proc.kill()  # a kit this test started, by its own handle
            proc.wait()
    took = time.monotonic() - t0
    problems = {}
    for name, (proc, out) in kits.items():
        log = (out / "kit.log").read_text()
        if not (out / "conformance.json").exists():
            problems[name] = ("no evidence", proc.returncode, log[-4000:])
            continue
        evidence = json.loads((out / "conformance.json").read_text())
        failed = [
            (s["number"], s["error"]) for s in evidence["scenarios"] if s["status"] != "passed"
        ]
        if failed or proc.returncode != 0:
            problems[name] = (failed, proc.returncode, log[-4000:])
    assert not problems, (f"{took:.0f}s", problems)

    for name, (_, out) in kits.items():
        evidence = json.loads((out / "conformance.json").read_text())
        assert evidence["control_plane"] == live["url"]
        assert "7 of 7 scenarios passed against http" in (out / "conformance.html").read_text()
        recovered = "\n".join(evidence["scenarios"][6]["shown"])
        # the killed worker's scenario says, from the ledger and the tools' record, that the
        # orphaned effect was reconciled and nothing was done twice
        assert "is reconciled in the ledger: committed" in recovered, (name, recovered)
        assert "no effect was done twice" in recovered, (name, recovered)
        assert "no effect is left without a known outcome" in recovered, (name, recovered)
    print(f"four conformance kits against one live control plane: {took:.0f}s")
