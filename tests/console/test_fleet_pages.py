"""Console fleet pages: filter -> preview -> confirm -> live progress with waves, receipts and halt."""

from __future__ import annotations

import re

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import override_settings

from interventions.fleet.waves import run_fleet_wave
from interventions.models import FleetOperation
from tests.console.test_dialogs import browser
from tests.console.test_live_list import IN_MEMORY_LAYER, headers_of
from tests.interventions.helpers import running_run

pytestmark = pytest.mark.django_db


def _form(ids, **extra):
    return {"kind": "pause", "filter": "&".join(f"id={i}" for i in ids), "wave_size": "1", **extra}


def test_operator_previews_confirms_follows_and_halts(cast, worker):
    ids = [running_run(worker)[0]["id"] for _ in range(2)]
    otto = browser("otto")
    page = otto.get("/fleet/", {"state": "running"})
    assert page.status_code == 200
    assert b'value="state=running"' in page.content  # the run list's filter carried over
    preview = otto.post("/fleet/preview/", _form(ids), HTTP_HX_REQUEST="true")
    assert preview.status_code == 200, preview.content
    html = preview.content.decode()
    assert "Pause: 2 runs in 2 waves" in html and "Nothing in flight." in html
    digest = re.search(r'name="digest" value="([0-9a-f]+)"', html).group(1)
    started = otto.post(
        "/fleet/start/", _form(ids, digest=digest, reason="incident 9"), HTTP_HX_REQUEST="true"
    )
    op = FleetOperation.objects.get()
    assert started.headers["HX-Redirect"] == f"/fleet/{op.pk}/"
    run_fleet_wave(f"{op.pk}:1")
    progress = otto.get(f"/fleet/{op.pk}/", HTTP_HX_REQUEST="true")
    assert progress.status_code == 200
    text = progress.content.decode()
    assert "Wave 2 of 2: 1 done, 0 failed, 1 to go" in text
    # the polled fragment: polled only while the page's socket is not open (the fallback)
    assert "hx-trigger=\"every 1s [!document.querySelector('#fleet-live.ws-open')]\"" in text
    assert "<html" not in text
    assert str(op.targets.get(position=0).intervention_id) in text  # the run's receipt, linked
    # each push redraws the section: a half-typed halt reason must survive it (htmx keeps an
    # hx-preserve element with the same id as it is)
    assert re.search(r'<input id="fleet-halt-reason" name="reason"[^>]*hx-preserve="true"', text)
    halted = otto.post(f"/fleet/{op.pk}/halt/", {"reason": "enough"}, HTTP_HX_REQUEST="true")
    assert halted.status_code == 200
    assert "Halted: enough" in halted.content.decode()
    assert "every 1s" not in halted.content.decode()  # no more polling once over


def test_bad_input_and_refusals_are_shown_with_their_status(cast, worker):
    ids = [running_run(worker)[0]["id"]]
    otto = browser("otto")
    bad = otto.post("/fleet/preview/", _form(ids, wave_size="0"), HTTP_HX_REQUEST="true")
    assert bad.status_code == 422 and b"wave_size must be" in bad.content
    nope = otto.post("/fleet/preview/", _form(ids, kind="take_command"), HTTP_HX_REQUEST="true")
    assert nope.status_code == 403 and b"may not run a fleet take_command" in nope.content
    vera = browser("vera")
    assert b"New operation" not in vera.get("/fleet/").content
    refused = vera.post("/fleet/start/", _form(ids, reason="x"), HTTP_HX_REQUEST="true")
    assert refused.status_code == 403
    assert not FleetOperation.objects.exists()
    assert otto.get("/fleet/00000000-0000-0000-0000-000000000000/").status_code == 404


def test_a_held_operation_is_started_or_cancelled_from_its_page(cast, worker):
    from core.auth import actor_for_user
    from interventions.fleet.operations import FleetParams, start_fleet_operation

    ids = [running_run(worker)[0]["id"] for _ in range(2)]
    held = start_fleet_operation(
        actor=actor_for_user(cast["otto"][0]),
        kind="pause",
        run_filter="&".join(f"id={i}" for i in ids),
        reason="change window",
        params=FleetParams(),
        hold=True,
    )
    otto = browser("otto")
    page = otto.get(f"/fleet/{held.pk}/").content.decode()
    assert "Recorded, not started" in page and "Start now" in page
    assert re.search(r'<input id="fleet-cancel-reason" name="reason"[^>]*hx-preserve="true"', page)
    started = otto.post(f"/fleet/{held.pk}/confirm/", HTTP_HX_REQUEST="true")
    assert started.status_code == 200 and "Wave 1 of 1" in started.content.decode()
    again = otto.post(f"/fleet/{held.pk}/cancel/", {"reason": "no"}, HTTP_HX_REQUEST="true")
    assert again.status_code == 409 and "only a held one is cancelled" in again.content.decode()


@pytest.mark.django_db(transaction=True)
@override_settings(CHANNEL_LAYERS=IN_MEMORY_LAYER)
def test_the_progress_page_is_pushed_as_waves_are_decided(cast, worker):
    from controlplane.asgi import application
    from core import live
    from core.auth import actor_for_user
    from interventions.fleet.operations import (
        FleetParams,
        halt_fleet_operation,
        start_fleet_operation,
    )

    ids = [running_run(worker)[0]["id"] for _ in range(2)]
    otto = actor_for_user(cast["otto"][0])
    op = start_fleet_operation(
        actor=otto,
        kind="pause",
        run_filter="&".join(f"id={i}" for i in ids),
        reason="incident 9",
        params=FleetParams(wave_size=1, pause_s=60),
    )
    assert live.flush()
    headers = headers_of(cast, "vera")  # a viewer follows it: no Halt button for her

    async def scenario():
        sock = WebsocketCommunicator(application, f"/ws/fleet/{op.pk}/", headers=headers)
        assert (await sock.connect(timeout=5))[0]
        first = await sock.receive_from(timeout=5)
        assert '<section id="fleet-progress" class="panel" hx-swap-oob="true"' in first
        assert "Wave 1 of 2: 0 done" in first and "Halt" not in first
        await database_sync_to_async(run_fleet_wave)(f"{op.pk}:1")
        pushed = await sock.receive_from(timeout=5)  # no poll: the wave's commit pushed it
        assert "Wave 2 of 2: 1 done, 0 failed, 1 to go" in pushed
        await database_sync_to_async(halt_fleet_operation)(
            actor=otto, operation_id=op.pk, reason="enough"
        )
        assert "Halted: enough" in await sock.receive_from(timeout=5)
        await sock.disconnect()
        lost = WebsocketCommunicator(
            application, "/ws/fleet/00000000-0000-0000-0000-000000000000/", headers=headers
        )
        assert not (await lost.connect(timeout=5))[0]

    async_to_sync(scenario)()


def test_standing_freezes_on_the_fleet_page_are_role_checked_and_name_the_field(cast, worker):
    running_run(worker)
    otto, ian = browser("otto"), browser("ian")
    page = otto.get("/fleet/")
    assert b"Standing freezes" in page.content and b'id="freeze-form"' not in page.content
    body = {"capability": "payments:charge", "over": "agent", "agent": "purchasing"}
    refused = otto.post("/fleet/freezes/preview/", body, HTTP_HX_REQUEST="true")
    assert refused.status_code == 403 and b"may not set a standing freeze" in refused.content
    bad = ian.post("/fleet/freezes/preview/", {**body, "agent": "nobody"}, HTTP_HX_REQUEST="true")
    assert bad.status_code == 422 and b"no agent named" in bad.content
    shown = ian.post("/fleet/freezes/preview/", body, HTTP_HX_REQUEST="true")
    html = shown.content.decode()
    assert shown.status_code == 200 and 'data-testid="covers-now">1<' in html
    digest = re.search(r'name="digest" value="([0-9a-f]+)"', html).group(1)
    no_reason = ian.post("/fleet/freezes/", {**body, "digest": digest}, HTTP_HX_REQUEST="true")
    assert no_reason.status_code == 422 and b"a reason is required" in no_reason.content
    done = ian.post(
        "/fleet/freezes/", {**body, "digest": digest, "reason": "flapping"}, HTTP_HX_REQUEST="true"
    )
    assert done.status_code == 200 and b"Frozen: <code>payments:charge</code>" in done.content
    assert b'hx-swap-oob="true"' in done.content  # the list is refreshed with the receipt
