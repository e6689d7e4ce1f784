"""Bad input, in numbers: every API route (enumerated from the OpenAPI document) and every console page
and dialog (console/urls.py) is sent malformed JSON, deep nesting, huge bodies and headers, NUL bytes,
invalid UTF-8, NaN/Infinity, extreme numbers and dates, wrong types and unknown fields.

Pass bar: no 5xx; every API 4xx is a JSON error with ``error``, ``detail`` and ``field`` (a non-empty
field for 400/413/422); console errors are HTML pages; a refused request writes nothing but, at most,
its own "denied" audit event. The last test sends a burst of the worst of it to a real daphne and
checks that every request is answered and the server stays up.
"""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from django.db import connection
from django.test import Client
from django.urls import URLPattern

from audit.models import AuditEvent
from console.urls import urlpatterns as CONSOLE_URLS
from interventions.models import Intervention
from runs.models import Approval, Checkpoint, Effect, HistoryEvent, Run
from tests.conftest import claim, declare, start_run
from tests.interventions.helpers import intervene
from tests.live import Procs, server_env, start_daphne

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(180)]

MB = 1024 * 1024
# Each test takes a few seconds on an idle machine (well under 60 s together); the bound is loose
# because the suite may share its cores with other suites.
TIME_BOUND_S = 100
RESET = -1  # a connection closed without an answer
DEEP = 10_000


def _nested_text(depth: int) -> str:
    return '{"args": ' + "[" * depth + "]" * depth + "}"


# Raw bodies: (label, bytes). The ones that are valid JSON objects also get each field set hostile.
RAW_BODIES: list[tuple[str, bytes]] = [
    ("truncated", b'{"goal": "g", "agent": '),
    ("not-json", b"pause everything now"),
    ("a-list", b"[1, 2, 3]"),
    ("a-string", b'"hello"'),
    ("deep-array", _nested_text(DEEP).encode()),
    ("deep-object", ('{"a":' * DEEP + "1" + "}" * DEEP).encode()),
    ("huge", b'{"goal": "' + b"x" * (3 * MB) + b'"}'),
    ("invalid-utf8", b'{"goal": "\xff\xfe\xc3\x28", "reason": "\xed\xa0\x80"}'),
    ("nan", b'{"fencing_token": NaN, "wait_s": Infinity, "args": {"x": -Infinity}}'),
    ("long-int", b'{"fencing_token": ' + b"9" * 5000 + b"}"),
    ("nul", b'{"goal": "a\\u0000b", "reason": "\\u0000", "kind": "pause\\u0000"}'),
    ("nul-key", b'{"args": {"k\\u0000": 1}, "input": {"\\u0000": 1}}'),
    ("surrogate", b'{"goal": "\\ud800", "reason": "\\udfff"}'),
    ("noncharacter", '{"goal": "\ufdd0", "reason": "\uffff"}'.encode()),
    ("unknown-fields", b'{"zzz": 1, "__proto__": {"admin": true}}'),
    ("empty", b""),
]
HOSTILE_VALUES = [
    1e308,
    -1e308,
    2**64,
    -(2**64),
    "9999-12-31T23:00:00-14:00",
    "0001-01-01T00:00:00+14:00",
    [],
    {"nested": [{"deeper": None}]},
    True,
    "x" * 5000,
]


def _typed_bodies(document: dict, operation: dict) -> list[tuple[str, bytes]]:
    """For each property of the operation's body: the property set to each hostile value."""
    body = operation.get("requestBody")
    if not body:
        return []
    schema = body["content"]["application/json"]["schema"]
    while "$ref" in schema:
        schema = document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
    names = list(schema.get("properties", {}))
    # every property hostile at once, with each value; then each property alone (so that the others'
    # validation cannot hide it), cycling through the values
    out = [(f"all={v!r:.20}", json.dumps(dict.fromkeys(names, v)).encode()) for v in HOSTILE_VALUES]
    for i, name in enumerate(names):
        value = HOSTILE_VALUES[i % len(HOSTILE_VALUES)]
        out.append((f"{name}={value!r:.20}", json.dumps({name: value}).encode()))
    return out


QUERIES = [
    "limit=%00",
    "limit=%ff%fe",
    "limit=1e308",
    "limit=99999999999999999999999999",
    "limit=-1",
    "limit=NaN",
    "after_seq=18446744073709551616",
    "after_seq=%EF%B7%90",
    "state=" + "running," * 500,
    "agent=a%00b",
    "run_id=%00",
    "before=99999999999999999999",
    "since_seq=" + "9" * 100,
    "kind=pause%00",
    "part=%ff",
    "q" * 2000 + "=1",
]
API_QUERIES = QUERIES[:7] + QUERIES[-1:]
CONSOLE_QUERIES = QUERIES[:2] + QUERIES[9:]  # pages render in full: the parameters pages read
HUGE_HEADERS = {"HTTP_X_PADDING": "p" * (256 * 1024), "HTTP_USER_AGENT": "\u0000ua" * 1000}


# --- the cast and the ids the paths point at ------------------------------------------------------


@pytest.fixture
def world(worker, cast, as_user) -> dict:
    running = start_run(worker)
    lease = claim(worker, running["id"])
    token = lease["lease"]["fencing_token"]
    effect = declare(worker, running["id"], token, key="hostile-1").json()
    worker.post(
        f"/runs/{running['id']}/approvals",
        {"fencing_token": token, "tool": "payments", "action": "charge", "reason": "big"},
    )
    paused = start_run(worker)
    claim(worker, paused["id"])
    receipt = intervene(as_user("ian"), paused["id"], "pause").json()
    held = as_user("ada").post(  # a fleet operation recorded and not started: its routes reach it
        "/fleet",
        {"kind": "cancel", "filter": f"id={paused['id']}", "reason": "held", "hold": True},
    )
    assert held.status_code == 202, held.content
    frozen = as_user("ada").post(  # a standing freeze: its routes reach it
        "/fleet/freezes",
        {"capability": "shipping:label", "over": "everything", "reason": "held"},
    )
    assert frozen.status_code == 201, frozen.content
    hold = as_user("ada").post(  # an intake hold: its routes (release, its preview) reach it
        "/intake/holds", {"scope": "tool", "target": "notifications", "reason": "held"}
    )
    assert hold.status_code == 202, hold.content
    channel = as_user("ada").post(  # a notification channel: its routes (page, test-send) reach it
        "/channels",
        {"name": "hostile", "kind": "slack", "url": "http://127.0.0.1:9/hook"},
    )
    assert channel.status_code == 201, channel.content
    team = as_user("ada").post("/teams", {"slug": "hostile"})  # its routes reach a team, a member
    assert team.status_code == 201, team.content
    return {
        "slug": "hostile",
        "username": "otto",
        "channel_id": channel.json()["id"],
        "name": "purchasing",  # an agent's name: its approval-policies routes reach it
        "hold_id": hold.json()["id"],
        "freeze_id": frozen.json()["freeze"]["id"],
        "operation_id": held.json()["id"],
        "run_id": running["id"],
        "lease_id": lease["lease"]["id"],
        "effect_id": effect["id"],
        "intervention_id": receipt["id"],
        "approval_id": str(Approval.objects.first().pk),
        "worker_token": worker.headers["HTTP_AUTHORIZATION"],
        "operator_token": f"Bearer {cast['ada'][1]}",
    }


COUNTED = (Run, Effect, Checkpoint, HistoryEvent, Intervention, Approval, AuditEvent)


def counts() -> dict[str, int]:
    """Rows of every table a request could half-write, in one query (it runs before and after each
    of several hundred requests). Effects count only authorized ones: a denied declaration is kept."""
    parts = [f"(SELECT count(*) FROM {m._meta.db_table})" for m in COUNTED]
    parts[1] = f"(SELECT count(*) FROM {Effect._meta.db_table} WHERE decision = 'authorized')"
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(parts))
        row = cursor.fetchone()
    return {m.__name__: n for m, n in zip(COUNTED, row, strict=True)}


def nothing_half_written(before: dict[str, int], label: str) -> None:
    after = counts()
    new_audit = after.pop("AuditEvent") - before["AuditEvent"]
    assert after == {k: v for k, v in before.items() if k != "AuditEvent"}, label
    if new_audit:  # a refused decision is audited -- as denied, and only once
        outcomes = set(
            AuditEvent.objects.order_by("-seq")[:new_audit].values_list("outcome", flat=True)
        )
        assert new_audit == 1 and outcomes == {AuditEvent.DENIED}, (label, new_audit, outcomes)


# --- the API --------------------------------------------------------------------------------------


def _api_operations(document: dict) -> list[tuple[str, str, dict]]:
    return [
        (method.upper(), path, operation)
        for path, item in document["paths"].items()
        for method, operation in item.items()
    ]


def _check_api_answer(resp, label: str) -> None:
    assert resp.status_code < 500, (label, resp.status_code, resp.content[:500])
    if resp.status_code < 400:
        return
    assert resp["Content-Type"].startswith("application/json"), (label, resp["Content-Type"])
    body = resp.json()
    assert {"error", "detail", "field"} <= set(body), (label, body)
    if resp.status_code in (400, 413, 422):
        assert body["field"], (label, body)


def test_every_api_route_survives_hostile_bodies_queries_and_headers(world):
    client = Client()
    started, sent = time.monotonic(), 0
    document = client.get("/api/v1/openapi.json").json()
    for method, template, operation in _api_operations(document):
        path = re.sub(r"\{(\w+)\}", lambda m: world[m.group(1)], template)
        worker_route = "worker protocol" in operation.get("tags", [])
        auth = world["worker_token" if worker_route else "operator_token"]
        if method == "POST":
            bodies = RAW_BODIES + _typed_bodies(document, operation)
            for label, raw in bodies:
                before = counts()
                resp = client.post(
                    path, raw, content_type="application/json", HTTP_AUTHORIZATION=auth
                )
                _check_api_answer(resp, f"{method} {template} {label}")
                if resp.status_code >= 400:
                    nothing_half_written(before, f"{method} {template} {label}")
                sent += 1
        for query in API_QUERIES:
            resp = client.generic(method, f"{path}?{query}", HTTP_AUTHORIZATION=auth)
            _check_api_answer(resp, f"{method} {template} ?{query[:40]}")
            sent += 1
        resp = client.generic(
            method, path, b"{}", "application/json", HTTP_AUTHORIZATION=auth, **HUGE_HEADERS
        )
        _check_api_answer(resp, f"{method} {template} huge headers")
        for bad_auth in ("Bearer " + "a" * 100_000, "Bearer \u0000", "Basic Zm9vOmJhcg=="):
            resp = client.generic(
                method, path, b"{}", "application/json", HTTP_AUTHORIZATION=bad_auth
            )
            assert resp.status_code == 401, (template, resp.content[:200])
            _check_api_answer(resp, f"{method} {template} bad auth")
        sent += 4
    assert sent > 400
    assert time.monotonic() - started < TIME_BOUND_S


# --- the console ----------------------------------------------------------------------------------


def _console_paths(world: dict) -> list[str]:
    paths = []
    for pattern in CONSOLE_URLS:
        assert isinstance(pattern, URLPattern)
        route = str(pattern.pattern)
        route = re.sub(r"<uuid:(\w+)>", lambda m: world[m.group(1)], route)
        paths.append("/" + route)
    return paths


FORM_BODIES: list[tuple[str, bytes, str]] = [
    ("nul", b"kind=pause&reason=a%00b&evidence=%00", "application/x-www-form-urlencoded"),
    ("invalid-utf8", b"kind=pause&reason=%ff%fe&outcome=\xff", "application/x-www-form-urlencoded"),
    ("noncharacter", b"kind=pause&reason=%EF%B7%90", "application/x-www-form-urlencoded"),
    ("huge", b"reason=" + b"x" * (3 * MB), "application/x-www-form-urlencoded"),
    (
        "many-fields",
        b"&".join(b"f%d=1" % i for i in range(5000)),
        "application/x-www-form-urlencoded",
    ),
    (
        "numbers",
        b"kind=retry&reason=r&checkpoint_seq=99999999999999999999999",
        "application/x-www-form-urlencoded",
    ),
    ("numbers-2", b"kind=retry&reason=r&checkpoint_seq=1e308", "application/x-www-form-urlencoded"),
    ("wrong-kind", b"kind=%5B%5D&reason=r&scope=everything", "application/x-www-form-urlencoded"),
    ("unknown", b"zzz=1&kind=pause&reason=r&preview_token=00", "application/x-www-form-urlencoded"),
    ("json", _nested_text(DEEP).encode(), "application/json"),
    (
        "bad-multipart",
        b'--x\r\nContent-Disposition: form-data; name="a"\r\n\r\n\xff',
        "multipart/form-data; boundary=x",
    ),
    ("no-boundary", b"garbage", "multipart/form-data"),
]


def _check_console_answer(resp, label: str) -> None:
    assert resp.status_code < 500, (label, resp.status_code, resp.content[:500])
    if resp.status_code >= 400:
        assert resp["Content-Type"].startswith("text/html"), (label, resp["Content-Type"])


def test_every_console_page_and_dialog_survives_hostile_queries_and_forms(world):
    ada = Client(enforce_csrf_checks=True)
    assert ada.login(username="ada", password="pw-ada")
    ada.get("/")
    csrf = ada.cookies["csrftoken"].value
    started = time.monotonic()
    for path in _console_paths(world):
        for query in CONSOLE_QUERIES:
            _check_console_answer(ada.get(f"{path}?{query}"), f"GET {path}?{query[:40]}")
        _check_console_answer(ada.get(path, **HUGE_HEADERS), f"GET {path} huge headers")
        for label, raw, content_type in FORM_BODIES:
            before = counts()
            resp = ada.post(path, raw, content_type=content_type, HTTP_X_CSRFTOKEN=csrf)
            _check_console_answer(resp, f"POST {path} {label}")
            if resp.status_code >= 400:
                nothing_half_written(before, f"POST {path} {label}")
    assert time.monotonic() - started < TIME_BOUND_S


# --- a real server under a burst ------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_daphne_answers_every_hostile_request_of_a_burst_and_stays_up(
    postgres_only, tmp_path, worker_token
):
    procs = Procs(tmp_path)
    try:
        base = start_daphne(procs, server_env(tmp_path))
        auth = {"Authorization": f"Bearer {worker_token}"}
        json_auth = {"Content-Type": "application/json"} | auth
        # (method, path, headers, body, the answers that are right)
        requests = [
            ("GET", "/api/v1/runs", {"X-Padding": "p" * 12_000} | auth, None, {200}),
            # Past twisted's 16 KiB header limit it writes a 400 and closes at once; while the client
            # is still sending, its kernel may reset the connection before that 400 is read. So this
            # one may end either way -- and the server must be up for everything that follows.
            ("GET", "/api/v1/runs", {"X-Padding": "p" * 64_000} | auth, None, {400, 431, RESET}),
            ("POST", "/api/v1/runs", json_auth, b'{"goal": "\xff\xfe"}', {400}),
            ("POST", "/api/v1/runs", json_auth, _nested_text(DEEP).encode(), {400}),
            ("POST", "/api/v1/runs", json_auth, b'{"goal": "' + b"x" * (2 * MB) + b'"}', {413}),
            ("POST", "/api/v1/runs", json_auth | {"Authorization": "Bearer nope"}, b"{}", {401}),
            ("GET", "/api/v1/runs?limit=%ff%00", auth, None, {422}),
            ("GET", "/?before=99999999999999999999", {}, None, {302}),  # to the login page
        ] * 6

        def send(req) -> tuple[int, set[int]]:
            method, path, headers, body, expected = req
            with httpx.Client(base_url=base, timeout=30) as http:
                try:
                    answer = http.request(method, path, headers=headers, content=body)
                except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
                    return RESET, expected
                return answer.status_code, expected

        with ThreadPoolExecutor(max_workers=8) as pool:
            answers = list(pool.map(send, requests))  # a dropped connection raises here
        assert len(answers) == len(requests)
        wrong = [
            (req[:2], got)
            for req, (got, expected) in zip(requests, answers, strict=True)
            if got not in expected
        ]
        assert not wrong, wrong
        assert procs.get("daphne").poll() is None, procs.logs()
        ok = httpx.get(f"{base}/api/v1/runs", headers=auth, timeout=10)
        assert ok.status_code == 200 and "runs" in ok.json()
    finally:
        procs.stop()
