"""The conformance kit against one minimal agent per way of writing one (the SDK, LangGraph, the
OpenAI Agents SDK, an MCP client behind the MCP gateway), against the demo agents (their own code,
the demo world swapped for the kit's stand-in), and
against an agent that misbehaves, which it must fail; its CLI writes Markdown, JSON and HTML evidence."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controlplane_sdk.conformance import run_kit
from demo_agents import conformance as demo
from tests.sdk import conformance_agents as agents


@pytest.mark.parametrize(
    "build",
    [
        agents.sdk,
        agents.langgraph,
        agents.openai_agents,
        agents.mcp_gateway,
        demo.purchasing,
        demo.lg_purchasing_agent,
        demo.oa_purchasing_agent,
    ],
    ids=["sdk", "langgraph", "oa", "mcp-gateway", "demo-purchasing", "demo-lg", "demo-oa"],
)
def test_a_well_behaved_agent_passes_all_seven(build):
    t0 = time.monotonic()
    evidence = run_kit(build, build.__name__)
    failed = [(s["number"], s["error"]) for s in evidence["scenarios"] if s["status"] != "passed"]
    assert not failed, failed
    assert evidence["passed"] == 7 and time.monotonic() - t0 < 60
    assert all(s["shown"] for s in evidence["scenarios"])
    recovered = "\n".join(evidence["scenarios"][6]["shown"])
    # the killed worker's scenario says so itself: the orphan reconciled, nothing done twice
    assert "is reconciled in the ledger: committed" in recovered
    assert "no effect is left without a known outcome" in recovered
    assert "the ledger holds each call committed once" in recovered
    assert "no effect was done twice" in recovered


def test_an_agent_that_ignores_directives_and_invents_keys_fails():
    evidence = run_kit(agents.reckless, "reckless")
    status = {s["number"]: s["status"] for s in evidence["scenarios"]}
    # The control plane still refuses its calls after a pause or cancel (1, 3 pass); but a new key
    # per attempt means a resumed, retried or recovered run does everything again.
    assert (status[2], status[4], status[7]) == ("failed", "failed", "failed"), status
    errors = {s["number"]: s["error"] for s in evidence["scenarios"]}
    assert "done twice" in errors[2] and "done twice" in errors[4] and "twice" in errors[7]


def test_the_command_writes_markdown_and_json_evidence(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "controlplane_sdk.conformance", "tests.sdk.conformance_agents:sdk",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    evidence = json.loads((tmp_path / "conformance.json").read_text())
    assert evidence["passed"] == 7
    md = (tmp_path / "conformance.md").read_text()
    assert "## 4. Retry an ambiguous timeout: passed" in md and "not shown by this kit" in md
    page = (tmp_path / "conformance.html").read_text()
    assert "7 of 7 scenarios passed" in page and page.count("<h2>") == 7


def test_the_command_loads_the_kit_once_so_an_agent_catching_its_kill_sees_it(tmp_path):
    """``python -m controlplane_sdk.conformance`` runs the package's ``__main__``, which calls the
    kit's ``main``: the kit is not loaded a second time as ``__main__``, so the ``WorkerKilled`` its
    stand-in raises is the class the MCP agent catches (with two, scenario 7 failed)."""
    out = subprocess.run(
        [sys.executable, "-m", "controlplane_sdk.conformance",
         "tests.sdk.conformance_agents:mcp_gateway", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    evidence = json.loads((tmp_path / "conformance.json").read_text())
    failed = [(s["number"], s["error"]) for s in evidence["scenarios"] if s["status"] != "passed"]
    assert out.returncode == 0 and not failed, (failed, out.stdout[-2000:], out.stderr[-3000:])


def test_the_console_script_finds_the_authors_module_in_the_current_directory(tmp_path):
    (tmp_path / "my_agent.py").write_text("from tests.sdk.conformance_agents import sdk as build\n")
    script = Path(sys.executable).with_name("controlplane-conformance")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    out = subprocess.run(
        [str(script), "my_agent:build", "--out", "evidence"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads((tmp_path / "evidence" / "conformance.json").read_text())["passed"] == 7


def test_only_runs_the_scenarios_named(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "controlplane_sdk.conformance", "tests.sdk.conformance_agents:sdk",
         "--only", "7", "--only", "4", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    evidence = json.loads((tmp_path / "conformance.json").read_text())
    assert [s["number"] for s in evidence["scenarios"]] == [4, 7] and evidence["passed"] == 2
