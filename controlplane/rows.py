"""Equality lookups on the worker protocol's hot path, without Django's query compiler.

Every protocol call locks its run and reads a few rows by equality (the lease by fencing token, an
effect by idempotency key, the run's grants, the latest approval for an action). Compiling those
querysets cost more CPU than PostgreSQL spent answering them. ``select_rows`` builds the same
``SELECT * … WHERE a = %s AND b = %s [ORDER BY …] [LIMIT n] [FOR UPDATE]`` once per shape, caches the
text, prepares each value with its field's ``get_db_prep_value`` (what the ORM does: a UUID becomes
hex on SQLite, for instance) and returns model instances through ``Model.objects.raw``, so they
behave like any other instance (lazy relations, ``save``).

Only for equality filters on concrete columns; anything richer stays with the ORM.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, TypeVar

from django.core.exceptions import ValidationError
from django.db import connection, models

M = TypeVar("M", bound=models.Model)


@lru_cache(maxsize=256)
def _statement(model: type[models.Model], columns: tuple[str, ...], order_by: tuple[str, ...], limit: int | None,
               lock: bool, vendor: str) -> str:
    qn = connection.ops.quote_name
    meta = model._meta
    where = " AND ".join(f"{qn(meta.get_field(name).column)} = %s" for name in columns)
    sql = f"SELECT * FROM {qn(meta.db_table)} WHERE {where}"
    if order_by:
        sql += " ORDER BY " + ", ".join(
            f"{qn(meta.get_field(name.lstrip('-')).column)} {'DESC' if name.startswith('-') else 'ASC'}"
            for name in order_by)
    if limit is not None:
        sql += f" LIMIT {int(limit)}"
    if lock and vendor == "postgresql":  # SQLite has no FOR UPDATE: its writers are serialised anyway
        sql += " FOR UPDATE"
    return sql


def select_rows(model: type[M], *, order_by: tuple[str, ...] = (), limit: int | None = None, lock: bool = False,
                **equals: Any) -> list[M]:
    """``model.objects.filter(**equals).order_by(*order_by)[:limit]`` (``.select_for_update()`` with
    ``lock``), as cached hand-written SQL. Field names, not ``__`` lookups; ``pk`` means the primary key.
    A value its field cannot hold (a malformed UUID, say) matches no row, as it would in the database."""
    meta = model._meta
    names = tuple(meta.pk.name if name == "pk" else name for name in equals)
    params = []
    for name, value in zip(names, equals.values()):
        field = meta.get_field(name)
        target = field.target_field if field.is_relation else field
        if isinstance(value, models.Model):
            value = value.pk
        try:
            params.append(target.get_db_prep_value(value, connection))
        except (ValidationError, ValueError, TypeError):
            return []
    sql = _statement(model, names, tuple(order_by), limit, lock, connection.vendor)
    return list(model.objects.raw(sql, params))


def select_row(model: type[M], *, order_by: tuple[str, ...] = (), lock: bool = False, **equals: Any) -> M | None:
    """The first row of ``select_rows(…, limit=1)``, or None."""
    rows = select_rows(model, order_by=order_by, limit=1, lock=lock, **equals)
    return rows[0] if rows else None
