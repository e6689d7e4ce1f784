"""Client: payloads, auth, error mapping, retries (idempotent calls only)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import pytest

from controlplane_sdk import (
    ApiError,
    Client,
    Conflict,
    EffectCompensated,
    EffectDenied,
    EffectsUnresolved,
    EffectUnresolved,
    Forbidden,
    IdempotencyKeyReused,
    InvalidRequest,
    LeaseHeld,
    LeaseLost,
    NotClaimable,
    NotFound,
    ServerUnreachable,
    Unauthorized,
)

if TYPE_CHECKING:
    from tests.sdk.conftest import FakeServer

RUN, LEASE, TOKEN = "r1", "l1", 7  # what the fake server in conftest.py hands out


def declare(client: Client, **kw):
    args = dict(
        step="charge", tool="payments", action="charge", idempotency_key="k1", args={"amount": 5}
    )
    args.update(kw)
    return client.declare_effect(RUN, TOKEN, **args)


def test_bearer_auth_prefix_and_request_id(server: FakeServer, client: Client) -> None:
    client.get_run(RUN)
    (req,) = server.requests
    assert req.path == f"/runs/{RUN}"
    assert req.headers["authorization"] == "Bearer tok-123"
    assert req.headers["x-request-id"]


def test_base_url_may_include_api_prefix(server: FakeServer) -> None:
    c = Client("http://cp.test/api/v1/", "t", transport=httpx.MockTransport(server.handler))
    c.get_run(RUN)
    assert server.requests[0].path == f"/runs/{RUN}"


def test_claim_payload_and_parse(server: FakeServer, client: Client) -> None:
    server.checkpoint = {"seq": 3, "step": "reserve", "state": {"reserved": True}}
    c = client.claim(RUN, "worker-7", {"code": "1.4.2"})
    assert server.bodies("POST", f"/runs/{RUN}/claim") == [
        {"worker": "worker-7", "versions": {"code": "1.4.2"}}
    ]
    assert (c.attempt.id, c.attempt.number) == ("a1", 1)
    assert (c.lease.id, c.lease.fencing_token, c.lease.ttl_s) == (LEASE, TOKEN, 30)
    assert c.checkpoint is not None and (c.checkpoint.seq, c.checkpoint.step) == (3, "reserve")
    assert c.checkpoint.state == {"reserved": True}
    assert c.directive == "continue"


def test_heartbeat_long_poll_body(server: FakeServer, client: Client) -> None:
    server.on(
        "POST",
        f"/leases/{LEASE}/heartbeat",
        (
            200,
            {
                "directive": "wait",
                "reason": "approval",
                "expires_at": "x",
                "approval": {"id": "ap1"},
            },
        ),
    )
    hb = client.heartbeat(LEASE, TOKEN, wait_s=20)
    assert server.bodies("POST", f"/leases/{LEASE}/heartbeat") == [
        {"fencing_token": TOKEN, "wait_s": 20}
    ]
    assert (hb.directive, hb.reason, hb.approval) == ("wait", "approval", {"id": "ap1"})


def test_declare_payload(server: FakeServer, client: Client) -> None:
    d = declare(client, compensation={"tool": "payments", "action": "refund"})
    assert server.bodies("POST", f"/runs/{RUN}/effects") == [
        {
            "fencing_token": TOKEN,
            "step": "charge",
            "tool": "payments",
            "action": "charge",
            "idempotency_key": "k1",
            "args": {"amount": 5},
            "compensation": {"tool": "payments", "action": "refund"},
            "irreversible": False,
        }
    ]
    assert (d.decision, d.status, d.idempotency_key, d.already_done) == (
        "authorized",
        "in_flight",
        "k1",
        False,
    )


def test_list_runs_params_and_wrapped_items(server: FakeServer, client: Client) -> None:
    server.on("GET", "/runs", (200, {"items": [{"id": "r9"}], "count": 1}))
    assert client.list_runs(agent="purchasing", state="queued") == [{"id": "r9"}]
    assert server.requests[0].params == {"agent": "purchasing", "state": "queued"}


@pytest.mark.parametrize(
    ("status", "payload", "cls", "code"),
    [
        (409, {"error": "lease_lost", "detail": "expired"}, LeaseLost, "lease_lost"),
        (409, {"error": "lease_held", "detail": "w2"}, LeaseHeld, "lease_held"),
        (409, {"error": "not_claimable", "detail": "done"}, NotClaimable, "not_claimable"),
        (
            409,
            {"error": "denied", "decision": "denied", "reason": "run_paused"},
            EffectDenied,
            "denied",
        ),
        (
            422,
            {"error": "idempotency_key_reused", "detail": "args differ"},
            IdempotencyKeyReused,
            "idempotency_key_reused",
        ),
        (
            422,
            {"error": "idempotency_key_reused", "compensated": True, "effect_id": "e7"},
            EffectCompensated,
            "idempotency_key_reused",
        ),
        (
            409,
            {"error": "effect_unresolved", "effect_id": "e0"},
            EffectUnresolved,
            "effect_unresolved",
        ),
        (409, {"error": "conflict", "state": "paused"}, Conflict, "conflict"),
        (
            409,
            {"error": "effects_unresolved", "effects": ["e1"]},
            EffectsUnresolved,
            "effects_unresolved",
        ),
        (422, {"error": "invalid", "detail": "bad"}, InvalidRequest, "invalid"),
        (403, {"error": "forbidden"}, Forbidden, "forbidden"),
        (401, {"detail": "Unauthorized"}, Unauthorized, "http_401"),
        (404, {"error": "not_found"}, NotFound, "not_found"),
        (418, {"error": "teapot", "detail": "short and stout"}, ApiError, "teapot"),
    ],
)
def test_error_mapping(server: FakeServer, client: Client, status, payload, cls, code) -> None:
    server.on("POST", f"/runs/{RUN}/finish", (status, payload))
    with pytest.raises(cls) as ei:
        client.finish(RUN, TOKEN, "succeeded")
    err = ei.value
    assert type(err) is cls and (err.status, err.code) == (status, code)
    assert err.payload == payload


def test_denied_exposes_reason_and_unresolved_effect_id(server: FakeServer, client: Client) -> None:
    server.on(
        "POST",
        f"/runs/{RUN}/effects",
        (409, {"error": "denied", "decision": "denied", "reason": "authority_revoked"}),
    )
    with pytest.raises(EffectDenied) as ei:
        declare(client)
    assert ei.value.reason == "authority_revoked"
    server.on(
        "POST", f"/runs/{RUN}/effects", (409, {"error": "effect_unresolved", "effect_id": "e0"})
    )
    with pytest.raises(EffectUnresolved) as eu:
        declare(client)
    assert eu.value.effect_id == "e0"


def test_a_compensated_key_is_its_own_error_and_still_a_reused_key(
    server: FakeServer, client: Client
) -> None:
    """A redrive compensated the key's effect first: doing it again takes a new key. Code that
    caught IdempotencyKeyReused still catches it; code that needs to tell it apart can."""
    body = {"error": "idempotency_key_reused", "compensated": True, "effect_id": "e7"}
    server.on("POST", f"/runs/{RUN}/effects", (422, body))
    with pytest.raises(IdempotencyKeyReused) as ei:
        declare(client)
    assert isinstance(ei.value, EffectCompensated) and ei.value.effect_id == "e7"
    server.on("POST", f"/runs/{RUN}/effects", (422, {"error": "idempotency_key_reused"}))
    with pytest.raises(IdempotencyKeyReused) as other:
        declare(client)
    assert not isinstance(other.value, EffectCompensated)


def test_non_json_error_body(server: FakeServer, client: Client) -> None:
    server.on("GET", f"/runs/{RUN}", (500, "<html>boom</html>"))
    with pytest.raises(ApiError) as ei:
        client.get_run(RUN)
    assert (ei.value.status, ei.value.code, ei.value.detail) == (
        500,
        "http_500",
        "<html>boom</html>",
    )


@pytest.mark.parametrize(
    ("method", "path", "call"),
    [
        ("POST", f"/leases/{LEASE}/heartbeat", lambda c: c.heartbeat(LEASE, TOKEN)),
        ("GET", f"/runs/{RUN}", lambda c: c.get_run(RUN)),
        ("GET", "/runs", lambda c: c.list_runs(agent="a")),
        ("GET", f"/runs/{RUN}/effects", lambda c: c.list_effects(RUN)),
        ("POST", "/effects/e1/outcome", lambda c: c.record_outcome("e1", TOKEN, "committed")),
        ("POST", f"/runs/{RUN}/checkpoints", lambda c: c.checkpoint(RUN, TOKEN, "s", {})),
        ("POST", f"/runs/{RUN}/effects", lambda c: declare(c)),
    ],
)
def test_idempotent_calls_retry_transient_errors(
    server: FakeServer, client: Client, method, path, call
) -> None:
    server.on(
        method,
        path,
        httpx.ConnectError("refused"),
        httpx.ReadTimeout("slow"),
        (503, {"error": "busy"}),
        server.default,
    )
    call(client)
    assert len(server.calls(method, path)) == 4


@pytest.mark.parametrize(
    ("path", "call"),
    [
        (f"/runs/{RUN}/claim", lambda c: c.claim(RUN, "w")),
        (f"/runs/{RUN}/finish", lambda c: c.finish(RUN, TOKEN, "succeeded")),
        (
            f"/runs/{RUN}/events",
            lambda c: c.append_events(RUN, TOKEN, [{"kind": "message", "data": {}}]),
        ),
        (
            f"/runs/{RUN}/approvals",
            lambda c: c.request_approval(RUN, TOKEN, tool="t", action="a", args={}, reason="r"),
        ),
        ("/runs", lambda c: c.create_run("purchasing", "buy")),
    ],
)
def test_non_idempotent_calls_are_not_retried(
    server: FakeServer, client: Client, path, call
) -> None:
    server.on("POST", path, httpx.ConnectError("refused"), server.default)
    with pytest.raises(ServerUnreachable) as ei:
        call(client)
    assert isinstance(ei.value.__cause__, httpx.ConnectError)
    assert len(server.calls("POST", path)) == 1


def test_non_idempotent_503_is_not_retried(server: FakeServer, client: Client) -> None:
    server.on("POST", f"/runs/{RUN}/finish", (503, {"error": "busy"}), server.default)
    with pytest.raises(ApiError) as ei:
        client.finish(RUN, TOKEN, "succeeded")
    assert ei.value.status == 503 and len(server.calls("POST", f"/runs/{RUN}/finish")) == 1


def test_retries_are_bounded(server: FakeServer, client: Client) -> None:
    server.on("GET", f"/runs/{RUN}", httpx.ConnectError("down"))
    with pytest.raises(ServerUnreachable):
        client.get_run(RUN)
    assert len(server.calls("GET", f"/runs/{RUN}")) == 1 + client.retries


def test_4xx_is_never_retried(server: FakeServer, client: Client) -> None:
    server.on("POST", f"/leases/{LEASE}/heartbeat", (409, {"error": "lease_lost"}))
    with pytest.raises(LeaseLost):
        client.heartbeat(LEASE, TOKEN)
    assert len(server.calls("POST", f"/leases/{LEASE}/heartbeat")) == 1


def test_declare_replayed_committed(server: FakeServer, client: Client) -> None:
    server.on(
        "POST",
        f"/runs/{RUN}/effects",
        (
            200,
            {
                "id": "e0",
                "decision": "replayed",
                "status": "committed",
                "idempotency_key": "k1",
                "external_ref": "ch_1",
                "outcome_detail": {"amount": 5},
            },
        ),
    )
    d = declare(client)
    assert d.replayed and d.already_done
    assert (d.id, d.external_ref, d.outcome_detail) == ("e0", "ch_1", {"amount": 5})


def test_declare_replayed_in_flight_is_unresolved(server: FakeServer, client: Client) -> None:
    server.on(
        "POST",
        f"/runs/{RUN}/effects",
        (200, {"id": "e0", "decision": "replayed", "status": "unknown", "idempotency_key": "k1"}),
    )
    with pytest.raises(EffectUnresolved) as ei:
        declare(client, attempt_id="a1")
    assert ei.value.effect_id == "e0"


def test_declare_adopts_own_declaration_after_lost_response(
    server: FakeServer, client: Client
) -> None:
    # first try reached the server but the response was lost; the retry finds the key in flight
    server.on(
        "POST",
        f"/runs/{RUN}/effects",
        httpx.ReadTimeout("lost"),
        (409, {"error": "effect_unresolved", "effect_id": "e5"}),
    )
    server.on(
        "GET",
        f"/runs/{RUN}/effects",
        (
            200,
            [{"id": "e5", "idempotency_key": "k1", "status": "in_flight", "attempt": {"id": "a1"}}],
        ),
    )
    d = declare(client, attempt_id="a1")
    assert (d.id, d.decision, d.status, d.adopted) == ("e5", "authorized", "in_flight", True)


def test_declare_does_not_adopt_another_attempts_effect(server: FakeServer, client: Client) -> None:
    server.on(
        "POST",
        f"/runs/{RUN}/effects",
        httpx.ReadTimeout("lost"),
        (409, {"error": "effect_unresolved", "effect_id": "e5"}),
    )
    server.on(
        "GET",
        f"/runs/{RUN}/effects",
        (200, [{"id": "e5", "idempotency_key": "k1", "status": "in_flight", "attempt_id": "a0"}]),
    )
    with pytest.raises(EffectUnresolved):
        declare(client, attempt_id="a1")


def test_declare_unresolved_without_lost_response_raises_without_lookup(
    server: FakeServer, client: Client
) -> None:
    server.on(
        "POST", f"/runs/{RUN}/effects", (409, {"error": "effect_unresolved", "effect_id": "e5"})
    )
    with pytest.raises(EffectUnresolved):
        declare(client, attempt_id="a1")
    assert server.calls("GET", f"/runs/{RUN}/effects") == []


def test_bodies_match_the_server_schema(server: FakeServer, client: Client) -> None:
    client.finish(RUN, TOKEN, "failed")
    client.record_outcome("e1", TOKEN, "unknown")
    client.request_approval(
        RUN,
        TOKEN,
        tool="payments",
        action="charge",
        args={"amount": 1},
        reason="big",
        deadline_s=59.5,
        required_role="incident_commander",
    )
    client.heartbeat(LEASE, TOKEN, wait_s=600)
    client.release_lease(LEASE, TOKEN, "paused")
    assert server.bodies("POST", f"/runs/{RUN}/finish") == [
        {"fencing_token": TOKEN, "outcome": "failed", "failure_class": "", "error": ""}
    ]
    assert server.bodies("POST", "/effects/e1/outcome") == [
        {"fencing_token": TOKEN, "status": "unknown", "external_ref": "", "detail": {}}
    ]
    assert server.bodies("POST", f"/runs/{RUN}/approvals") == [
        {
            "fencing_token": TOKEN,
            "tool": "payments",
            "action": "charge",
            "args": {"amount": 1},
            "reason": "big",
            "deadline_s": 60,
            "required_role": "incident_commander",
        }
    ]
    assert server.bodies("POST", f"/leases/{LEASE}/heartbeat") == [
        {"fencing_token": TOKEN, "wait_s": 60}
    ]
    assert server.bodies("POST", f"/leases/{LEASE}/release") == [
        {"fencing_token": TOKEN, "reason": "paused"}
    ]


def test_operator_helpers(server: FakeServer, client: Client) -> None:
    server.on(
        "POST",
        f"/runs/{RUN}/interventions",
        (202, {"id": "i1", "kind": "pause", "status": "applied"}),
    )
    server.on(
        "POST",
        "/effects/e1/reconcile",
        (200, {"id": "e1", "status": "committed", "reconciled": True}),
    )
    assert (
        client.intervene(RUN, "pause", "stale price", scope="tree", options={"x": 1})["status"]
        == "applied"
    )
    client.reconcile_effect("e1", "committed", "world says charged", "scenario 4")
    assert server.bodies("POST", f"/runs/{RUN}/interventions") == [
        {"kind": "pause", "reason": "stale price", "scope": "tree", "options": {"x": 1}}
    ]
    assert server.bodies("POST", "/effects/e1/reconcile") == [
        {
            "outcome": "committed",
            "evidence": "world says charged",
            "reason": "scenario 4",
            "external_ref": "",
        }
    ]


def test_a_draining_replicas_refusal_is_sent_again_by_every_call() -> None:
    """A 503 marked X-Controlplane-Draining did nothing (controlplane/drain.py): even a call sent
    once (finish) goes again, and behind a load balancer reaches the replica that stays; a plain 503
    to the same call is still not resent."""
    answers = [
        httpx.Response(503, json={"error": "draining"}, headers={"X-Controlplane-Draining": "1"}),
        httpx.Response(200, json={"id": RUN, "state": "succeeded"}),
        httpx.Response(503, json={"error": "busy"}),
    ]
    sent: list[httpx.Request] = []

    def replica(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return answers.pop(0)

    client = Client(
        "http://cp.test", "t", transport=httpx.MockTransport(replica), sleep=lambda s: None
    )
    assert client.finish(RUN, TOKEN, "succeeded")["state"] == "succeeded"
    assert len(sent) == 2
    with pytest.raises(ApiError) as ei:
        client.finish(RUN, TOKEN, "succeeded")
    assert ei.value.status == 503 and len(sent) == 3
