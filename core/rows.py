"""Equality lookups on the worker protocol's hot path, without Django's query compiler.

Every protocol call locks its run and reads a few rows by equality (the lease by fencing token, an
effect by idempotency key, the run's grants, the latest approval for an action). Compiling those
querysets cost more CPU than PostgreSQL spent answering them. ``select_rows`` builds the same
``SELECT <every column> … WHERE a = %s AND b = %s [ORDER BY …] [LIMIT n] [FOR UPDATE]`` once per shape, caches the
text, prepares each value with its field's ``get_db_prep_value`` (what the ORM does: a UUID becomes
hex on SQLite, for instance), applies the converters the ORM's compiler would apply to each column,
and builds instances with ``Model.from_db``, so they behave like any other instance (lazy relations,
``save``, ``refresh_from_db``).

Only for equality filters on concrete columns; anything richer stays with the ORM.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, TypeVar

from django.core.exceptions import FieldError, ValidationError
from django.db import connections, models, router
from django.db.models.fields.related import RelatedField

M = TypeVar("M", bound=models.Model)


def _column(field: models.Field | models.ForeignObjectRel) -> str:
    """The column a field is stored in; a reverse relation (or a field without a column) has none."""
    column = None if isinstance(field, models.ForeignObjectRel) else field.column
    if column is None:
        raise FieldError(f"{field} has no column: rows only compares concrete columns")
    return column


@lru_cache(maxsize=64)
def _shape(model: type[models.Model], alias: str) -> tuple[str, tuple[str, ...], tuple]:
    """The SELECT list (every concrete column, in ``from_db`` order), the attnames, and per column the
    converters the ORM's compiler would apply (backend's, then the column's: JSON decoding, SQLite's
    UUIDs and datetimes…). ``Model.objects.raw`` would work these out again on every query. Cached per
    alias, not per connection object: converters only read settings-level state (the time zone), and
    every thread's connection to an alias has the same."""
    conn = connections[alias]
    meta = model._meta
    qn = conn.ops.quote_name
    converters = []
    for field in meta.concrete_fields:
        col = field.get_col(meta.db_table)
        found = conn.ops.get_db_converters(col) + col.get_db_converters(conn)
        converters.append((tuple(found), col) if found else None)
    select = ", ".join(qn(_column(field)) for field in meta.concrete_fields)
    return select, tuple(field.attname for field in meta.concrete_fields), tuple(converters)


@lru_cache(maxsize=256)
def _statement(
    model: type[models.Model],
    columns: tuple[str, ...],
    order_by: tuple[str, ...],
    limit: int | None,
    lock: bool,
    alias: str,
) -> str:
    conn = connections[alias]
    qn = conn.ops.quote_name
    meta = model._meta
    where = " AND ".join(f"{qn(_column(meta.get_field(name)))} = %s" for name in columns)
    sql = f"SELECT {_shape(model, alias)[0]} FROM {qn(meta.db_table)} WHERE {where}"
    if order_by:
        sql += " ORDER BY " + ", ".join(
            f"{qn(_column(meta.get_field(name.lstrip('-'))))} {'DESC' if name.startswith('-') else 'ASC'}"
            for name in order_by
        )
    if limit is not None:
        sql += f" LIMIT {int(limit)}"
    if (
        lock and conn.features.has_select_for_update
    ):  # SQLite has none: its writers are serialised anyway
        sql += " FOR UPDATE"
    return sql


def select_rows[M: models.Model](
    model: type[M],
    *,
    order_by: tuple[str, ...] = (),
    limit: int | None = None,
    lock: bool = False,
    **equals: Any,
) -> list[M]:
    """``model.objects.filter(**equals).order_by(*order_by)[:limit]`` (``.select_for_update()`` with
    ``lock``), as cached hand-written SQL. Field names, not ``__`` lookups; ``pk`` means the primary key.
    A value its field cannot hold (a malformed UUID, say) matches no row, as it would in the database."""
    alias = router.db_for_write(model) if lock else router.db_for_read(model)
    conn = connections[alias]
    meta = model._meta
    names = tuple(meta.pk.name if name == "pk" else name for name in equals)
    params = []
    for name, value in zip(names, equals.values(), strict=False):
        field = meta.get_field(name)
        relation = (RelatedField, models.ForeignObjectRel)  # the fields whose is_relation is true
        target = field.target_field if isinstance(field, relation) else field
        if isinstance(value, models.Model):
            value = value.pk
        try:
            params.append(target.get_db_prep_value(value, conn))
        except (ValidationError, ValueError, TypeError):
            return []
    sql = _statement(model, names, tuple(order_by), limit, lock, alias)
    _, attnames, converters = _shape(model, alias)
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        fetched = cursor.fetchall()
    found = []
    for row in fetched:
        values = list(row)
        for i, conv in enumerate(converters):
            if conv is not None:
                funcs, col = conv
                for func in funcs:
                    values[i] = func(values[i], col, conn)
        found.append(model.from_db(alias, attnames, values))
    return found


def select_row[M: models.Model](
    model: type[M], *, order_by: tuple[str, ...] = (), lock: bool = False, **equals: Any
) -> M | None:
    """The first row of ``select_rows(…, limit=1)``, or None."""
    rows = select_rows(model, order_by=order_by, limit=1, lock=lock, **equals)
    return rows[0] if rows else None
