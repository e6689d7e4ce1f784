"""The contract registry: every registered kind carries every piece of its contract, declared in one
module (docs/concepts/adding-a-contract.md). A kind missing its permission row, its spec, its card,
its receipt or its entry on the contracts page fails here, by name."""

from __future__ import annotations

import importlib
import pkgutil
import typing

import pytest
from django.test import Client
from django.utils.html import escape

import interventions
from core.roles import PERMISSIONS, ROLES
from interventions.contracts import contracts_document
from interventions.plugins import FLEET_REGISTRY, REGISTRY, Contract, FleetContract

KINDS = sorted(REGISTRY)


def test_it_registers_every_contract_a_module_declares_and_nothing_else():
    declared: dict[str, str] = {}
    for info in pkgutil.walk_packages(interventions.__path__, "interventions."):
        if ".migrations" in info.name:
            continue
        for contract in getattr(importlib.import_module(info.name), "CONTRACTS", ()):
            assert contract.kind not in declared, f"{contract.kind} declared twice"
            declared[contract.kind] = info.name
    assert set(declared) == set(REGISTRY)
    assert len(KINDS) >= 16  # the sixteen contracts of docs/concepts/adding-a-contract.md, at least


def test_it_keeps_the_contracts_in_their_declared_order():
    orders = [c.order for c in REGISTRY.values()]
    assert orders == sorted(orders) and len(set(orders)) == len(orders)


@pytest.mark.parametrize("kind", KINDS)
def test_it_gives_every_kind_a_permission_row(kind):
    contract = REGISTRY[kind]
    assert contract.may_issue, f"{kind}: nobody may issue it"
    assert contract.may_issue <= set(ROLES), kind
    assert PERMISSIONS[kind] == contract.may_issue, f"{kind}: core.roles does not hold its row"
    assert "viewer" not in contract.may_issue, f"{kind}: a viewer never intervenes"
    assert contract.guard_right in PERMISSIONS, f"{kind}: its guard override is no known right"


@pytest.mark.parametrize("kind", KINDS)
def test_it_gives_every_kind_a_spec(kind):
    spec = REGISTRY[kind].spec
    assert spec.summary and spec.cascade and spec.authority, kind
    assert spec.stops or spec.continues, f"{kind}: says neither what stops nor what continues"
    published = contracts_document()["contracts"][kind]
    assert published["summary"] == spec.summary and published["may_issue"] == sorted(
        REGISTRY[kind].may_issue
    )


@pytest.mark.parametrize("kind", KINDS)
def test_it_gives_every_kind_a_card_and_a_receipt(kind):
    pieces = REGISTRY[kind].console
    for name, builder in (("card", pieces.card), ("receipt", pieces.receipt)):
        answers = builder({})  # a preview or receipt that recorded nothing still draws its lines
        assert answers, f"{kind}: its {name} draws no answer line"
        for line in answers:
            assert line["key"] and line["label"], f"{kind}: an unlabelled {name} line"
    assert isinstance(pieces.blocking({}), list) and isinstance(pieces.more({}), list)


@pytest.mark.parametrize("kind", KINDS)
def test_it_types_every_kinds_preview_and_receipt(kind):
    """A preview and a receipt are typed (a TypedDict beside the contract's apply), so mypy holds
    every key the console and the API read to what the contract writes."""
    contract = REGISTRY[kind]
    for fn in (contract.preview, contract.apply):
        returned = typing.get_type_hints(fn).get("return")
        assert typing.is_typeddict(returned), f"{kind}: {fn.__qualname__} returns {returned!r}"


@pytest.mark.parametrize("kind", KINDS)
def test_it_declares_each_kind_in_one_module(kind):
    """The contract, its preview, its apply and its console pieces live in the same module."""
    contract: Contract = REGISTRY[kind]
    home = contract.preview.__module__
    pieces = contract.console
    parts = [
        contract.apply,
        pieces.card,
        pieces.receipt,
        pieces.blocking,
        pieces.more,
        pieces.offered,
    ]
    parts = [fn for fn in parts if fn.__module__ != "interventions.plugins"]  # the no-op defaults
    assert all(fn.__module__ == home for fn in parts), (kind, [fn.__module__ for fn in parts])
    assert contract in importlib.import_module(home).CONTRACTS


@pytest.mark.django_db
def test_it_gives_every_kind_an_entry_on_the_contracts_page(cast):
    client = Client()
    client.force_login(cast["vera"][0])
    html = client.get("/contracts/").content.decode()
    for kind in KINDS:
        assert f'id="contract-{kind}"' in html, f"{kind}: not on the contracts page"
        assert escape(REGISTRY[kind].spec.summary) in html, kind


# --- contracts over a scope of the fleet (FleetContract): intake hold/release, standing freeze/restore

FLEET_KINDS = sorted(FLEET_REGISTRY)


def test_it_registers_every_fleet_contract_a_module_declares_and_nothing_else():
    declared: dict[str, str] = {}
    for info in pkgutil.walk_packages(interventions.__path__, "interventions."):
        if ".migrations" in info.name:
            continue
        for contract in getattr(importlib.import_module(info.name), "FLEET_CONTRACTS", ()):
            assert contract.kind not in declared and contract.kind not in REGISTRY, contract.kind
            declared[contract.kind] = info.name
    assert set(declared) == set(FLEET_REGISTRY)
    assert {"hold_intake", "release_intake", "standing_freeze", "standing_restore"} <= set(declared)
    orders = [c.order for c in FLEET_REGISTRY.values()]
    assert orders == sorted(orders) and len(set(orders)) == len(orders)


@pytest.mark.parametrize("kind", FLEET_KINDS)
def test_it_gives_every_fleet_kind_a_permission_row_a_spec_and_its_pieces_in_one_module(kind):
    contract: FleetContract = FLEET_REGISTRY[kind]
    assert contract.may_issue and contract.may_issue <= set(ROLES), kind
    assert PERMISSIONS[kind] == contract.may_issue, f"{kind}: core.roles does not hold its row"
    assert "viewer" not in contract.may_issue and "operator" not in contract.may_issue, kind
    spec = contract.spec
    assert spec.summary and spec.cascade and spec.authority, kind
    assert spec.stops or spec.continues, kind
    home = importlib.import_module(contract.preview.__module__)
    assert contract.issue.__module__ == home.__name__, kind
    assert contract in home.FLEET_CONTRACTS, kind
    assert contract.audit and contract.receipt and contract.console.startswith("/"), kind
    published = contracts_document()["fleet_contracts"][kind]
    assert published["may_issue"] == sorted(contract.may_issue)
    assert published["audit"] == contract.audit and published["receipt"] == list(contract.receipt)


@pytest.mark.parametrize("kind", FLEET_KINDS)
def test_it_gives_every_fleet_kind_a_preview_and_a_decision_in_the_api(kind):
    """Its endpoints are routes the API serves, preview first (the OpenAPI document lists them)."""
    from api.app import api

    paths = api.get_openapi_schema()["paths"]
    endpoints = FLEET_REGISTRY[kind].endpoints
    assert len(endpoints) == 2 and endpoints[0].endswith("/preview"), kind
    for endpoint in endpoints:
        method, path = endpoint.split(" ", 1)
        assert path in paths and method.lower() in paths[path], f"{kind}: {endpoint} not served"


@pytest.mark.django_db
def test_it_gives_every_fleet_kind_an_entry_on_the_contracts_page(cast):
    client = Client()
    client.force_login(cast["ian"][0])
    html = client.get("/contracts/").content.decode()
    for kind in FLEET_KINDS:
        contract = FLEET_REGISTRY[kind]
        start = html.index(f'id="contract-{kind}"')
        entry = html[start : html.index("</section>", start)]
        assert escape(contract.spec.summary) in entry, kind
        assert contract.audit in entry and escape(contract.endpoints[1]) in entry, kind
        assert all(f"<code>{key}</code>" in entry for key in contract.receipt), kind
        page = client.get(contract.console.split("#")[0])
        assert page.status_code == 200, f"{kind}: its console page {contract.console} is not served"


@pytest.mark.django_db
def test_the_contracts_document_serves_every_fleet_kinds_pieces(as_user):
    served = as_user("vera").get("/contracts").json()
    for kind in FLEET_KINDS:
        contract = FLEET_REGISTRY[kind]
        entry = served["fleet_contracts"][kind]
        assert (entry["audit"], entry["endpoints"], entry["console"]) == (
            contract.audit,
            list(contract.endpoints),
            contract.console,
        ), kind
        assert served["permissions"][kind] == sorted(contract.may_issue), kind


@pytest.mark.django_db
def test_every_fleet_kinds_decision_records_the_receipt_and_the_audit_event_it_declares(
    agent, cast
):
    """Issued for real: each decision's receipt holds the keys its contract declares, and its audit
    event is the declared action."""
    from audit.models import AuditEvent
    from core.auth import actor_for_user
    from interventions.fleet.freezes import restore_freeze, set_freeze
    from interventions.intake import hold_intake, release_intake

    ian = actor_for_user(cast["ian"][0])
    hold = hold_intake(actor=ian, scope="agent", target="purchasing", reason="incident")
    held = dict(hold.receipt)
    released = release_intake(actor=ian, hold_id=hold.pk, reason="stable").receipt["release"]
    freeze, frozen = set_freeze(
        actor=ian, capability="payments:charge", over="everything", reason="processor flapping"
    )
    _, restored = restore_freeze(actor=ian, freeze_id=freeze.pk, reason="stable")
    receipts = {
        "hold_intake": held,
        "release_intake": released,
        "standing_freeze": frozen,
        "standing_restore": restored,
    }
    assert set(receipts) == set(FLEET_KINDS)
    for kind, receipt in receipts.items():
        contract = FLEET_REGISTRY[kind]
        assert set(contract.receipt) <= set(receipt), (kind, set(contract.receipt) - set(receipt))
        assert AuditEvent.objects.filter(action=contract.audit, outcome="allowed").count() == 1
