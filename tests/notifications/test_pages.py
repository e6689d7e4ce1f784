"""The channel pages and API are for admins; a bad URL is a 4xx naming the field; the test-send
button shows its result in place; a notification's link opens the approval only after login."""

from __future__ import annotations

import pytest
from django.test import Client

from audit.models import AuditEvent
from core.actors import system_actor
from notifications import jobs, services
from notifications.models import Channel
from tests.interventions.helpers import running_run
from tests.notifications.servers import http_receiver

pytestmark = pytest.mark.django_db

KEY = "whsec-test-key-0123456789"


def _login(username: str) -> Client:
    client = Client()
    assert client.login(username=username, password="pw-" + username)
    return client


def test_it_refuses_a_non_http_webhook_url_over_the_api_naming_the_field(as_user):
    resp = as_user("ada").post(
        "/channels", {"name": "h", "kind": "webhook", "url": "ftp://x.test/h", "secret": KEY}
    )
    assert resp.status_code == 422 and resp.json()["field"] == "url", resp.content
    ok = as_user("ada").post(
        "/channels", {"name": "h", "kind": "webhook", "url": "https://x.test/h", "secret": KEY}
    )
    assert ok.status_code == 201, ok.content
    assert KEY not in ok.content.decode()  # the API answers a mask (the redacting renderer too)
    assert as_user("ada").get("/channels").status_code == 200


@pytest.mark.parametrize("who", ["vera", "otto", "april", "ian"])
def test_only_an_admin_may_see_or_change_channels(as_user, cast, who):
    assert as_user(who).get("/channels").status_code == 403
    assert as_user(who).post("/channels", {"name": "x"}).status_code == 403
    client = _login(who)
    assert client.get("/channels/").status_code == 403
    assert client.post("/channels/", {"name": "x", "kind": "slack"}).status_code == 403
    assert not Channel.objects.exists()


def test_the_console_form_names_the_bad_field_and_audits_the_create(cast):
    client = _login("ada")
    bad = client.post("/channels/", {"name": "h", "kind": "slack", "url": "mailto:x@y"})
    assert bad.status_code == 422 and b'data-field="url"' in bad.content
    good = client.post(
        "/channels/", {"name": "h", "kind": "slack", "url": "https://hooks.x.test/T/B/secret"}
    )
    assert good.status_code == 302
    channel = Channel.objects.get()
    page = client.get(f"/channels/{channel.pk}/")
    assert page.status_code == 200 and b"/T/B/secret" not in page.content
    assert AuditEvent.objects.filter(action="channel.create", actor="ada").exists() or (
        AuditEvent.objects.filter(action="channel.create").count() == 1
    )


def test_the_test_send_button_shows_its_result_in_place(cast, tmp_path):
    receiver = http_receiver(tmp_path).start()
    try:
        channel = services.create_channel(
            actor=system_actor("t"),
            data={
                "name": "h",
                "kind": "webhook",
                "url": f"http://127.0.0.1:{receiver.port}/h",
                "secret": KEY,
            },
        )
        client = _login("ada")
        resp = client.post(f"/channels/{channel.pk}/test/", HTTP_HX_REQUEST="true")
        assert resp.status_code == 200 and b'data-test="sent"' in resp.content
        assert b"<html" not in resp.content  # the fragment only
        assert len(receiver.received()) == 1
    finally:
        receiver.stop()
    failed = client.post(f"/channels/{channel.pk}/test/", HTTP_HX_REQUEST="true")
    assert b'data-test="failed"' in failed.content and b"ConnectError" in failed.content


def test_the_link_opens_the_approval_after_login_and_carries_no_authority(
    worker, cast, as_user, tmp_path
):
    receiver = http_receiver(tmp_path).start()
    try:
        services.create_channel(
            actor=system_actor("t"),
            data={
                "name": "h",
                "kind": "webhook",
                "url": f"http://127.0.0.1:{receiver.port}/h",
                "secret": KEY,
            },
        )
        run, _ = running_run(worker)
        resp = worker.post(
            f"/runs/{run['id']}/approvals",
            {"fencing_token": 1, "tool": "payments", "action": "charge", "args": {"amount": 5}},
        )
        approval_id = resp.json()["id"]
        from interventions.models import Job

        jobs.notify_approval(Job.objects.get(kind=jobs.FAN_OUT).target_id)
        jobs.send_notification(Job.objects.get(kind=jobs.NOTIFY).target_id)
        import json

        link = json.loads(receiver.received()[0]["body"])["link"]
    finally:
        receiver.stop()
    path = link.split("://", 1)[1].split("/", 1)[1]
    path = "/" + path.split("#", 1)[0]
    anonymous = Client().get(path)
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/accounts/login/")
    client = Client()
    after_login = client.post(anonymous["Location"], {"username": "april", "password": "pw-april"})
    assert after_login.status_code == 302 and after_login["Location"] == path
    page = client.get(path)
    assert page.status_code == 200 and approval_id.encode() in page.content
    # The exact approval is marked (and scrolled to by static/console/console.js).
    marked = f'id="approval-{approval_id}" class="linked-approval" data-linked-approval'
    assert marked.encode() in page.content
    assert b"?kind=approve&amp;approval_id=" + approval_id.encode() in page.content
    # The link carries no authority: a viewer sees the marked approval, no buttons, and is refused.
    viewer_page = _login("vera").get(path)
    assert marked.encode() in viewer_page.content
    assert b"?kind=approve&amp;approval_id=" not in viewer_page.content
    decision = {
        "kind": "approve",
        "reason": "from the link",
        "options": {"approval_id": approval_id},
    }
    assert as_user("vera").post(f"/runs/{run['id']}/interventions", decision).status_code == 403
    # Decided once; a second decision (another approver following the same link) is refused 409.
    assert as_user("april").post(f"/runs/{run['id']}/interventions", decision).status_code == 202
    assert as_user("ian").post(f"/runs/{run['id']}/interventions", decision).status_code == 409


def test_a_failing_channel_shows_on_the_run_page(worker, cast):
    channel = services.create_channel(
        actor=system_actor("t"),
        data={"name": "down", "kind": "webhook", "url": "http://127.0.0.1:9/h", "secret": KEY},
    )
    run, _ = running_run(worker)
    worker.post(
        f"/runs/{run['id']}/approvals",
        {"fencing_token": 1, "tool": "payments", "action": "charge", "args": {"amount": 5}},
    )
    from interventions.models import Job

    jobs.notify_approval(Job.objects.get(kind=jobs.FAN_OUT).target_id)
    for _ in range(5):
        jobs.send_notification(Job.objects.get(kind=jobs.NOTIFY).target_id)
    page = _login("ada").get(f"/runs/{run['id']}/")
    assert b'data-testid="notification-failing"' in page.content and b"ConnectError" in page.content
    channel_page = _login("ada").get(f"/channels/{channel.pk}/")
    assert b'data-health="failing"' in channel_page.content


@pytest.mark.django_db(transaction=True)
def test_the_failing_banner_is_pushed_live_to_an_open_run_page(worker, cast, monkeypatch):
    """The run page's socket (the real consumer, in-memory channel layer) gets the header with the
    banner when the fifth failure in a row makes the channel failing; no reload. Without
    jobs.announce_channel_health nothing is pushed and this test fails."""
    from asgiref.sync import async_to_sync
    from channels.db import database_sync_to_async
    from channels.testing import WebsocketCommunicator
    from django.test import override_settings

    from controlplane.asgi import application
    from core import live
    from notifications.models import Delivery

    services.create_channel(
        actor=system_actor("t"),
        data={"name": "down", "kind": "webhook", "url": "http://127.0.0.1:9/h", "secret": KEY},
    )
    run, _ = running_run(worker)
    worker.post(
        f"/runs/{run['id']}/approvals",
        {"fencing_token": 1, "tool": "payments", "action": "charge", "args": {"amount": 5}},
    )
    from interventions.models import Job

    jobs.notify_approval(Job.objects.get(kind=jobs.FAN_OUT).target_id)
    delivery = Delivery.objects.get()
    for _ in range(4):
        jobs.attempt(delivery.pk)  # four failures: not failing yet
    client = _login("otto")
    headers = [
        (b"origin", b"http://testserver"),
        (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()),
        (b"host", b"testserver"),
    ]
    assert live.flush()

    async def scenario():
        page = WebsocketCommunicator(application, f"/ws/runs/{run['id']}/", headers=headers)
        assert (await page.connect(timeout=5))[0]
        first = await page.receive_from(timeout=5)  # connect: everything
        assert 'id="run-header"' in first and "notification-failing" not in first
        await database_sync_to_async(jobs.attempt)(delivery.pk)  # the fifth
        pushed = await page.receive_from(timeout=5)
        assert (
            'data-testid="notification-failing"' in pushed and "Channel down is failing" in pushed
        )
        await page.disconnect()

    with override_settings(
        CHANNEL_LAYERS={"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    ):
        async_to_sync(scenario)()
