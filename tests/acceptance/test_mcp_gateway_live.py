"""The MCP gateway as a process, end to end: an unmodified ``mcp.Client`` speaks streamable HTTP to
the gateway, which governs its calls to a real MCP tool server process against the live control
plane (daphne, Celery worker + beat, PostgreSQL, Redis). The run survives an operator's pause and
resume (the refused call is audited, the client sees a clear tool error, the gateway claims the run
again) and the gateway process being killed (another one takes the run over after recovery); a
retried call is a replay with the tool's structured result; the world sees each call once."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import httpx
import pytest
from mcp import Client as McpClient

from tests.acceptance.test_framework_adapters import AUTHORITY, wait_job
from tests.acceptance.test_run_control import wait_state
from tests.live import free_port, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def up(url: str) -> bool:
    try:
        httpx.get(url, timeout=1)  # any answer: the port serves HTTP
        return True
    except httpx.HTTPError:
        return False


def start_gateway(live, rid: str, tools_url: str, name: str) -> str:
    port = free_port()
    env = dict(os.environ, CONTROLPLANE_TOKEN=live["worker_secret"], PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "controlplane_sdk.adapters.mcp_serve", "--url", live["url"],
           "--run", rid, "--worker", name, "--upstream", f"payments={tools_url}",
           "--http", str(port), "--claim-wait", "90", "--finish-on-exit"]  # fmt: skip
    _, log = live["procs"].start(name, cmd, env)
    wait_for(f"{name} to listen", lambda: "listening on" in log.read_text(), 120, logs=(log,))
    url = f"http://127.0.0.1:{port}/mcp"
    wait_for(f"{name} to serve", lambda: up(url), 20, logs=(log,))
    return url


def calls(url: str, *batch: tuple[dict, dict | None]):
    async def go():
        async with McpClient(url) as agent:
            return [
                await agent.call_tool("payments__charge", args, meta=meta) for args, meta in batch
            ]

    return asyncio.run(go())


def test_the_gateway_carries_a_run_through_pause_resume_and_its_own_death(live, tmp_path):
    worker, otto = live["worker"], live["people"]["otto"]
    record = tmp_path / "charges.jsonl"
    tools_port = free_port()
    _, tools_log = live["procs"].start(
        "mcp-tools",
        [sys.executable, "-m", "tests.acceptance.mcp_tools", "--port", str(tools_port),
         "--record", str(record)],
        dict(os.environ, PYTHONUNBUFFERED="1"),
    )  # fmt: skip
    tools_url = f"http://127.0.0.1:{tools_port}/mcp"
    wait_for("the tool server", lambda: up(tools_url), 30, logs=(tools_log,))
    resp = worker.post(
        "/runs", {"agent": "oa-purchasing", "goal": "charge through MCP", "input": {},
                  "authority": AUTHORITY},
    )  # fmt: skip
    assert resp.status_code == 201, resp.text
    rid = resp.json()["id"]
    gw = start_gateway(live, rid, tools_url, "mcp-gateway-1")

    # Two identical calls are two charges; a call the client retries under its own key is one.
    first, second, keyed, retried = calls(
        gw, ({"amount": 5}, None), ({"amount": 5}, None),
        ({"amount": 7}, {"controlplane/key": "call_7"}), ({"amount": 7}, {"controlplane/key": "call_7"}),
    )  # fmt: skip
    assert not any(r.is_error for r in (first, second, keyed, retried))
    assert first.structured_content["id"] != second.structured_content["id"]
    assert retried.structured_content == keyed.structured_content  # the replay: what the tool said
    assert [json.loads(x)["amount"] for x in record.read_text().splitlines()] == [5, 5, 7]

    # Pause: the gateway hands the lease back (the run reaches paused), a call is refused with
    # the operator's reason, never reaches the tool, and the refusal is audited.
    assert otto.intervene(rid, "pause", "hold every payment").status_code == 202
    wait_state(worker, rid, {"paused"}, 30)
    (held,) = calls(gw, ({"amount": 9}, None))
    assert held.is_error, held
    text = held.content[0].text
    assert text.startswith("The run is paused (hold every payment)."), text
    assert "payments__charge was not called" in text
    denied = otto.get("/audit", run_id=rid, action="effect.declare", outcome="denied").json()
    assert denied["events"], "the refused call left no audit event"
    assert len(record.read_text().splitlines()) == 3

    # Resume: the gateway claims the run again (a second attempt) and calls go through.
    resumed = otto.intervene(rid, "resume", "payments may continue")
    assert resumed.status_code == 202, resumed.text
    assert wait_job(otto, resumed.json()["id"])["status"] == "completed"
    run = wait_state(worker, rid, {"running"}, 30)
    assert len(run["attempts"]) == 2
    (after,) = calls(gw, ({"amount": 11}, None))
    assert not after.is_error, after

    # The gateway dies (SIGKILL, no goodbye): a new gateway takes the run over once the lease
    # expired and recovery queued it again; the client reconnects and carries on.
    live["procs"].sigkill("mcp-gateway-1")
    gw2 = start_gateway(live, rid, tools_url, "mcp-gateway-2")
    (later,) = calls(gw2, ({"amount": 13}, None))
    assert not later.is_error, later
    run = worker.run(rid)
    assert len(run["attempts"]) == 3 and run["state"] == "running"

    # Stopping the gateway ends the attempt: the run succeeds; each charge reached the tool once.
    live["procs"].stop({"mcp-gateway-2"})
    final = wait_state(worker, rid, {"succeeded", "failed"}, 30)
    assert final["state"] == "succeeded", final
    charges = [json.loads(x) for x in record.read_text().splitlines()]
    assert [c["amount"] for c in charges] == [5, 5, 7, 11, 13]
    # the tool server saw each call's idempotency key: the keys of the committed effects
    committed_keys = {
        e["idempotency_key"] for e in worker.effects(rid) if e["status"] == "committed"
    }
    assert {c["key"] for c in charges} == committed_keys
    committed = [e for e in worker.effects(rid) if e["status"] == "committed"]
    assert len(committed) == 5
