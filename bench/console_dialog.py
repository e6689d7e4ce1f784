"""What an open dialog costs the server per pushed fact (issue 18: "a dialog open on a busy run costs the
server nothing per pushed fact beyond the patch").

One real Chromium (Debian's, /usr/bin/chromium) logged in as an operator holds a busy run's page open
on the first server; a driver commits facts to that run through the worker API (declare an effect,
then its outcome, one after the other) at about ``rate`` a second. Phases alternate (closed, open,
closed, open ...) so machine-load drift hits both: in an "open" phase the Pause dialog is open on the
page (its preview drawn), in a "closed" phase it is not. Per phase: the facts pushed to the page
(htmx's ``wsAfterMessage`` events, counted in the page), the SQL statements every server sent
(bench/sqlcount.py), the servers' CPU, and the HTTP requests the page itself made. The difference
open - closed per committed fact (each fact is pushed; a push may carry several) is what the dialog
costs; the run page's dialog compares the pushed
header with its preview in the browser (static/console/console.js), so it should be none.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from bench import harness

CHROMIUM = "/usr/bin/chromium"
OPERATOR, OPERATOR_PASSWORD = "bench-operator", "bench-operator-password-1"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync"]


def ensure_operator() -> None:
    from django.contrib.auth.models import Group, User

    user, _ = User.objects.get_or_create(username=OPERATOR)
    user.set_password(OPERATOR_PASSWORD)
    user.is_active = True
    user.save()
    user.groups.add(Group.objects.get_or_create(name="operator")[0])


def _servers_cpu(servers: harness.Servers) -> float:
    return sum(harness.proc_cpu_s(p) for p in harness.with_descendants(servers.pids))


def measure_dialog(
    servers: harness.Servers, secret: str, phases: int = 6, facts: int = 24, rate: float = 4.0
) -> dict[str, Any]:
    """See the module. ``phases`` alternate closed/open; ``facts`` committed per phase."""
    if not os.path.exists(CHROMIUM):
        return {"skipped": f"{CHROMIUM} is absent"}
    import httpx
    from playwright.sync_api import sync_playwright

    ensure_operator()
    base = servers.urls[0]
    api = httpx.Client(
        base_url=f"{base}/api/v1", headers={"Authorization": f"Bearer {secret}"}, timeout=60
    )

    def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
        resp = api.post(path, json=body)
        if resp.status_code not in (200, 201):
            raise RuntimeError(f"{path} -> {harness.describe_failure(resp)}")
        return resp.json()

    run = post(
        "/runs",
        {
            "agent": harness.AGENT,
            "goal": "console dialog cost",
            "input": {},
            "authority": [{"scope": s, "ttl_s": 3600} for s in harness.SCOPES],
        },
    )
    lease = post(f"/runs/{run['id']}/claim", {"worker": "dialog-probe"})["lease"]
    fence, n = lease["fencing_token"], [0]

    def commit_facts(count: int) -> None:
        """``count`` facts at about ``rate`` a second: a declaration, then its outcome."""
        effect = None
        for _ in range(count):
            started = time.monotonic()
            if effect is None:
                n[0] += 1
                effect = post(
                    f"/runs/{run['id']}/effects",
                    {
                        "fencing_token": fence,
                        "step": f"d-{n[0]}",
                        "tool": "bench",
                        "action": "write",
                        "idempotency_key": f"{run['id']}:d-{n[0]}",
                        "args": {"n": n[0]},
                    },
                )
            else:
                post(
                    f"/effects/{effect['id']}/outcome",
                    {"fencing_token": fence, "status": "committed"},
                )
                effect = None
            time.sleep(max(1 / rate - (time.monotonic() - started), 0))
        post(f"/leases/{lease['id']}/heartbeat", {"fencing_token": fence})

    rows: list[dict[str, Any]] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_context(viewport={"width": 1440, "height": 1000}).new_page()
        requests: list[str] = []
        page.on(
            "request",
            lambda r: requests.append(r.url) if r.resource_type not in ("websocket",) else None,
        )
        page.goto(f"{base}/runs/{run['id']}/")
        page.fill("#id_username", OPERATOR)
        page.fill("#id_password", OPERATOR_PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_selector("#run-live.ws-open", timeout=30_000)
        page.evaluate(
            "window.__pushes = 0;"
            " document.addEventListener('htmx:wsAfterMessage', () => { window.__pushes++; });"
        )
        commit_facts(4)  # warm: the page has pushed before the first phase counts
        for i in range(phases):
            dialog = i % 2 == 1
            if dialog:
                page.click("#run-actions button[data-kind=pause]")
                page.wait_for_selector("#dialog form[data-wired] #preview", timeout=30_000)
                page.fill("#d-reason", "holding still while the run moves")
            page.wait_for_load_state("networkidle")
            time.sleep(0.5)
            pushes0, asked0 = page.evaluate("window.__pushes"), len(requests)
            statements0, cpu0 = harness.server_statements(servers.urls), _servers_cpu(servers)
            commit_facts(facts)
            time.sleep(1.0)  # the last pushes land
            pushes = page.evaluate("window.__pushes") - pushes0
            statements = harness.server_statements(servers.urls)
            cpu = _servers_cpu(servers) - cpu0
            asked = requests[asked0:]
            still = dialog and page.evaluate(
                "document.querySelector('#d-reason') &&"
                " document.querySelector('#d-reason').value === 'holding still while the run moves'"
            )
            rows.append(
                {
                    "dialog_open": dialog,
                    "facts": facts,
                    "pushes": pushes,
                    "statements": (statements - statements0)
                    if statements is not None and statements0 is not None
                    else None,
                    "servers_cpu_ms": round(1000 * cpu, 1),
                    "page_requests": len(asked),
                    "page_request_samples": asked[:3],
                }
                | ({"typed_reason_kept": bool(still)} if dialog else {})
            )
            if dialog:
                page.click("#dialog button.close")
        browser.close()
    post(f"/runs/{run['id']}/finish", {"fencing_token": fence, "outcome": "succeeded"})
    api.close()

    def per(open_: bool, key: str, by: str) -> float | None:
        chosen = [r for r in rows if r["dialog_open"] == open_ and r[key] is not None]
        total = sum(r[by] for r in chosen)
        return round(sum(r[key] for r in chosen) / total, 2) if total else None

    # Per fact is the measure: every phase commits the same facts, while the pushes they make vary
    # with coalescing (a busy server folds several facts into one push), which would tilt a per-push
    # ratio without any cost behind it. The pairs (closed, open) are next to each other in time.
    out: dict[str, Any] = {"phases": rows, "rate_facts_per_s": rate}
    for key, name in (("statements", "statements"), ("servers_cpu_ms", "server_cpu_ms")):
        for by in ("facts", "pushes"):
            closed, opened = per(False, key, by), per(True, key, by)
            unit = "fact" if by == "facts" else "push"
            out[f"{name}_per_{unit}_closed"], out[f"{name}_per_{unit}_open"] = closed, opened
            out[f"{name}_per_{unit}_added_by_dialog"] = (
                round(opened - closed, 2) if closed is not None and opened is not None else None
            )
    out["page_requests_while_open"] = sum(r["page_requests"] for r in rows if r["dialog_open"])
    out["typed_reason_kept"] = all(r.get("typed_reason_kept", True) for r in rows)
    out["pushes_per_fact"] = round(statistics.mean(r["pushes"] / r["facts"] for r in rows), 2)
    return out
