"""One redaction policy (core.redaction) on every surface a person reads: a card number and secrets
planted in every place a worker can write -- effect args (top level and nested, under cardNumber,
Card_Number, pan, api_key), compensation args, outcome details, run input, checkpoint state, event
data and log text, approval args, the finish error -- never show raw on any API answer, console
page, dialog, receipt or export, nor in a log line. The ledger keeps what the worker sent."""

from __future__ import annotations

import logging

import pytest
from django.test import Client

from core.redaction import luhn_valid, redact, redact_text
from runs.models import Effect, Run
from tests.conftest import claim, declare, start_run
from tests.interventions.helpers import intervene

pytestmark = pytest.mark.django_db

CARD = "4111111111111111"  # Luhn-valid
CARD_SPACED = "5555 5555 5555 4444"
SECRET = "sk_live_4eC39HqLyjWDarjtT1zdp7dc"
PLAIN_SECRET = "hunter2-but-longer"  # no known format: only its key gives it away
RAW = [CARD, "5555555555554444", CARD_SPACED, SECRET, PLAIN_SECRET]


def planted() -> dict:
    return {
        "cardNumber": CARD,
        "Card_Number": CARD_SPACED,
        "pan": CARD,
        "api_key": PLAIN_SECRET,
        "payment": {"card-number": CARD, "note": f"paid with {CARD}"},
        "memo": f"token {SECRET} used",
    }


def assert_clean(label: str, body: bytes) -> None:
    text = body.decode("utf-8", "replace")
    for raw in RAW:
        assert raw not in text, (
            f"{label} shows {raw!r}: ...{text[max(0, text.find(raw) - 200) :][:400]}"
        )


@pytest.fixture
def exposed(worker, cast):
    """A run with the secrets in every place a worker writes, paused with an open approval."""
    run = start_run(worker, input=planted(), goal=f"buy for card {CARD}")
    token = claim(worker, run["id"])["lease"]["fencing_token"]
    effect = declare(
        worker,
        run["id"],
        token,
        key="k-1",
        args={"amount": 10, **planted()},
        compensation={"tool": "payments", "action": "refund", "args": planted()},
    ).json()
    out = worker.post(
        f"/effects/{effect['id']}/outcome",
        {
            "fencing_token": token,
            "status": "committed",
            "detail": planted(),
            "checkpoint": {"step": "charge", "state": planted()},
        },
    )
    assert out.status_code == 200, out.content
    worker.post(
        f"/runs/{run['id']}/checkpoints", {"fencing_token": token, "step": "s2", "state": planted()}
    )
    ev = worker.post(
        f"/runs/{run['id']}/events",
        {
            "fencing_token": token,
            "events": [
                {"kind": "log", "data": {"text": f"charged {CARD} with api_key={PLAIN_SECRET}"}},
                {"kind": "assumption", "data": {"key": "card", "value": planted()}},
            ],
        },
    )
    assert ev.status_code == 201, ev.content
    appr = worker.post(
        f"/runs/{run['id']}/approvals",
        {"fencing_token": token, "tool": "payments", "action": "refund", "args": planted()},
    )
    assert appr.status_code == 201, appr.content
    return run, effect


def test_no_api_answer_to_a_person_shows_a_card_or_a_secret(exposed, as_user):
    run, effect = exposed
    rid = run["id"]
    otto = as_user("ian")
    answers = {
        "run": otto.get(f"/runs/{rid}"),
        "runs": otto.get("/runs"),
        "effects": otto.get(f"/runs/{rid}/effects"),
        "history": otto.get(f"/runs/{rid}/history"),
        "audit": otto.get("/audit", run_id=rid),
        "interventions": otto.get(f"/runs/{rid}/interventions"),
        "pause preview": otto.post(f"/runs/{rid}/interventions/preview", {"kind": "pause"}),
        "compensate preview": otto.post(
            f"/runs/{rid}/interventions/preview", {"kind": "compensate"}
        ),
    }
    pause = intervene(otto, rid, "pause", reason=f"card {CARD} leaked")
    answers["pause receipt"] = pause
    answers["receipt"] = otto.get(f"/interventions/{pause.json()['id']}")
    for label, resp in answers.items():
        assert resp.status_code < 500, (label, resp.content[:300])
        assert_clean(label, resp.content)
        # The masks changed the body's length: the declared one must follow (tests/core/test_response_framing.py).
        assert int(resp["Content-Length"]) == len(resp.content), label
    (shown,) = answers["effects"].json()["effects"]
    assert shown["args"]["cardNumber"] == "••••1111" and shown["args"]["api_key"] == "••••"
    # The ledger keeps what the worker sent; the worker reads it back as declared.
    assert Effect.objects.get(pk=effect["id"]).args["cardNumber"] == CARD


def test_no_console_page_dialog_or_export_shows_a_card_or_a_secret(exposed, cast):
    run, effect = exposed
    rid = run["id"]
    ian = Client()
    assert ian.login(username="ian", password="pw-ian")
    pages = {
        "run page": ian.get(f"/runs/{rid}/"),
        "run list": ian.get("/"),
        "pause dialog": ian.get(
            f"/runs/{rid}/interventions/new/", {"kind": "pause"}, HTTP_HX_REQUEST="true"
        ),
        "compensate dialog": ian.get(
            f"/runs/{rid}/interventions/new/", {"kind": "compensate"}, HTTP_HX_REQUEST="true"
        ),
        "approvals": ian.get("/approvals/"),
        "audit": ian.get("/audit/"),
        "reconcile": ian.get(f"/effects/{effect['id']}/reconcile/", HTTP_HX_REQUEST="true"),
    }
    for label, resp in pages.items():
        assert resp.status_code < 500, (label, resp.content[:300])
        assert_clean(label, resp.content)
    ada = Client()
    assert ada.login(username="ada", password="pw-ada")
    export = ada.get("/audit/export.jsonl")
    assert export.status_code == 200, export.content
    body = b"".join(export.streaming_content)
    assert body.count(b"\n") > 5, "the export holds the run's events"
    assert_clean("audit export", body)
    assert Run.objects.get(pk=rid).input["cardNumber"] == CARD  # stored as sent


def test_log_lines_are_masked(caplog):
    logger = logging.getLogger("controlplane.test")
    from core.redaction import RedactingFilter

    handler = logging.Handler()
    handler.addFilter(RedactingFilter())
    seen: list[str] = []
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        logger.warning("declared %s with api_key=%s", CARD, PLAIN_SECRET)
    finally:
        logger.removeHandler(handler)
    assert seen and CARD not in seen[0] and PLAIN_SECRET not in seen[0] and "••••1111" in seen[0]


def test_the_policy_is_case_and_separator_insensitive_and_detects_values(settings):
    doc = redact(
        {
            "CardNumber": CARD,
            "card_number": CARD,
            "CARD-NUMBER": CARD,
            "Pan": CARD,
            "API_KEY": "x" * 10,
            "apiKey": "x" * 10,
            "nested": [{"text": f"cc {CARD_SPACED} end"}],
            "amount": 4111111111111111,
            "epoch_ms": 1764633600000,  # 13 digits, not a card
            "order": "4111111111111112",  # not Luhn-valid: kept
        }
    )
    assert doc["CardNumber"] == doc["card_number"] == doc["CARD-NUMBER"] == doc["Pan"] == "••••1111"
    assert doc["API_KEY"] == doc["apiKey"] == "••••"
    assert doc["nested"][0]["text"] == "cc ••••4444 end" and doc["amount"] == "••••1111"
    assert doc["epoch_ms"] == 1764633600000 and doc["order"] == "4111111111111112"
    assert luhn_valid(CARD) and not luhn_valid("4111111111111112")
    for secret in [SECRET, "AKIAIOSFODNN7EXAMPLE", "ghp_" + "a" * 36, "Bearer " + "b" * 30]:
        assert secret not in redact_text(f"x {secret} y"), secret

    from core.redaction import reset_policy

    settings.REDACTION_KEYS = ["loyalty_id"]
    reset_policy()
    try:
        assert redact({"LoyaltyID": "abc-123-def"})["LoyaltyID"] == "••••"
    finally:
        reset_policy()


def test_decimal_numbers_are_not_cards():
    """A metrics scrape's float (``40.4111111111111111``: a Luhn-valid fraction) stays a number,
    while a card at the end of a sentence is still masked (CI once saw a /metrics gauge masked into
    ``40.••••0005``, which no Prometheus parser reads)."""
    assert luhn_valid("4111111111111111")
    line = "controlplane_job_oldest_age_seconds 40.4111111111111111"
    assert redact_text(line) == line
    assert redact_text("ratio 4111111111111111.25 of") == "ratio 4111111111111111.25 of"
    assert redact_text(f"paid with {CARD}.") == "paid with ••••1111."
    assert redact_text(f"paid with {CARD}, thanks") == "paid with ••••1111, thanks"
