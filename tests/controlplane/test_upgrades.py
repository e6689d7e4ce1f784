"""The expand/contract rule (controlplane/upgrades.py, docs/operations/upgrades.md): the project's
migration graph passes it, and the operations that would break the previous release serving on the
new schema are refused unless their migration is a marked contract step of a shipped expand."""

from __future__ import annotations

import pytest
from django.db import migrations, models
from django.db.migrations.loader import MigrationLoader

from controlplane import upgrades

pytestmark = pytest.mark.django_db


@pytest.fixture
def before():
    loader = MigrationLoader(None, ignore_no_migrations=True)
    return loader.project_state(("runs", "0019_ledger_tally"))


def _migration(*operations, **marks) -> migrations.Migration:
    migration = migrations.Migration("0999_next", "runs")
    migration.operations = list(operations)
    for name, value in marks.items():
        setattr(migration, name, value)
    return migration


def test_the_project_migrations_pass_the_rule():
    assert [str(p) for p in upgrades.check()] == []


def test_every_shipped_migration_is_in_the_graph():
    """A renamed or squashed migration would silently drop out of the rule's reach."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    assert upgrades.SHIPPED - set(loader.graph.nodes) == set()


def test_it_checks_unshipped_migrations():
    """With nothing shipped, the shipped RunPython seeds need their review: the rule is live."""
    problems = upgrades.check(shipped=set())
    assert any(p.operation == "RunPython" and "upgrade_reviewed" in p.why for p in problems)


@pytest.mark.parametrize(
    "operation, why",
    [
        (migrations.RemoveField("run", "goal"), "drops a column"),
        (migrations.DeleteModel("runtally"), "drops a table"),
        (migrations.RenameField("run", "goal", "purpose"), "renames a column"),
        (migrations.RenameModel("run", "agentrun"), "renames a table"),
        (
            migrations.AddField("run", "team", models.CharField(max_length=40, default="x")),
            "NOT NULL column without db_default",
        ),
        (
            migrations.AlterField("run", "goal", models.CharField(max_length=10)),
            "changes the column type",
        ),
    ],
)
def test_it_refuses_a_contract_operation_outside_a_contract_step(before, operation, why):
    problems = upgrades.check_migration(_migration(operation), before)
    assert len(problems) == 1 and why in problems[0].why, problems


@pytest.mark.parametrize(
    "operation",
    [
        migrations.AddField("run", "team", models.CharField(max_length=40, null=True)),
        migrations.AddField("run", "team", models.CharField(max_length=40, db_default="none")),
        migrations.CreateModel("Note", [("id", models.BigAutoField(primary_key=True))]),
        migrations.AddIndex("run", models.Index(fields=["goal"], name="run_goal_plain")),
    ],
)
def test_it_lets_an_expand_operation_through(before, operation):
    assert upgrades.check_migration(_migration(operation), before) == []


def test_a_contract_step_passes_only_after_its_expand_shipped(before):
    drop = migrations.RemoveField("run", "goal")
    shipped = _migration(drop, contract_of=[("runs", "0019_ledger_tally")])
    assert upgrades.check_migration(shipped, before) == []
    unshipped = _migration(drop, contract_of=[("runs", "0020_not_released")])
    [problem] = upgrades.check_migration(unshipped, before)
    assert "runs.0020_not_released" in problem.why and "not shipped" in problem.why


def test_opaque_operations_need_a_stated_review(before):
    sql = migrations.RunSQL("SELECT 1", migrations.RunSQL.noop)
    [problem] = upgrades.check_migration(_migration(sql), before)
    assert problem.operation == "RunSQL" and "upgrade_reviewed" in problem.why
    reviewed = _migration(sql, upgrade_reviewed="reads only")
    assert upgrades.check_migration(reviewed, before) == []
