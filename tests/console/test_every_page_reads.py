"""Every console page and dialog reads as words (issue 18, items 7 and 8): for a seeded world with runs
in many states, each page and each dialog renders (no 5xx) and its visible text holds no raw dict, no
traceback, no epoch timestamp and no bare HTTP status; "needs attention" rows and the approvals inbox
say why; a filter finds recovered runs afterwards."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest
from django.test import Client

from interventions.jobs import _failed_attempt, max_attempts
from interventions.models import Intervention, Job
from interventions.plugins import REGISTRY
from interventions.reconcile import reconcile_run_effects
from runs.models import Effect, Run
from tests.conftest import claim, declare, place_run_in, start_run
from tests.interventions.helpers import commit, intervene

pytestmark = pytest.mark.django_db

RAW_DICT = re.compile(r"\{'|\{\"|'\w+': |\"\w+\": ")
EPOCH = re.compile(r"(?<![0-9a-f.])1[67]\d{8}(?:\.\d+)?(?![0-9a-f.])")
JARGON = re.compile(r"HTTP [45]\d\d|Traceback \(most recent call last\)|options\.\w+")


class Text(HTMLParser):
    """The text a person sees: no tags, attributes, scripts or styles."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self.skip = 0

    def handle_starttag(self, tag, attrs):
        self.skip += tag in ("script", "style")

    def handle_endtag(self, tag):
        self.skip -= tag in ("script", "style") and self.skip > 0

    def handle_data(self, data):
        if not self.skip:
            self.parts.append(data)


def visible(html: str) -> str:
    parser = Text()
    parser.feed(html)
    return " ".join(" ".join(parser.parts).split())


def assert_reads(path: str, resp) -> None:
    assert resp.status_code < 500, (path, resp.status_code)
    text = visible(resp.content.decode())
    for name, pattern in (("raw dict", RAW_DICT), ("epoch", EPOCH), ("jargon", JARGON)):
        found = pattern.search(text)
        assert not found, (
            f"{path}: {name} {found.group(0)!r} in …{text[max(found.start() - 150, 0) : found.end() + 150]}…"
        )


def browser(username: str) -> Client:
    client = Client()
    assert client.login(username=username, password=f"pw-{username}")
    return client


@pytest.fixture
def world(cast, worker, as_user, world_answers):
    """Runs in many states, each holding what an operator meets at 3 a.m."""
    otto, ada = as_user("otto"), as_user("ada")
    runs: dict[str, dict] = {}

    runs["running"] = start_run(worker, goal="running with a charge in flight")
    lease = claim(worker, runs["running"]["id"])["lease"]
    declare(worker, runs["running"]["id"], lease["fencing_token"], key="k-flight")

    runs["approval"] = start_run(worker, goal="waiting for an approval")
    token = claim(worker, runs["approval"]["id"])["lease"]["fencing_token"]
    asked = worker.post(
        f"/runs/{runs['approval']['id']}/approvals",
        {
            "fencing_token": token,
            "tool": "payments",
            "action": "charge",
            "args": {"amount": 5000, "card_number": "4242424242424242"},
            "reason": "over the limit",
        },
    )
    assert asked.status_code == 201, asked.content

    runs["reconciled"] = start_run(worker, goal="an unknown charge, reconciled")
    token = claim(worker, runs["reconciled"]["id"])["lease"]["fencing_token"]
    effect = declare(worker, runs["reconciled"]["id"], token, key="k-unknown").json()
    worker.post(f"/effects/{effect['id']}/outcome", {"fencing_token": token, "status": "unknown"})
    assert intervene(otto, runs["reconciled"]["id"], "reconcile", "ask").status_code == 202
    reconcile_run_effects(str(Intervention.objects.get(run_id=runs["reconciled"]["id"]).pk))

    runs["unknown"] = start_run(worker, goal="an unknown charge")
    token = claim(worker, runs["unknown"]["id"])["lease"]["fencing_token"]
    effect = declare(worker, runs["unknown"]["id"], token, key="k-unknown-2").json()
    worker.post(f"/effects/{effect['id']}/outcome", {"fencing_token": token, "status": "unknown"})

    runs["paused"] = start_run(worker, goal="paused after a commit")
    token = claim(worker, runs["paused"]["id"])["lease"]["fencing_token"]
    commit(worker, runs["paused"]["id"], token, "k-paid")
    assert intervene(otto, runs["paused"]["id"], "pause", "look").status_code == 202

    runs["job_failed"] = start_run(worker, goal="its revalidation gave up")
    token = claim(worker, runs["job_failed"]["id"])["lease"]["fencing_token"]
    assert intervene(otto, runs["job_failed"]["id"], "pause", "look").status_code == 202
    assert intervene(otto, runs["job_failed"]["id"], "resume", "go").status_code == 202
    job = Job.objects.get(run_id=runs["job_failed"]["id"], kind="revalidation")
    for _ in range(max_attempts()):
        _failed_attempt(job.pk, "WorldUnavailable: 503 from the world")

    runs["recovered"] = start_run(worker, goal="orphaned, then recovered")
    claim(worker, runs["recovered"]["id"])
    place_run_in(runs["recovered"]["id"], "orphaned")
    assert intervene(ada, runs["recovered"]["id"], "recover", "worker vanished").status_code == 202

    runs["orphaned"] = start_run(worker, goal="orphaned")
    claim(worker, runs["orphaned"]["id"])
    place_run_in(runs["orphaned"]["id"], "orphaned")

    for state in ("cancelled", "compensation_failed", "succeeded", "queued"):
        runs[state] = start_run(worker, goal=f"a {state} run")
        if state != "queued":
            place_run_in(runs[state]["id"], state)
    return runs


def test_every_page_and_dialog_reads_as_words(world):
    for username in ("ada", "otto", "vera"):
        client = browser(username)
        pages = [
            "/",
            "/?attention=1",
            "/?recovered=1",
            "/approvals/",
            "/audit/",
            "/contracts/",
            "/fleet/",
        ]
        for run in world.values():
            pages.append(f"/runs/{run['id']}/")
        for i in Intervention.objects.all():
            pages += [f"/receipts/{i.pk}/", f"/receipts/{i.pk}/now/"]
        for path in pages:
            assert_reads(path, client.get(path))
        for run in world.values():
            for kind in REGISTRY:
                path = f"/runs/{run['id']}/interventions/new/?kind={kind}"
                assert_reads(path, client.get(path, HTTP_HX_REQUEST="true"))
            path = f"/runs/{run['id']}/interventions/preview/"
            assert_reads(path, client.post(path, {"kind": "transfer"}, HTTP_HX_REQUEST="true"))
        for e in Effect.objects.all():
            path = f"/effects/{e.pk}/reconcile/"
            assert_reads(path, client.get(path, HTTP_HX_REQUEST="true"))


def test_the_sweep_catches_what_it_claims_to():
    class Resp:
        status_code = 200

        def __init__(self, body: str):
            self.content = body.encode()

    for bad in (
        "<p>{'amount': 5}</p>",
        "<p>at 1764651234.5</p>",
        "<p>HTTP 422 · invalid</p>",
        "<pre>Traceback (most recent call last)</pre>",
    ):
        with pytest.raises(AssertionError):
            assert_reads("/", Resp(bad))
    assert_reads("/", Resp('<p hx-vals=\'{"refresh": "1"}\'>fine at 23:14:05 UTC</p>'))


def reasons(html: str, run_id: str) -> list[str]:
    row = re.search(rf'<tr id="run-row-{run_id}".*?</tr>', html, re.S)
    assert row, html[:2000]
    return [visible(x) for x in re.findall(r"<li>(.*?)</li>", row.group(0), re.S)]


def test_needs_attention_rows_say_why(world):
    html = browser("otto").get("/?attention=1").content.decode()
    assert re.fullmatch(
        r"unknown outcome of payments:charge for \d+(\.\d)? s",
        reasons(html, world["unknown"]["id"])[0],
    ), reasons(html, world["unknown"]["id"])
    assert reasons(html, world["job_failed"]["id"])[0] == (
        f"job revalidation failed {max_attempts()}×: 503 from the world"
    )
    assert reasons(html, world["approval"]["id"])[0].startswith(
        "approval of payments:charge waiting"
    )
    assert reasons(html, world["orphaned"]["id"])[0].startswith("orphaned ")
    assert "the worker's lease ran out" in reasons(html, world["orphaned"]["id"])[0]


def test_the_inbox_shows_what_waits_on_others_and_who_may_decide(world):
    otto = browser("otto").get("/approvals/").content.decode()  # an operator decides nothing
    empty = visible(re.search(r'data-testid="inbox-empty".*?</td>', otto, re.S).group(0))
    assert empty.endswith(
        "Nothing waiting for you — 1 approval blocks runs waiting on other people, below."
    ), empty
    others = visible(re.search(r'data-testid="waiting-on-others".*?</table>', otto, re.S).group(0))
    assert "payments:charge" in others and "needs approver — currently: april, ian, ada" in others
    assert "blocks the run for" in others
    april = browser("april").get("/approvals/").content.decode()
    assert 'data-testid="inbox-empty"' not in april and "Approve…" in april
    assert 'data-testid="waiting"' in april  # her rows say how long the run has been held up


def test_a_filter_finds_recovered_runs(world):
    html = browser("otto").get("/?recovered=1").content.decode()
    shown = set(re.findall(r'<tr id="run-row-([0-9a-f-]+)"', html))
    assert shown == {world["recovered"]["id"]}
    assert 'name="recovered" value="1" checked' in html
    assert Run.objects.get(pk=world["recovered"]["id"]).state != "orphaned"
    bad = browser("otto").get("/?recovered=maybe")
    assert bad.status_code == 400 and b"recovered" in bad.content
