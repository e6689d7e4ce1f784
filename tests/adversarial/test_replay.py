"""Issue 19's adversary, replayed against real processes: daphne serving the API and console,
Celery with beat firing timers, PostgreSQL. Every class of the report, each at its smallest:
unreadable times, delegation past a freeze, look-alike names, secrets on the way out, forged audit
lines, and the low items. (The fault-load tests -- daphne SIGKILL, Redis flushed or down at commit --
are tests/e2e/test_job_outbox.py and tests/acceptance; the OpenAPI fuzz is tests/api/test_schemathesis.py.)"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from datetime import timedelta
from urllib.parse import urlsplit

import httpx
import pytest
from django.db import connection
from django.utils import timezone

from runs.models import Agent, ApiToken, Run, Timer
from tests.conftest import PURCHASING_SCOPES, ROLE_USERS
from tests.live import ROOT, log_in, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("postgres_only"),
]

CARD = "4111111111111111"
UNREADABLE = "0001-01-01T00:00:00+14:00"


@pytest.fixture
def people(db):
    """The cast, with tokens, and passwords the server's own hasher reads."""
    from django.contrib.auth.hashers import PBKDF2PasswordHasher
    from django.contrib.auth.models import Group, User

    Agent.objects.create(name="purchasing", allowed_scopes=[*PURCHASING_SCOPES, "payments:*"])
    hasher, tokens = PBKDF2PasswordHasher(), {}
    for username, role in ROLE_USERS.items():
        # The server verifies with the iterations stored in the hash: few, for speed.
        password = hasher.encode(f"pw-{username}", "s", iterations=1000)
        user = User.objects.create(username=username, password=password)
        user.groups.add(Group.objects.get_or_create(name=role)[0])
        tokens[username] = ApiToken.issue(kind=ApiToken.OPERATOR, name=f"{username}-t", user=user)[
            1
        ]
    tokens["worker"] = ApiToken.issue(kind=ApiToken.WORKER, name="worker-1", agents=["purchasing"])[
        1
    ]
    return tokens


def _run(w: httpx.Client, **extra) -> dict:
    body = {
        "agent": "purchasing",
        "goal": "buy",
        "authority": [{"scope": "payments:*", "ttl_s": 3600}],
        **extra,
    }
    resp = w.post("/runs", json=body)
    assert resp.status_code == 201, resp.text
    return resp.json()


def _claimed(w: httpx.Client, **extra) -> dict:
    run = _run(w, **extra)
    assert w.post(f"/runs/{run['id']}/claim", json={"worker": "worker-1"}).status_code == 200
    return run


def _declare(w: httpx.Client, run_id: str, **body):
    base = {
        "fencing_token": 1,
        "step": "charge",
        "tool": "payments",
        "action": "charge",
        "idempotency_key": f"k-{body.get('action', 'charge')!r}",
        "args": {"amount": 300},
    }
    return w.post(f"/runs/{run_id}/effects", json=base | body)


def test_unreadable_times_are_refused_and_a_stored_one_stops_nothing(stack, people):
    w, ian = stack.api(people["worker"]), stack.api(people["ian"])
    run, other = _claimed(w), _claimed(w)
    for data, field in [
        ({"name": "t", "fire_at": UNREADABLE}, "events.0.data.fire_at"),
        ({"name": "t", "fire_at": "9999-12-31T23:00:00-14:00"}, "events.0.data.fire_at"),
    ]:
        resp = w.post(
            f"/runs/{run['id']}/events",
            json={"fencing_token": 1, "events": [{"kind": "timer_set", "data": data}]},
        )
        assert resp.status_code == 422 and resp.json()["field"] == field, resp.text
    events = [
        {"kind": "timer_set", "data": {"name": "t", "in_s": 3600}},
        {"kind": "assumption", "data": {"key": "price", "max_age_s": 60}},
    ]
    assert (
        w.post(f"/runs/{run['id']}/events", json={"fencing_token": 1, "events": events}).status_code
        == 201
    )
    with connection.cursor() as cur:  # what an older release or a hand fix could have stored
        cur.execute(
            "UPDATE runs_timer SET fire_at = %s::timestamptz WHERE run_id = %s",
            [UNREADABLE, run["id"]],
        )
        cur.execute(
            "UPDATE runs_assumption SET observed_at = %s::timestamptz WHERE run_id = %s",
            [UNREADABLE, run["id"]],
        )
    due = {"kind": "timer_set", "data": {"name": "other", "in_s": 1}}
    assert (
        w.post(
            f"/runs/{other['id']}/events", json={"fencing_token": 1, "events": [due]}
        ).status_code
        == 201
    )

    # The beat (a real Celery worker) fires the other run's timer and the unreadable one alike.
    wait_for(
        "the beat to fire the other run's timer",
        lambda: Timer.objects.filter(run_id=other["id"], status=Timer.FIRED).exists(),
        30,
        logs=(stack.celery_log,),
    )
    browser = log_in(stack.base, "ian")
    page = browser.get(f"/runs/{run['id']}/")
    assert page.status_code == 200, page.text[:500]
    dialog = browser.get(
        f"/runs/{run['id']}/interventions/new/",
        params={"kind": "pause"},
        headers={"HX-Request": "true"},
    )
    assert dialog.status_code == 200, dialog.text[:500]
    preview = ian.post(f"/runs/{run['id']}/interventions/preview", json={"kind": "pause"})
    assert preview.status_code == 200, preview.text
    assert (
        ian.post(
            f"/runs/{run['id']}/interventions", json={"kind": "pause", "reason": "x"}
        ).status_code
        == 202
    )


def test_a_frozen_parent_cannot_charge_through_a_child(stack, people):
    w, sam = stack.api(people["worker"]), stack.api(people["sam"])
    parent = _claimed(w)
    frozen = sam.post(
        f"/runs/{parent['id']}/interventions",
        json={
            "kind": "freeze_capability",
            "reason": "fraud",
            "options": {"scope": "payments:charge"},
        },
    )
    assert frozen.status_code == 202, frozen.text
    for scope in ("payments:charge", "payments:*"):
        child = w.post(
            "/runs",
            json={
                "agent": "purchasing",
                "goal": "c",
                "parent_run_id": parent["id"],
                "authority": [{"scope": scope}],
            },
        )
        assert child.status_code == 403 and child.json()["error"] == "authority_not_allowed", (
            child.text
        )
    assert Run.objects.count() == 1


@pytest.mark.parametrize(
    "action", ["CHARGE", "Charge", "charge ", "charge\t", "char\u200bge", "ch\u0430rge"]
)
def test_lookalike_actions_are_refused(stack, people, action):
    w = stack.api(people["worker"])
    run = _claimed(w)
    resp = _declare(w, run["id"], action=action)
    assert resp.status_code == 422 and resp.json()["field"] == "action", resp.text


def test_no_card_or_secret_leaves_for_a_person(stack, people):
    w = stack.api(people["worker"])
    run = _claimed(w, input={"cardNumber": CARD, "api_key": "plain-secret-123"})
    effect = _declare(w, run["id"], args={"amount": 5, "Card_Number": CARD, "pan": CARD}).json()
    w.post(
        f"/effects/{effect['id']}/outcome",
        json={"fencing_token": 1, "status": "committed", "detail": {"note": f"paid {CARD}"}},
    )
    ian = stack.api(people["ian"])
    browser = log_in(stack.base, "ian")
    for label, resp in {
        "run": ian.get(f"/runs/{run['id']}"),
        "effects": ian.get(f"/runs/{run['id']}/effects"),
        "history": ian.get(f"/runs/{run['id']}/history"),
        "audit": ian.get("/audit", params={"run_id": run["id"]}),
        "page": browser.get(f"/runs/{run['id']}/"),
        "export": log_in(stack.base, "ada").get("/audit/export.jsonl"),
    }.items():
        assert resp.status_code == 200, (label, resp.text[:300])
        assert CARD not in resp.text and "plain-secret-123" not in resp.text, label
    # The worker reads back what it declared.
    assert CARD in w.get(f"/runs/{run['id']}/effects").text


def test_a_forged_backdated_audit_line_is_named_by_audit_verify(stack, people, tmp_path):
    from django.db import transaction

    from audit.chain.append import append
    from audit.services import audit_event
    from core.actors import Actor
    from tests.live import test_database_url

    w = stack.api(people["worker"])
    run = _claimed(w)
    event = audit_event(
        actor=Actor(kind="user", name="april", role="approver"),
        action="approval.decide",
        object_type="approval",
        object_id="forged",
        run_id=run["id"],
    )
    event.created_at = timezone.now() - timedelta(hours=5)
    with transaction.atomic():
        append(event)
    env = stack.env | {"DATABASE_URL": test_database_url(), "ANCHOR_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "manage.py", "audit_verify"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0, done.stdout + done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert (
        report["chain"]["problem"] == "backdated" and report["chain"]["chain"] == f"run:{run['id']}"
    )


def _raw(base: str, request: bytes) -> bytes:
    host = urlsplit(base)
    with socket.create_connection((host.hostname, host.port), timeout=10) as s:
        s.sendall(request)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_the_low_items_on_the_wire(stack, people):
    w = stack.api(people["worker"])
    run = _claimed(w)
    assert _declare(w, run["id"], fencing_token=True).status_code == 422
    dup = (
        '{"fencing_token":1,"step":"s","tool":"payments","action":"charge",'
        '"idempotency_key":"d","args":{"amount":1,"amount":900}}'
    )
    resp = w.post(
        f"/runs/{run['id']}/effects", content=dup, headers={"Content-Type": "application/json"}
    )
    assert resp.status_code == 400 and resp.json()["field"] == "amount", resp.text
    traversal = _raw(
        stack.base,
        b"GET /static/..%2f..%2fcontrolplane%2fsettings.py HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    )
    assert traversal.startswith(b"HTTP/1.1 404"), traversal[:200]
    # Over-long headers and URLs: the promised 400, not a dropped connection.
    big_header = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 17000
    for raw, field in [
        (big_header + b"\r\nConnection: close\r\n\r\n", b'"field": "headers"'),
        (
            b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
            b'"field": "url"',
        ),
    ]:
        answer = _raw(stack.base, raw)
        assert answer.startswith(b"HTTP/1.1 400") and field in answer, answer[:300]
    # A pinned run: naming the pinned worker is not being it.
    run2 = _run(w)
    ian = stack.api(people["ian"])
    moved = ian.post(
        f"/runs/{run2['id']}/interventions",
        json={
            "kind": "transfer",
            "reason": "eu pool",
            "options": {"facets": ["execution_lease"], "to_worker": "worker-9"},
        },
    )
    assert moved.status_code == 202, moved.text
    assert w.post(f"/runs/{run2['id']}/claim", json={"worker": "worker-9"}).status_code == 409
    # A viewer reads the runs' audit events, not sign-ins and tokens.
    events = stack.api(people["vera"]).get("/audit", params={"limit": 1000}).json()["events"]
    assert events and all(e["run_id"] for e in events)
