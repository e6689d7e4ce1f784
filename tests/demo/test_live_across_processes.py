"""`make run` delivers what the Celery worker writes to open pages (issue 18): the real supervisor on the
embedded defaults (SQLite, the SQLite Celery broker, the SQLite live bus; no Redis), the real console,
world, worker, beat and traffic. A run's worker is SIGKILLed; its lease runs out, beat's scan has the
Celery worker orphan the run and recover it, and a WebSocket client on the run page hears each of the
worker's facts within 1 s of the worker's write (measured from the history row's timestamp).

Then the "live" indicator: the server heartbeats every socket; a browser on the run page says "live",
and when the web process stops answering (SIGSTOP: socket open, nothing arrives) it turns red and says
"not live" in words; it turns back once the process runs again (SIGCONT).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import websockets

from tests.demo.embedded import embedded_env, start_demo
from tests.demo.test_supervisor_restarts import _children
from tests.live import free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
PASSWORD = "pw-live-demo"
BUDGET_S = 1.0

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

WORKER = """
import sys, time
from controlplane_sdk import Client
client = Client(sys.argv[1], sys.argv[2])
run = client.create_run("purchasing", "buy 1 of sku-2", input={},
                        authority=[{"scope": "payments:charge", "ttl_s": 3600}])
claim = client.claim(run["id"], "doomed-worker")
print("claimed", run["id"], flush=True)
while True:
    client.heartbeat(claim.lease.id, claim.lease.fencing_token)
    time.sleep(0.5)
"""


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo as `make run` starts it, with no agents of its own (the test brings the worker)."""
    tmp = tmp_path_factory.mktemp("live-demo")
    port = free_port()
    env = embedded_env(
        tmp,
        PORT=str(port),
        WORLD_PORT=str(free_port()),
        DEMO_AGENTS="0",
        DEMO_PASSWORD=PASSWORD,
        LEASE_TTL_S="3",
        RECOVERY_SCAN_INTERVAL_S="1",
    )
    sup, log = start_demo(tmp, env)
    try:
        wait_for(
            "the demo to be up",
            lambda: "celery@" in log.read_text() and " ready." in log.read_text(),
            120,
            logs=(log,),
        )
        base = f"http://127.0.0.1:{port}"
        wait_for("the console", lambda: _answers(base), 60, logs=(log,))
        yield {"base": base, "env": env, "tmp": tmp, "log": log, "sup": sup}
    finally:
        os.killpg(sup.pid, signal.SIGINT)  # Ctrl-C: the supervisor stops its children
        try:
            sup.wait(timeout=40)
        except subprocess.TimeoutExpired:
            os.killpg(sup.pid, signal.SIGKILL)
            sup.wait(timeout=10)


def _answers(base: str) -> bool:
    try:
        return httpx.get(f"{base}/accounts/login/", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _session(base: str, username: str = "otto") -> httpx.Cookies:
    with httpx.Client(base_url=base, timeout=10) as client:
        page = client.get("/accounts/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
        done = client.post(
            "/accounts/login/",
            data={"username": username, "password": PASSWORD, "csrfmiddlewaretoken": token},
            headers={"Referer": f"{base}/accounts/login/"},
        )
        assert done.status_code == 302, done.text[:500]
        return client.cookies


def _state_changes(db: Path, run_id: str) -> dict[str, float]:
    """When each state of the run was written (its history rows' timestamps, epoch seconds)."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT data, created_at FROM runs_historyevent WHERE run_id = ? ORDER BY seq",
            (run_id.replace("-", ""),),
        ).fetchall()
    out: dict[str, float] = {}
    for data, created in rows:
        to = json.loads(data).get("to")
        if to and to not in out:
            out[to] = datetime.fromisoformat(created).replace(tzinfo=UTC).timestamp()
    return out


def _doomed_worker(demo) -> tuple[subprocess.Popen, str]:
    token = (demo["tmp"] / "var" / "demo-worker-token").read_text().strip()
    log = demo["tmp"] / "doomed.log"
    out = log.open("w")
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER, demo["base"], token],
        cwd=ROOT,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    m = wait_for(
        "the worker to claim",
        lambda: re.search(r"claimed (\S+)", log.read_text()),
        30,
        logs=(log,),
    )
    return proc, m.group(1)


def test_facts_the_celery_worker_writes_reach_a_socket_within_a_second(demo):
    proc, run_id = _doomed_worker(demo)
    cookies = _session(demo["base"])
    url = demo["base"].replace("http", "ws") + f"/ws/runs/{run_id}/"
    headers = {
        "Cookie": f"sessionid={cookies['sessionid']}",
        "Origin": demo["base"],
    }
    heard: dict[str, float] = {}
    beats: list[float] = []

    async def listen() -> None:
        async with websockets.connect(url, additional_headers=headers) as ws:
            first = await asyncio.wait_for(ws.recv(), 10)
            assert 'data-state="running"' in first  # the connect's full render
            os.killpg(proc.pid, signal.SIGKILL)  # no release, no goodbye
            deadline = time.monotonic() + 40
            while "recovering" not in heard and time.monotonic() < deadline:
                try:
                    frame = await asyncio.wait_for(ws.recv(), deadline - time.monotonic())
                except TimeoutError:
                    break  # the assertion below says which fact never came
                at = time.time()
                if frame == "<!-- live -->":
                    beats.append(at)
                for state in ("orphaned", "recovering"):
                    if state not in heard and f'data-state="{state}"' in frame:
                        heard[state] = at

    try:
        asyncio.run(listen())
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    written = _state_changes(demo["tmp"] / "var" / "controlplane.sqlite3", run_id)
    assert {"orphaned", "recovering"} <= set(heard), (heard, written)
    latency = {state: round(heard[state] - written[state], 3) for state in heard}
    print(f"worker fact -> socket latency: {latency}")
    # Both facts are the Celery worker's (the scan's orphaning, the recovery job), not the web's.
    assert all(0 <= s < BUDGET_S for s in latency.values()), latency
    assert beats, "heartbeats kept coming while the run was quiet"


def test_the_live_indicator_turns_red_when_the_server_stops_answering_and_back(demo):
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is absent: apt-get install -y chromium")
    from playwright.sync_api import expect, sync_playwright

    from tests.e2e.test_console_browser import CHROMIUM_ARGS

    web = _children(demo["sup"].pid)["web"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.goto(f"{demo['base']}/")
        page.fill("#id_username", "otto")
        page.fill("#id_password", PASSWORD)
        page.click("button[type=submit]")
        status = page.locator("#live-status")
        expect(status).to_have_text("live", timeout=15_000)
        expect(status).to_have_attribute("data-live", "yes")
        time.sleep(5)  # several heartbeats later it still is (they arrive, it stays green)
        expect(status).to_have_attribute("data-live", "yes")
        os.kill(web, signal.SIGSTOP)  # the socket stays open; nothing more arrives
        try:
            stopped = time.monotonic()
            expect(status).to_have_attribute("data-live", "no", timeout=12_000)
            took = time.monotonic() - stopped
            expect(status).to_contain_text("not live")
            expect(page.locator("#run-live.ws-stale")).to_have_count(1)
            color = page.evaluate("getComputedStyle(document.querySelector('#live-status')).color")
        finally:
            os.kill(web, signal.SIGCONT)
        print(f"indicator red {took:.1f} s after the server stopped; colour {color}")
        expect(status).to_have_attribute("data-live", "yes", timeout=15_000)
        expect(status).to_have_text("live")
        browser.close()
    assert color not in ("rgb(107, 116, 128)",)  # not the muted grey of "idle"
