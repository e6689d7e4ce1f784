"""Every console URL, read from console/urls.py, fetched and posted by payments' operator on
support's objects: the same answer as for an id nobody ever used, and lists that never mention
support. The run-page and fleet sockets refuse another team's run or operation as absent."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.test import override_settings
from django.urls import resolve

from console.urls import urlpatterns
from tests.console.test_live_list import IN_MEMORY_LAYER

from .conftest import Teams, made_up

pytestmark = pytest.mark.django_db

WALKED = {
    "run_id",
    "intervention_id",
    "effect_id",
    "operation_id",
    "prefix",
    "freeze_id",
    "hold_id",
}
NOT_TEAM_OWNED = {  # parameters of pages that show nothing a team owns (docs/operator/teams.md)
    "channel_id": "notification channels: admin-only configuration",
}


def pages() -> list[tuple[str, set[str]]]:
    return [(str(p.pattern), set(p.pattern.converters)) for p in urlpatterns]


def url(route: str, ids: dict[str, str]) -> str:
    for name, value in ids.items():
        for conv in ("uuid", "str"):
            route = route.replace(f"<{conv}:{name}>", value)
    return "/" + route


def test_every_page_parameter_is_walked_or_named():
    params = set().union(*(p for _, p in pages()))
    assert params <= WALKED | set(NOT_TEAM_OWNED), params


# sam: a security responder of payments, who may restore standing freezes (not cross_team).
@pytest.mark.parametrize("who", ["pia", "sam"])
def test_another_teams_pages_answer_exactly_as_made_up_ones(two_teams: Teams, who):
    pia = two_teams.browser(who)
    support = two_teams.support | {"prefix": two_teams.support["run_id"][:8]}
    fake = made_up() | {"prefix": made_up()["run_id"][:8]}
    secret = {v for k, v in two_teams.support.items() if k.endswith("_id")}
    differ, walked = [], 0
    for route, params in pages():
        if params & set(NOT_TEAM_OWNED) or not params:
            continue
        walked += 1
        # Both ids reach the same view (a 404 from the URL resolver -- an id the route's converter
        # does not take, or a parameter left unfilled -- would pass for a hidden object's 404 and
        # differ from the made-up id's 405 on a method the view refuses).
        assert resolve(url(route, support)).func is resolve(url(route, fake)).func, route
        for method in ("get", "post"):
            real = getattr(pia, method)(url(route, support), HTTP_HX_REQUEST="true")
            none = getattr(pia, method)(url(route, fake), HTTP_HX_REQUEST="true")
            if real.status_code != none.status_code:
                differ.append((method, url(route, support), real.status_code, none.status_code))
            text = real.content.decode(errors="replace")
            assert not {i for i in secret if i in text and i not in url(route, support)}, route
    assert walked >= 12 and differ == [], differ


@pytest.mark.parametrize("who", ["pia", "sam"])
def test_lists_pages_never_mention_the_other_team(two_teams: Teams, who):
    pia = two_teams.browser(who)
    # sam reads the whole log (audit_read_all) of payments' runs and objects (docs/operator/teams.md).
    pages = (
        "/",
        "/fleet/",
        "/audit/",
        "/audit/export.jsonl",
        "/approvals/",
        "/workers/",
        "/intake/",
    )
    for page in pages:
        answer = pia.get(page)
        body = answer.streaming_content if answer.streaming else [answer.content]
        text = b"".join(body).decode()
        assert "sup-agent" not in text, page
        assert not [v for v in two_teams.support.values() if len(v) > 8 and v in text], page
    mine = pia.get("/").content.decode()
    assert two_teams.payments["run_id"] in mine


@pytest.mark.django_db(transaction=True)
@override_settings(CHANNEL_LAYERS=IN_MEMORY_LAYER)
def test_the_run_and_fleet_sockets_refuse_another_teams_as_absent(two_teams: Teams):
    from controlplane.asgi import application
    from tests.console.test_live_list import headers_of

    pia, sol = headers_of(None, "pia"), headers_of(None, "sol")
    run, op = two_teams.support["run_id"], two_teams.support["operation_id"]

    async def opens(path: str, headers) -> tuple[bool, int | None]:
        sock = WebsocketCommunicator(application, path, headers=headers)
        connected, code = await sock.connect(timeout=5)
        if connected:
            await sock.disconnect()
        return connected, code

    async def scenario():
        assert (await opens(f"/ws/runs/{run}/", sol))[0]  # its own team's person: open
        assert (await opens(f"/ws/fleet/{op}/", sol))[0]
        hidden = await opens(f"/ws/runs/{run}/", pia)
        absent = await opens(f"/ws/runs/{made_up()['run_id']}/", pia)
        assert hidden == absent and not hidden[0]
        hidden = await opens(f"/ws/fleet/{op}/", pia)
        absent = await opens(f"/ws/fleet/{made_up()['operation_id']}/", pia)
        assert hidden == absent and not hidden[0]

    async_to_sync(scenario)()


def test_list_sockets_of_two_teams_never_share_a_render():
    from types import SimpleNamespace

    from console.list_live import View, view_key
    from runs.search import RunFilter

    view = View(query="", flt=RunFilter(), after="", before="")
    user = SimpleNamespace(pk=1)
    roles = frozenset({"operator"})
    assert view_key(view, user, roles, frozenset({1})) != view_key(
        view, user, roles, frozenset({2})
    )


def test_the_team_switcher_counts_per_team_and_narrows_the_list(two_teams: Teams):
    from .conftest import person

    person("mia", "operator", "payments")
    from runs.services import teams as team_service

    from .conftest import SYSTEM

    team_service.add_member(actor=SYSTEM, team="support", username="mia")
    pia, mia, ian = (two_teams.browser(n) for n in ("pia", "mia", "ian"))
    assert b'data-testid="team-switcher"' not in pia.get("/").content  # one team: no switcher
    page = mia.get("/").content.decode()
    assert 'data-testid="team-switcher"' in page
    assert "payments (2)" in page and "support (2)" in page and "all (4)" in page
    narrowed = mia.get("/?team=support").content.decode()
    assert two_teams.support["run_id"] in narrowed
    assert two_teams.payments["run_id"] not in narrowed
    assert 'data-testid="row-team" title="team">· support' in narrowed
    every = ian.get("/").content.decode()  # cross_team: every team, the default one too
    assert "default (0)" in every and "support (2)" in every
    assert pia.get("/?team=support").status_code == 200
    assert two_teams.support["run_id"] not in pia.get("/?team=support").content.decode()
    run_page = mia.get(f"/runs/{two_teams.support['run_id']}/").content.decode()
    assert 'data-testid="run-team" title="team">team support' in run_page


def test_the_state_counts_count_ones_own_teams_runs(two_teams: Teams):
    from django.contrib.auth.models import User

    from core.auth import actor_for_user
    from runs.search import RunFilter, state_counts

    pia = actor_for_user(User.objects.get(username="pia"))
    ian = actor_for_user(User.objects.get(username="ian"))
    assert state_counts(pia, RunFilter()).total == 2  # the database's tally, by team
    assert state_counts(pia, RunFilter(q="walk")).total == 0
    assert state_counts(ian, RunFilter()).total == 4
