"""The worker protocol's version header (api/protocol_version.py): the SDK sends the version it
speaks; the server serves it, serves a call without the header (an SDK from before it), and refuses
a version it does not speak with an error naming both, having done nothing."""

from __future__ import annotations

import httpx
import pytest

from controlplane_sdk import PROTOCOL_VERSION, Client
from controlplane_sdk.errors import ApiError
from runs.models import Run
from tests.conftest import start_run

HEADER = "X-Controlplane-Protocol"
BODY = {
    "agent": "purchasing",
    "goal": "versioned",
    "input": {},
    "versions": {"code": "1.0.0"},
    "authority": [],
}


def _post_run(client, worker_token, **headers):
    return client.post(
        "/api/v1/runs",
        BODY,
        content_type="application/json",
        headers={"Authorization": f"Bearer {worker_token}", **headers},
    )


def test_the_sdk_sends_the_version_it_speaks(db):
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get(HEADER))
        return httpx.Response(200, json={"id": "r", "state": "queued"})

    sdk = Client("http://cp", "cpw_x", transport=httpx.MockTransport(handler))
    sdk.create_run("purchasing", "g")
    assert seen == [str(PROTOCOL_VERSION)]


def test_the_current_version_and_no_header_at_all_are_both_served(client, worker, worker_token):
    for headers in ({HEADER: str(PROTOCOL_VERSION)}, {}):
        resp = _post_run(client, worker_token, **headers)
        assert resp.status_code == 201, resp.content
        assert resp[HEADER] == str(PROTOCOL_VERSION)


@pytest.mark.parametrize("sent", ["2", "0", "1.5", "banana"])
def test_a_version_the_server_does_not_speak_is_refused_naming_it_and_nothing_is_done(
    client, worker, worker_token, sent
):
    before = Run.objects.count()
    resp = _post_run(client, worker_token, **{HEADER: sent})
    assert resp.status_code == 400, resp.content
    body = resp.json()
    assert body["error"] == "protocol_version_unsupported"
    assert body["sent"] == sent and body["supported"] == [PROTOCOL_VERSION]
    assert repr(sent) in body["detail"] and f"version {PROTOCOL_VERSION}" in body["detail"]
    assert Run.objects.count() == before


def test_an_sdk_speaking_a_newer_version_gets_a_clear_error(live_server, worker, worker_token):
    start_run(worker)  # the server works for the current protocol
    sdk = Client(live_server.url, worker_token)
    sdk._http.headers[HEADER] = "2"  # an SDK from the future
    with pytest.raises(ApiError) as refused:
        sdk.create_run("purchasing", "from the future", versions={"code": "1.0.0"})
    assert refused.value.status == 400
    assert refused.value.code == "protocol_version_unsupported"
    assert "'2'" in str(refused.value) and "upgrade the server" in str(refused.value)
