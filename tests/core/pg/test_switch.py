"""One switch: nothing but core/pg/__init__.py asks which database it is on (migrations, which
describe the schema once, decide for themselves), and ``portable()`` turns every branch to its twin."""

from __future__ import annotations

import re
from pathlib import Path

from django.db import connection

from core import pg

ROOT = Path(__file__).resolve().parents[3]
APPS = ("controlplane", "console", "api", "interventions", "runs", "audit", "core", "demo", "world")
ASKS_VENDOR = re.compile(r"\.vendor\b")


def test_only_core_pg_asks_which_database_it_is_on():
    askers = [
        str(path.relative_to(ROOT))
        for app in APPS
        for path in (ROOT / app).rglob("*.py")
        if "migrations" not in path.parts
        and path != ROOT / "core" / "pg" / "__init__.py"
        and ASKS_VENDOR.search(path.read_text(encoding="utf-8"))
    ]
    assert askers == [], f"ask core.pg.enabled(connection) instead: {askers}"


def test_portable_turns_the_switch_off_and_back(db):
    on_postgres = connection.vendor == "postgresql"
    assert pg.enabled(connection) is on_postgres
    with pg.portable():
        assert pg.enabled(connection) is False
    assert pg.enabled(connection) is on_postgres
