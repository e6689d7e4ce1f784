"""Fixtures the console tests share: the world's answers, as registered adapters would give them."""

from __future__ import annotations

import pytest

from interventions import registry
from interventions.registry import ReconcileResult


@pytest.fixture
def world_answers():
    """payments' reconciler says "committed", with the epoch times the demo world records."""
    registry.load_adapters()
    saved = dict(registry._reconcilers)
    registry.reconciler("payments")(
        lambda tool, action, key: ReconcileResult(
            "committed",
            external_ref="ch_1",
            evidence={"answer": "committed", "at": 1764651234.5, "created_at": 1764651230},
        )
    )
    yield
    registry._reconcilers.clear()
    registry._reconcilers.update(saved)
