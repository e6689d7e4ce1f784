"""The live console under protocol load (issue 10, "Budgets"), driven from the outside like an operator:
real daphne servers (bench/harness.py), protocol worker processes (bench/protocol.py), WebSockets
opened with the session cookie of a real login and the page's own Origin.

Fact-to-screen: while protocol workers drive runs, a probe drives ``pages`` runs of its own through the
same worker API (declare, then outcome committed, one effect at a time) with one run page open on a
socket for each. For every fact it times the fact's own timestamp (the effect's ``declared_at`` /
``outcome_at``, written in the committing transaction; same machine clock) → the moment the fragment
showing it (the new row ``effect-<id>``; the row with class ``st-row-committed``) arrives on that run's
socket; also API response → fragment (the operator's view of "the call returned").

Throughput: the protocol's effects/s with 0 and with ``pages`` open run-list sockets, interleaved
(0, N, 0, N) so machine-load drift hits both; the drop is 1 - mean(N) / mean(0)."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import re
import statistics
import threading
import time
from datetime import datetime
from typing import Any

from bench import harness, protocol

LIVE_USER, LIVE_PASSWORD = "bench-live", "bench-live-password-1"
SOCKETS_PER_SESSION = 5  # the console admits WS_MAX_PER_SESSION (8) sockets per login: log in twice


def ensure_user() -> None:
    """A console viewer with a password (the probe logs in over HTTP like a browser)."""
    from django.contrib.auth.models import Group, User

    user, _ = User.objects.get_or_create(username=LIVE_USER)
    user.set_password(LIVE_PASSWORD)
    user.is_active = True
    user.save()
    user.groups.add(Group.objects.get_or_create(name="viewer")[0])


def login(base: str) -> str:
    """The ``sessionid`` of a real login through /accounts/login/ (CSRF cookie and token included)."""
    import httpx

    with httpx.Client(base_url=base, timeout=30) as client:
        page = client.get("/accounts/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        data = {"username": LIVE_USER, "password": LIVE_PASSWORD}
        if token:
            data["csrfmiddlewaretoken"] = token.group(1)
        resp = client.post(
            "/accounts/login/",
            data=data,
            headers={"X-CSRFToken": client.cookies.get("csrftoken") or "", "Referer": base + "/"},
        )
        session = client.cookies.get("sessionid")
        if resp.status_code not in (200, 302) or not session:
            raise RuntimeError(f"login failed: HTTP {resp.status_code} {resp.text[:300]!r}")
        return session


class Socket:
    """One open console page: every frame with its arrival time; waiters wake on each frame."""

    def __init__(self, url: str, origin: str, session: str):
        self.url, self.origin, self.session = url, origin, session
        self.frames: list[tuple[float, str]] = []
        self.bytes = 0
        self.changed = asyncio.Event()
        self.closed_with: Any = None

    async def open(self) -> None:
        from websockets.asyncio.client import connect

        self.ws = await connect(
            self.url,
            origin=self.origin,  # type: ignore[arg-type]
            additional_headers={"Cookie": f"sessionid={self.session}"},
            max_size=None,
            open_timeout=30,
        )
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for frame in self.ws:
                text = frame if isinstance(frame, str) else frame.decode()
                self.frames.append((time.time(), text))
                self.bytes += len(text)
                self.changed.set()
        except Exception as exc:  # a close code is a finding, not a crash of the benchmark
            self.closed_with = repr(exc)[:200]
        self.closed_with = self.closed_with or getattr(self.ws, "close_code", "closed")
        self.changed.set()

    async def wait_for(self, needle: str, since: int, timeout: float) -> float | None:
        """Arrival time of the first frame from index ``since`` on that contains ``needle``."""
        deadline = time.monotonic() + timeout
        pos = since
        while True:
            while pos < len(self.frames):
                at, text = self.frames[pos]
                if needle in text:
                    return at
                pos += 1
            if self.closed_with is not None:
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), left)
            except TimeoutError:
                return None

    async def close(self) -> None:
        await self.ws.close()
        self.reader.cancel()


def _ws(http: str) -> str:
    return "ws" + http[len("http") :]


async def open_pages(urls: list[str], sessions: list[str], paths: list[str]) -> list[Socket]:
    sockets = []
    for i, path in enumerate(paths):
        base = urls[i % len(urls)]
        sock = Socket(_ws(base) + path, base, sessions[i // SOCKETS_PER_SESSION])
        await sock.open()
        sockets.append(sock)
    # the (re)connect render comes first: wait for it so it is not mistaken for a push
    for sock in sockets:
        await sock.wait_for("", 0, 30)
    return sockets


def _stamp(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


async def probe(
    urls: list[str], token: str, sessions: list[str], pages: int, effects: int
) -> dict[str, Any]:
    """``pages`` probe runs, each with its run page open, ``effects`` effects each (see the module)."""
    import httpx

    api = [f"{u}/api/v1" for u in urls]
    auth = {"Authorization": f"Bearer {token}"}
    from_fact: list[float] = []
    from_response: list[float] = []
    missed: list[str] = []
    async with httpx.AsyncClient(headers=auth, timeout=60) as client:

        async def post(url: str, body: dict) -> dict:
            resp = await client.post(url, json=body)
            if resp.status_code not in (200, 201):
                raise RuntimeError(f"{url} -> {harness.describe_failure(resp)}")
            return resp.json()

        runs = []
        for i in range(pages):
            base = api[i % len(api)]
            run = await post(
                f"{base}/runs",
                {
                    "agent": harness.AGENT,
                    "goal": "console live probe",
                    "input": {"probe": i},
                    "authority": [{"scope": s, "ttl_s": 3600} for s in harness.SCOPES],
                },
            )
            claim = await post(f"{base}/runs/{run['id']}/claim", {"worker": f"probe-{i}"})
            lease = claim["lease"]
            runs.append((base, run["id"], lease["fencing_token"], lease["id"]))
        sockets = await open_pages(urls, sessions, [f"/ws/runs/{r[1]}/" for r in runs])

        async def drive(i: int) -> None:
            base, run_id, fence, lease_id = runs[i]
            sock = sockets[i]
            beat = time.monotonic()
            for n in range(effects):
                if time.monotonic() - beat > protocol.HEARTBEAT_EVERY_S:  # leases last 30 s
                    await post(f"{base}/leases/{lease_id}/heartbeat", {"fencing_token": fence})
                    beat = time.monotonic()
                mark = len(sock.frames)
                effect = await post(
                    f"{base}/runs/{run_id}/effects",
                    {
                        "fencing_token": fence,
                        "step": f"probe-{n}",
                        "tool": "bench",
                        "action": "write",
                        "idempotency_key": f"{run_id}:probe-{n}",
                        "args": {"n": n},
                    },
                )
                answered = time.time()
                at = await observe(sock, f'id="effect-{effect["id"]}"', mark, effect, "declared_at")
                if at is not None:
                    from_response.append(max(0.0, (at - answered) * 1000))
                mark = len(sock.frames)
                outcome = await post(
                    f"{base}/effects/{effect['id']}/outcome",
                    {"fencing_token": fence, "status": "committed", "external_ref": f"p{n}"},
                )
                answered = time.time()
                fact = {**effect, **outcome}
                needle = f'id="effect-{effect["id"]}" class="st-row-committed"'
                at = await observe(sock, needle, mark, fact, "outcome_at")
                if at is not None:
                    from_response.append(max(0.0, (at - answered) * 1000))
                await asyncio.sleep(0.1)
            await post(
                f"{base}/runs/{run_id}/finish", {"fencing_token": fence, "outcome": "succeeded"}
            )

        async def observe(
            sock: Socket, needle: str, mark: int, fact: dict, field: str
        ) -> float | None:
            sent = time.time()
            at = await sock.wait_for(needle, mark, 15)
            if at is None:
                missed.append(f"{field} {fact.get('id')}: {sock.closed_with or 'no fragment'}")
                return None
            start = _stamp(fact.get(field)) or sent
            from_fact.append(max(0.0, (at - start) * 1000))
            return at

        try:
            await asyncio.gather(*(drive(i) for i in range(pages)))
        finally:
            for sock in sockets:
                await sock.close()
    return {
        "open_run_pages": pages,
        "facts": len(from_fact) + len(missed),
        "fact_to_screen_p50_ms": harness.percentile(from_fact, 50),
        "fact_to_screen_p95_ms": harness.percentile(from_fact, 95),
        "fact_to_screen_max_ms": round(max(from_fact), 1) if from_fact else None,
        "response_to_screen_p50_ms": harness.percentile(from_response, 50),
        "response_to_screen_p95_ms": harness.percentile(from_response, 95),
        "missed": len(missed),
        "missed_samples": missed[:5],
    }


class ListPages:
    """``count`` run-list sockets held open on a thread of their own while a protocol phase runs."""

    def __init__(self, urls: list[str], sessions: list[str], count: int):
        self.urls, self.sessions, self.count = urls, sessions, count
        self.ready = threading.Event()
        self.error: str | None = None
        self.result: dict[str, Any] = {}

    def __enter__(self) -> ListPages:
        if self.count:
            self.thread = threading.Thread(target=lambda: asyncio.run(self._hold()), daemon=True)
            self.thread.start()
            if not self.ready.wait(90) or self.error:
                raise RuntimeError(f"list pages did not open: {self.error}")
        return self

    async def _hold(self) -> None:
        try:
            sockets = await open_pages(self.urls, self.sessions, ["/ws/runs/"] * self.count)
        except Exception as exc:
            self.error = repr(exc)
            self.ready.set()
            return
        self.loop, self.stop = asyncio.get_running_loop(), asyncio.Event()
        marks = [len(s.frames) for s in sockets]
        self.ready.set()
        await self.stop.wait()
        self.result = {
            "pushes": sum(len(s.frames) - m for s, m in zip(sockets, marks, strict=True)),
            "push_kb": round(sum(s.bytes for s in sockets) / 1024, 1),
            "closed": [s.closed_with for s in sockets if s.closed_with],
        }
        for sock in sockets:
            await sock.close()

    def __exit__(self, *exc: object) -> None:
        if self.count:
            self.loop.call_soon_threadsafe(self.stop.set)
            self.thread.join(30)


def measure_live(database_url: str, size: dict[str, Any]) -> dict[str, Any]:
    """Fact-to-screen and the throughput phases on ``size["servers"]`` daphne processes."""
    _, redis_url = harness.service_urls("bench.console")
    env = harness.bench_env(database_url, redis_url)
    env["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    secret, prefix = harness.prepare(env, "bench-console-live")
    ensure_user()
    servers = harness.Servers(size["servers"], env)
    ctx = mp.get_context("spawn")
    pages = size["pages"]
    try:
        servers.start()
        servers.wait_ready()
        n_sessions = -(-pages // SOCKETS_PER_SESSION)
        sessions = [login(servers.urls[i % len(servers.urls)]) for i in range(n_sessions)]
        # Fact-to-screen: protocol workers run for the probe's whole length in the background.
        background: dict[str, Any] = {}

        def load() -> None:
            try:
                background.update(
                    protocol.run_phase(
                        ctx,
                        size["workers"],
                        10_000,
                        servers,
                        secret,
                        600,
                        effects_per_run=size["effects_per_run"],
                        budget_s=size["probe_load_s"],
                    )  # fmt: skip
                )
            except Exception as exc:
                background["error"] = repr(exc)[:500]

        loader = threading.Thread(target=load, daemon=True)
        loader.start()
        time.sleep(min(3.0, size["probe_load_s"] / 3))  # the workers are up and running
        started = time.monotonic()
        f2s = asyncio.run(probe(servers.urls, secret, sessions, pages, size["probe_effects"]))
        f2s["probe_s"] = round(time.monotonic() - started, 1)
        loader.join(900)
        f2s["protocol_during_probe"] = {
            k: background.get(k) for k in ("workers", "effects_per_s", "effects", "error")
        }
        # Throughput with 0 and N open list pages, interleaved.
        phases = []
        for open_pages_n in [0, pages] * size["throughput_rounds"]:
            with ListPages(servers.urls, sessions, open_pages_n) as lists:
                phase = protocol.run_phase(
                    ctx, size["workers"], 10_000, servers, secret, 600,
                    effects_per_run=size["effects_per_run"], budget_s=size["phase_s"],
                )  # fmt: skip
            phases.append(
                {
                    "open_list_pages": open_pages_n,
                    "effects_per_s": phase["effects_per_s"],
                    "effects": phase["effects"],
                    "wall_s": phase["wall_s"],
                    "errors": phase["errors"],
                    "servers_cpu_s": phase["cpu"].get("servers_cpu_s"),
                    "machine_busy_pct": phase["cpu"].get("machine_busy_pct"),
                }
                | ({"list_pages": lists.result} if open_pages_n else {})
            )
        # An open dialog on a busy run, in the same run of the servers (bench/console_dialog.py).
        from bench.console_dialog import measure_dialog

        try:
            dialog_cost = measure_dialog(
                servers, secret, phases=size["dialog_phases"], facts=size["dialog_facts"]
            )
        except Exception as exc:  # reported, not fatal: the issue-10 budgets above still stand
            dialog_cost = {"error": repr(exc)[:500]}
    finally:
        servers.stop()
        harness.revoke_token(env, prefix)
    without = [p["effects_per_s"] for p in phases if not p["open_list_pages"]]
    with_pages = [p["effects_per_s"] for p in phases if p["open_list_pages"]]
    base, loaded = statistics.mean(without), statistics.mean(with_pages)
    # What one list push cost the servers: a loaded phase's server CPU beyond what its effects cost
    # in the unloaded phases, per push the list pages received.
    idle = [p for p in phases if not p["open_list_pages"] and p["effects"]]
    per_effect = sum(p["servers_cpu_s"] or 0 for p in idle) / max(
        sum(p["effects"] for p in idle), 1
    )
    extra = [
        ((p["servers_cpu_s"] or 0) - per_effect * p["effects"], p["list_pages"].get("pushes", 0))
        for p in phases
        if p["open_list_pages"]
    ]
    pushes = sum(n for _, n in extra)
    # Sturdier than effects/s on a machine others load too: the servers' CPU per effect with and
    # without the pages, and what the pages added per second of wall time (cores).
    loaded_phases = [p for p in phases if p["open_list_pages"] and p["effects"]]
    loaded_per_effect = sum(p["servers_cpu_s"] or 0 for p in loaded_phases) / max(
        sum(p["effects"] for p in loaded_phases), 1
    )
    pages_cores = sum(c for c, _ in extra) / max(sum(p["wall_s"] for p in loaded_phases), 1e-9)
    return {
        "dialog_cost": dialog_cost,
        "fact_to_screen": f2s,
        "throughput": {
            "workers": size["workers"],
            "servers": size["servers"],
            "phases": phases,
            "effects_per_s_without_pages": round(base, 1),
            "effects_per_s_with_pages": round(loaded, 1),
            "drop_pct": round(100 * (1 - loaded / base), 1) if base else None,
            "server_cpu_ms_per_list_push": round(1000 * sum(c for c, _ in extra) / pushes, 1)
            if pushes
            else None,
            "server_cpu_ms_per_effect_without_pages": round(1000 * per_effect, 1),
            "server_cpu_ms_per_effect_with_pages": round(1000 * loaded_per_effect, 1),
            "list_pages_server_cores": round(pages_cores, 3),
        },
    }
