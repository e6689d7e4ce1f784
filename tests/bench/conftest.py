"""The tiny benchmark runs' scratch databases (tests/bench/test_suite.py, test_console.py).

Each benchmark creates its database if it is missing and migrates it (bench/harness.py): from a
fresh PostgreSQL that is a whole migration per benchmark. Here a missing scratch database is instead
cloned (``CREATE DATABASE … TEMPLATE``, about a second) from one template migrated once per session,
so the benchmark finds it migrated and its own ``migrate`` has nothing to do. A scratch database that
exists is left as it is, as before: the benchmark reuses it (and migrates it forward)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _url_for(suffix: str) -> str | None:
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        return None
    parts = urlsplit(url)
    name = os.environ.get("TEST_DATABASE_NAME") or f"test_{parts.path.lstrip('/')}"
    return urlunsplit(parts._replace(path=f"/{name}_{suffix}"))


def _admin(url: str):
    """An autocommit connection to the server's ``postgres`` database (CREATE/DROP DATABASE)."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    params = {k: v for k, v in conninfo_to_dict(url).items() if k != "dbname"}
    return psycopg.connect(dbname="postgres", autocommit=True, **params)


def _exists(conn, name: str) -> bool:
    return (
        conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is not None
    )


@pytest.fixture(scope="session")
def bench_database() -> Iterator[Callable[[str], str | None]]:
    """``bench_database(suffix)``: the URL of the scratch database ``<test database>_<suffix>``,
    migrated (cloned from the session's template when it was missing); None off PostgreSQL."""
    from psycopg import sql

    template: list[str] = []

    def make(suffix: str) -> str | None:
        url = _url_for(suffix)
        if url is None:
            return None
        name = urlsplit(url).path.lstrip("/")
        with _admin(url) as conn:
            if _exists(conn, name):
                return url
            if not template:
                tpl_url = _url_for("benchtemplate")
                assert tpl_url is not None
                tpl = urlsplit(tpl_url).path.lstrip("/")
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(tpl))
                )
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(tpl)))
                template.append(tpl)
                migrated = subprocess.run(
                    [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
                    cwd=ROOT,
                    env={**os.environ, "DATABASE_URL": tpl_url, "DEBUG": "0"},
                    capture_output=True,
                    text=True,
                )
                assert migrated.returncode == 0, migrated.stdout[-3000:] + migrated.stderr[-3000:]
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(template[0])
                )
            )
        return url

    yield make
    if template:
        with _admin(_url_for("benchtemplate") or "") as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(template[0])
                )
            )
