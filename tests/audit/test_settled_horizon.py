"""Readers that page the audit trail by ``after_seq`` never skip an event whose seq was taken by a
transaction that commits after a later one (audit.selectors.settled_seq), on real PostgreSQL with two
connections: one holds its transaction open, the other commits, the reader reads, then the first
commits — and the reader, resuming from its cursor, still gets it."""

from __future__ import annotations

import io
import json
import threading
import uuid

import pytest
from django.db import connection, transaction

from audit import selectors
from audit.services import export_jsonl, record_audit
from core.actors import Actor
from tests.conftest import Api

pytestmark = [pytest.mark.django_db(transaction=True)]

WHO = Actor(kind="user", name="otto", component="api")


def _write(action: str, run_id=None) -> int:
    return record_audit(
        actor=WHO, action=action, object_type="run", object_id="x", run_id=run_id
    ).seq


class HeldOpen:
    """A second connection (its own thread) that appends an event and keeps its transaction open
    until ``commit()``."""

    def __init__(self, action: str) -> None:
        self.action, self.seq = action, None
        self._appended, self._release = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with transaction.atomic():
                self.seq = _write(self.action, run_id=uuid.uuid4())
                self._appended.set()
                assert self._release.wait(30)
        finally:
            connection.close()

    def __enter__(self) -> HeldOpen:
        self._thread.start()
        assert self._appended.wait(30)
        return self

    def commit(self) -> None:
        self._release.set()
        self._thread.join(30)

    def __exit__(self, *exc: object) -> None:
        self.commit()


def _api_page(api: Api, after: int) -> list[int]:
    resp = api.get("/audit", after_seq=after)
    assert resp.status_code == 200, resp.content
    return [e["seq"] for e in resp.json()["events"]]


@pytest.fixture
def api(as_user) -> Api:
    return as_user("sam")  # reads the whole log: these events belong to no run


@pytest.fixture
def quick_horizon(monkeypatch):
    # a held transaction keeps readers at their cursor for this long before they answer
    monkeypatch.setattr(
        selectors.settled_seq, "__kwdefaults__", {"wait_s": 0.2, "using": "default", "floor": 0}
    )


def test_an_api_poller_does_not_skip_an_event_that_commits_late(api, quick_horizon):
    cursor = _write("before")
    with HeldOpen("late") as late:
        early = _write("early")  # took its seq after the held one, committed first
        assert late.seq < early
        # the held transaction may still commit under its seq: nothing past the cursor is settled
        assert _api_page(api, cursor) == []
        late.commit()
    assert _api_page(api, cursor) == [late.seq, early]


def test_without_a_transaction_in_flight_the_newest_events_are_served_at_once():
    first, second = _write("a"), _write("b")
    assert selectors.settled_seq(floor=0, wait_s=0) >= second
    assert selectors.settled_seq(floor=first, wait_s=0) >= second


def test_the_horizon_waits_for_a_short_transaction_instead_of_serving_past_it():
    cursor = _write("before")
    late = HeldOpen("late")
    with late:
        early = _write("early")
        timer = threading.Timer(0.1, late.commit)
        timer.start()
        horizon = selectors.settled_seq(floor=cursor, wait_s=10)
        timer.join()
    assert horizon >= early and late.seq < early


def test_an_export_resumed_from_its_last_order_does_not_skip_a_late_event(quick_horizon):
    cursor = _write("before")
    with HeldOpen("late") as late:
        early = _write("early")
        out = io.StringIO()
        export_jsonl(out, since_seq=cursor)
        assert out.getvalue() == ""
    out = io.StringIO()
    export_jsonl(out, since_seq=cursor)
    assert [json.loads(line)["order"] for line in out.getvalue().splitlines()] == [late.seq, early]


def test_the_console_newer_page_cursor_does_not_pass_a_late_event(cast, quick_horizon):
    from django.test import Client

    browser = Client()
    browser.force_login(
        cast["sam"][0]
    )  # audited itself: before the cursor (sam reads run-less events)
    cursor = _write("before")
    with HeldOpen("late") as late:
        early = _write("early")
        page = browser.get("/audit/", {"after": cursor})
        assert page.status_code == 200
        assert [e["a"].seq for e in page.context["events"]] == []
    page = browser.get("/audit/", {"after": cursor})
    assert sorted(e["a"].seq for e in page.context["events"]) == [late.seq, early]
