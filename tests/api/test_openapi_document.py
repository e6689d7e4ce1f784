"""The OpenAPI document says what comes back: a typed schema for every operation and status, and the
SDK's models read nothing the document does not promise, with types the document allows."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Union

import pytest
from django.test import Client

from controlplane_sdk import models as sdk

pytestmark = pytest.mark.django_db

# Every operation answers these, whatever it does (api.responses.ERRORS_READ).
ALWAYS = {"401", "403", "404", "422"}


@pytest.fixture(scope="module")
def document(django_db_blocker) -> dict:
    with django_db_blocker.unblock():
        resp = Client().get("/api/v1/openapi.json")
    assert resp.status_code == 200
    return resp.json()


def _operations(document: dict):
    for path, item in document["paths"].items():
        for method, operation in item.items():
            yield f"{method.upper()} {path}", operation


def resolve(document: dict, schema: dict) -> dict:
    while "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        schema = document["components"]["schemas"][name]
    return schema


def _json_schema(operation: dict, status: str) -> dict:
    return operation["responses"][status]["content"]["application/json"]["schema"]


def test_the_document_lists_every_operation(document):
    assert len(list(_operations(document))) >= 21


def test_every_operation_has_a_typed_schema_for_its_success_and_every_error_status(document):
    untyped = []
    for label, operation in _operations(document):
        statuses = set(operation["responses"])
        assert ALWAYS <= statuses, (label, statuses)
        success = [s for s in statuses if s.startswith("2")]
        assert success, label
        for status in statuses:
            schema = resolve(document, _json_schema(operation, status))
            # A bare dict documents nothing: an object with named properties, each typed.
            props = schema.get("properties") or {}
            if schema.get("type") != "object" or not props:
                untyped.append(f"{label} {status}: {schema}")
            if not status.startswith("2"):
                assert {"error", "detail", "field"} <= set(props), (label, status, props)
    assert not untyped, "\n".join(untyped)


def test_success_schemas_are_named_models_not_inline_dicts(document):
    for label, operation in _operations(document):
        for status in (s for s in operation["responses"] if s.startswith("2")):
            assert "$ref" in _json_schema(operation, status), label


# --- the SDK against the document -----------------------------------------------------------------

# SDK model -> (response schema, {sdk field: wire field}, fields the SDK fills itself)
SDK_MODELS: dict[type, tuple[str, dict[str, str], set[str]]] = {
    sdk.Claim: ("ClaimOut", {}, {"raw"}),
    sdk.Attempt: ("AttemptRefOut", {}, set()),
    sdk.Lease: ("LeaseOut", {}, set()),
    sdk.Checkpoint: ("CheckpointOut", {}, set()),
    sdk.HeartbeatReply: ("HeartbeatOut", {}, {"raw"}),
    # ``adopted`` is the SDK's own finding (it recovered a declaration whose answer was lost).
    sdk.EffectDecision: ("EffectOut", {}, {"raw", "adopted"}),
    # An approval as a heartbeat reports it; ``decided_by`` is read when a server sends it (none does
    # today: the SDK keeps it optional).
    sdk.Approval: ("HeartbeatApprovalOut", {"reason": "decision_reason"}, {"raw", "decided_by"}),
}
# (model, field) -> the model a nested response schema must match
NESTED = {
    (sdk.Claim, "attempt"): sdk.Attempt,
    (sdk.Claim, "lease"): sdk.Lease,
    (sdk.Claim, "checkpoint"): sdk.Checkpoint,
}
PY_TO_JSON = {
    str: {"string"},
    int: {"integer"},
    float: {"number", "integer"},
    bool: {"boolean"},
    dict: {"object"},
    list: {"array"},
    type(None): {"null"},
}


def _accepted(annotation: Any) -> set[str] | None:
    """JSON types a dataclass field accepts; None: anything (Any)."""
    if annotation is Any:
        return None
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        out: set[str] = set()
        for arg in typing.get_args(annotation):
            accepted = _accepted(arg)
            if accepted is None:
                return None
            out |= accepted
        return out
    if dataclasses.is_dataclass(annotation):
        return {"object"}
    base = origin or annotation
    if isinstance(base, type) and issubclass(base, str):
        return {"string"}  # StrEnum
    return PY_TO_JSON[base]


def _served(document: dict, schema: dict) -> set[str] | None:
    """JSON types a response property may have; None: anything."""
    if "anyOf" in schema:
        out: set[str] = set()
        for option in schema["anyOf"]:
            served = _served(document, option)
            if served is None:
                return None
            out |= served
        return out
    schema = resolve(document, schema)
    if "type" in schema:
        return {schema["type"]}
    return {"object"} if "properties" in schema else None


def _nested_ref(schema: dict) -> str | None:
    for option in schema.get("anyOf", [schema]):
        if "$ref" in option:
            return option["$ref"].rsplit("/", 1)[-1]
    return None


@pytest.mark.parametrize("model", list(SDK_MODELS), ids=lambda m: m.__name__)
def test_each_sdk_model_reads_fields_the_document_promises_with_compatible_types(document, model):
    check_model(document, model, SDK_MODELS[model][0])


def check_model(document: dict, model: type, schema_name: str) -> None:
    _, renamed, client_only = SDK_MODELS.get(model, (schema_name, {}, set()))
    schema = document["components"]["schemas"][schema_name]
    props = schema["properties"]
    hints = typing.get_type_hints(model)
    for field in dataclasses.fields(model):
        if field.name in client_only:
            continue
        wire = renamed.get(field.name, field.name)
        assert wire in props, f"{model.__name__}.{field.name}: {schema_name} has no {wire!r}"
        accepted, served = _accepted(hints[field.name]), _served(document, props[wire])
        if accepted is not None and served is not None:
            assert served <= accepted, (
                f"{model.__name__}.{field.name} accepts {accepted}; {schema_name}.{wire} may be {served}"
            )
        if (model, field.name) in NESTED:
            nested = _nested_ref(props[wire])
            assert nested, f"{schema_name}.{wire} is not a typed object"
            check_model(document, NESTED[(model, field.name)], nested)


def test_the_directive_and_effect_status_enums_name_values_the_server_uses():
    from runs.models import Effect
    from runs.states import State, directive_for

    assert {directive_for(state) for state in State} <= {d.value for d in sdk.Directive}
    assert {s.value for s in sdk.EffectStatus} <= set(Effect.STATUSES)


def test_the_outcome_documents_the_checkpoint_and_next_declaration_it_may_carry(document):
    """Fewer round trips are part of the contract: the request fields and what they answer."""
    operation = document["paths"]["/api/v1/effects/{effect_id}/outcome"]["post"]
    request = resolve(document, operation["requestBody"]["content"]["application/json"]["schema"])
    assert {"checkpoint", "next"} <= set(request["properties"])
    answer = resolve(document, _json_schema(operation, "200"))
    assert {"checkpoint", "next"} <= set(answer["properties"])
    refs = {
        name: {o.get("$ref", "").rsplit("/", 1)[-1] for o in answer["properties"][name]["anyOf"]}
        for name in ("checkpoint", "next")
    }
    assert {"CheckpointWrittenOut", "ErrorOut"} <= refs["checkpoint"]
    assert {"NextDeclarationOut", "NextDeclarationErrorOut"} <= refs["next"]
    assert "http_status" in document["components"]["schemas"]["NextDeclarationOut"]["properties"]
