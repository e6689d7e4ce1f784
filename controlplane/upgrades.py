"""Expand/contract: the migration policy that lets two releases serve side by side during a deploy
(docs/operations/upgrades.md).

During a rolling deploy the new release migrates first and the previous release keeps serving on the
new schema until its last replica is replaced. So a migration may only *expand* (add what the old
code ignores) unless it is a *contract* step that removes or tightens something the previous release
already stopped using: its expand migration must have shipped in an earlier release, i.e. be in
``SHIPPED``. Opaque operations (SQL, Python, triggers, constraints) cannot be judged from their
shape; their migration says in ``upgrade_reviewed`` why the previous release survives them.

    class Migration(migrations.Migration):
        contract_of = [("runs", "0020_run_owner_team")]   # expand migrations shipped before
        upgrade_reviewed = "the trigger only refuses UPDATEs the previous release never sends"
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from django.db import connection
from django.db.migrations import operations as ops
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.migration import Migration
from django.db.migrations.state import ProjectState
from django.db.models import NOT_PROVIDED

APPS = ("audit", "runs", "interventions")
# The release the running fleet is on while this one deploys: tests/deploy/test_upgrade.py serves
# its code on this release's schema, and drives this release's server with its SDK.
PREVIOUS_RELEASE = "ebd1956"

# Every migration of the previous release (ebd1956, the last of session 26): they run on every
# database already, so the rule binds only what comes after. A release adds its own on shipping.
SHIPPED: frozenset[tuple[str, str]] = frozenset(
    [("audit", n) for n in ("0001_initial", "0002_append_only_triggers", "0003_audit_created_at_index",
                            "0004_per_chain_audit")]
    + [("interventions", n) for n in ("0001_initial", "0002_compensation_plans",
                                      "0003_compensation_step_key", "0004_outbox_jobs",
                                      "0005_fleet_operations", "0006_cascade_targets")]
    + [("runs", n) for n in (
        "0001_initial", "0003_seed_roles", "0004_ownership_and_versions",
        "0005_compensation_failed_state", "0006_append_only_and_state_triggers",
        "0006_approval_policies_discrepancy", "0007_checkpoint_append_only",
        "0007_needs_attention_state", "0008_merge_triggers_and_approval_policies",
        "0009_merge_outbox_needs_attention", "0010_state_triggers_with_needs_attention",
        "0011_run_list_indexes", "0012_capability_freeze", "0013_run_goal_trigram",
        "0014_run_tally", "0015_run_index_and_trigger_trim", "0016_intake_hold",
        "0017_redrive_state_edges", "0018_standing_capability_freeze", "0019_ledger_tally")]
)  # fmt: skip

# What the previous release's code cannot live with: it still reads, writes or names the thing.
CONTRACT = {
    ops.RemoveField: "drops a column the previous release still reads and writes",
    ops.DeleteModel: "drops a table the previous release still uses",
    ops.RenameField: "renames a column the previous release still names",
    ops.RenameModel: "renames a table the previous release still names",
    ops.AlterModelTable: "moves a table the previous release still names",
    ops.AlterUniqueTogether: "a new uniqueness may refuse the previous release's writes",
    ops.AlterOrderWithRespectTo: "adds or drops a column the previous release does not know",
}
# Safe for the previous release by their shape: new things it ignores, or looser rules.
EXPAND = (
    ops.CreateModel,
    ops.AddIndex,
    ops.RemoveIndex,
    ops.RenameIndex,
    ops.RemoveConstraint,
    ops.AlterModelOptions,
    ops.AlterModelManagers,
)


@dataclass(frozen=True)
class Problem:
    migration: tuple[str, str]
    operation: str
    why: str

    def __str__(self) -> str:
        return f"{self.migration[0]}.{self.migration[1]}: {self.operation} {self.why}"


def judge(operation: ops.base.Operation, app: str, before: ProjectState) -> tuple[str, str]:
    """("expand" | "contract" | "review", why) for one operation on the state before it."""
    if isinstance(operation, ops.SeparateDatabaseAndState):
        verdicts = [judge(o, app, before) for o in operation.database_operations]
        worst = [v for v in verdicts if v[0] != "expand"]
        return worst[0] if worst else ("expand", "")
    for kind, why in CONTRACT.items():
        if isinstance(operation, kind):
            return "contract", why
    if isinstance(operation, ops.AddField):
        field = operation.field
        if field.null or field.db_default is not NOT_PROVIDED or field.many_to_many:
            return "expand", ""
        return "contract", (
            "adds a NOT NULL column without db_default: the previous release's INSERTs omit it "
            "(a Python default is dropped after the migration)"
        )
    if isinstance(operation, ops.AlterField):
        return _altered(operation, app, before)
    if isinstance(operation, EXPAND):
        return "expand", ""
    return "review", "cannot be judged from its shape (SQL, code, trigger or constraint)"


def _altered(operation: ops.AlterField, app: str, before: ProjectState) -> tuple[str, str]:
    old = before.models[app, operation.model_name_lower].fields[operation.name]
    new = operation.field
    if old.null and not new.null and new.db_default is NOT_PROVIDED:
        return "contract", "makes a column NOT NULL: the previous release may write NULL"
    if old.db_column != new.db_column:
        return "contract", "renames a column the previous release still names"
    if old.is_relation or new.is_relation:  # unbound state fields: compare what they point at
        if str(old.related_model).lower() != str(new.related_model).lower():
            return "contract", "points a column at another table"
        return "expand", ""
    old_type, new_type = old.db_type(connection), new.db_type(connection)
    if old_type != new_type:
        return "contract", f"changes the column type {old_type} -> {new_type}"
    return "expand", ""


def check_migration(
    migration: Migration, before: ProjectState, shipped: Iterable[tuple[str, str]] = SHIPPED
) -> list[Problem]:
    """What in one unshipped migration would break the previous release serving on its schema."""
    shipped = set(shipped)
    key = (migration.app_label, migration.name)
    contract_of = list(getattr(migration, "contract_of", []) or [])
    reviewed = (getattr(migration, "upgrade_reviewed", "") or "").strip()
    problems = [
        Problem(key, "contract_of", f"names {a}.{n}, which has not shipped in an earlier release")
        for a, n in contract_of
        if (a, n) not in shipped
    ]
    state = before.clone()
    for operation in migration.operations:
        verdict, why = judge(operation, migration.app_label, state)
        name = type(operation).__name__
        if verdict == "contract" and not contract_of:
            problems.append(Problem(key, name, why + "; mark the migration contract_of=[...]"))
        elif verdict == "review" and not reviewed and not contract_of:
            problems.append(Problem(key, name, why + "; say why it is safe in upgrade_reviewed"))
        operation.state_forwards(migration.app_label, state)
    return problems


def check(shipped: Iterable[tuple[str, str]] = SHIPPED) -> list[Problem]:
    """Every unshipped migration of the project's apps against the expand/contract rule."""
    shipped = set(shipped)
    loader = MigrationLoader(None, ignore_no_migrations=True)
    problems: list[Problem] = []
    for key in loader.graph.leaf_nodes():
        for node in loader.graph.forwards_plan(key):
            if node[0] not in APPS or node in shipped:
                continue
            before = loader.project_state(node, at_end=False)
            problems += check_migration(loader.graph.nodes[node], before, shipped)
    return sorted(set(problems), key=str)
