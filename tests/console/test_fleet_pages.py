"""Console fleet pages: filter -> preview -> confirm -> live progress with waves, receipts and halt."""

from __future__ import annotations

import re

import pytest

from interventions.fleet_waves import run_fleet_wave
from interventions.models import FleetOperation
from tests.console.test_dialogs import browser
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
    assert 'hx-trigger="every 1s"' in text and "<html" not in text  # the polled fragment
    assert str(op.targets.get(position=0).intervention_id) in text  # the run's receipt, linked
    halted = otto.post(f"/fleet/{op.pk}/halt/", {"reason": "enough"}, HTTP_HX_REQUEST="true")
    assert halted.status_code == 200
    assert "Halted: enough" in halted.content.decode()
    assert 'hx-trigger="every 1s"' not in halted.content.decode()  # no more polling once over


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
    from interventions.fleet import FleetParams, start_fleet_operation

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
    started = otto.post(f"/fleet/{held.pk}/confirm/", HTTP_HX_REQUEST="true")
    assert started.status_code == 200 and "Wave 1 of 1" in started.content.decode()
    again = otto.post(f"/fleet/{held.pk}/cancel/", {"reason": "no"}, HTTP_HX_REQUEST="true")
    assert again.status_code == 409 and "only a held one is cancelled" in again.content.decode()
