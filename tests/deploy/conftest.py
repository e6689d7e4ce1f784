"""The deploy tests' real processes: every one a test starts is stopped when it ends."""

from __future__ import annotations

import pytest

from tests.live import Procs


@pytest.fixture
def procs(postgres_only, tmp_path):
    procs = Procs(tmp_path)
    try:
        yield procs
    finally:
        procs.stop()
