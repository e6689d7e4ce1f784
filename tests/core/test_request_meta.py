"""The audit's source_ip and request_id come from the connection; X-Forwarded-For and X-Request-ID
are believed only from a peer listed in TRUSTED_PROXIES."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import Client, RequestFactory, override_settings

from audit.models import AuditEvent
from core.auth import client_ip, client_ip_from, request_meta

FORGED = {"HTTP_X_FORWARDED_FOR": "6.6.6.6", "HTTP_X_REQUEST_ID": "forged-id"}


def _request(remote: str, **headers):
    return RequestFactory().get("/", REMOTE_ADDR=remote, **headers)


@override_settings(TRUSTED_PROXIES=[])
def test_it_ignores_forwarding_headers_from_an_untrusted_peer():
    meta = request_meta(_request("203.0.113.7", **FORGED))
    assert meta["source_ip"] == "203.0.113.7"
    assert meta["request_id"] != "forged-id" and len(meta["request_id"]) == 32


@override_settings(TRUSTED_PROXIES=["10.0.0.0/8", "192.0.2.1"])
def test_it_believes_a_trusted_proxy_and_reads_the_chain_from_the_right():
    meta = request_meta(_request("10.1.2.3", **FORGED))
    assert meta == meta | {"source_ip": "6.6.6.6", "request_id": "forged-id"}
    # The client wrote "1.1.1.1" itself; our two proxies appended the hops after it.
    chain = _request("10.1.2.3", HTTP_X_FORWARDED_FOR="1.1.1.1, 198.51.100.4, 192.0.2.1")
    assert client_ip(chain) == "198.51.100.4"
    # Not listed as a proxy: its headers count for nothing.
    assert request_meta(_request("198.51.100.4", **FORGED))["source_ip"] == "198.51.100.4"


@override_settings(TRUSTED_PROXIES=["10.0.0.0/8"])
def test_it_stops_at_garbage_and_refuses_a_malformed_request_id():
    assert client_ip_from("10.0.0.1", "not-an-ip, 10.0.0.2") == "10.0.0.2"
    assert client_ip_from("10.0.0.1", "") == "10.0.0.1"
    assert client_ip_from("10.0.0.1", "10.0.0.9") == "10.0.0.9"  # only proxies: the leftmost
    bad = _request("10.0.0.1", HTTP_X_REQUEST_ID="x" * 65)
    assert request_meta(bad)["request_id"] != "x" * 65
    nul = _request("10.0.0.1", HTTP_X_REQUEST_ID="id\x00with-nul")
    assert "\x00" not in request_meta(nul)["request_id"]


def test_it_keeps_one_request_id_per_request():
    request = _request("203.0.113.7")
    assert request_meta(request)["request_id"] == request_meta(request)["request_id"]


def test_a_bad_trusted_proxies_entry_fails_loudly():
    with override_settings(TRUSTED_PROXIES=["10.0.0.0/33"]), pytest.raises(ImproperlyConfigured):
        request_meta(_request("10.0.0.1"))


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("trusted", "source_ip", "request_id"),
    [([], "127.0.0.1", None), (["127.0.0.1"], "6.6.6.6", "forged-id")],
)
def test_the_audited_login_records_the_address_the_config_allows(
    cast, trusted, source_ip, request_id
):
    with override_settings(TRUSTED_PROXIES=trusted):
        response = Client().post(
            "/accounts/login/", {"username": "otto", "password": "pw-otto"}, **FORGED
        )
    assert response.status_code == 302
    event = AuditEvent.objects.get(action="login")
    assert event.source_ip == source_ip
    if request_id is None:
        assert event.request_id != "forged-id" and len(event.request_id) == 32
    else:
        assert event.request_id == request_id


@pytest.mark.django_db
def test_an_api_intervention_is_audited_with_the_connections_address(cast, worker):
    from tests.conftest import Api, start_run

    run = start_run(worker)
    otto = Api(Client(), cast["otto"][1])
    body = {"kind": "pause", "reason": "check the supplier"}
    response = otto.post(f"/runs/{run['id']}/interventions", body, **FORGED)
    assert response.status_code == 202, response.content
    events = AuditEvent.objects.filter(actor="otto")
    assert events.exists()
    assert {e.source_ip for e in events} == {"127.0.0.1"}
    assert "forged-id" not in {e.request_id for e in events}
