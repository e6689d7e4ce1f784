"""The shipped alert rules and dashboard name only metrics /metrics exposes: a renamed or dropped
metric would otherwise leave an alert that can never fire (deploy/prometheus/, deploy/grafana/)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import claim, start_run

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy/prometheus/alerts.yml"
DASHBOARD = ROOT / "deploy/grafana/controlplane.json"
METRIC = re.compile(r"\b(controlplane_[a-z0-9_]+)")
# The on-call's signals the rules must cover (issue 22, item 6).
REQUIRED = {
    "RunsNeedAttention": "controlplane_runs",
    "UnknownOutcomesAging": "controlplane_effects_unknown_oldest_age_seconds",
    "FollowUpJobsFailing": "controlplane_intervention_jobs_failed",
    "LeasesExpiring": "controlplane_lease_expiries_total",
    "AuditAnchorsStale": "controlplane_audit_anchor_last_timestamp_seconds",
}


def exposed(client, worker) -> set[str]:
    claim(worker, start_run(worker)["id"])  # one protocol call, so the histogram has samples
    resp = client.get("/metrics")
    assert resp.status_code == 200
    names = set()
    for family in text_string_to_metric_families(resp.content.decode()):
        # a family is declared (HELP, TYPE) even before it has a sample: a histogram nobody has
        # observed yet still exposes its _bucket series from the first observation on
        suffixes = {"histogram": ("_bucket", "_count", "_sum"), "counter": ("_total",)}
        names |= {family.name, *(family.name + x for x in suffixes.get(family.type, ()))}
        names |= {s.name for s in family.samples}
    return names


def rule_exprs() -> dict[str, str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {r["alert"]: r["expr"] for g in groups for r in g["rules"]}


def test_every_metric_an_alert_rule_names_is_exposed(client, worker):
    names = exposed(client, worker)
    rules = rule_exprs()
    for alert, metric in REQUIRED.items():
        assert metric in METRIC.findall(rules[alert]), (alert, rules[alert])
    missing = {
        (alert, m) for alert, expr in rules.items() for m in METRIC.findall(expr) if m not in names
    }
    assert not missing, missing


def test_every_metric_the_dashboard_names_is_exposed(client, worker):
    names = exposed(client, worker)
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in METRIC.findall(e)}
    assert used - names == set()
    assert set(REQUIRED.values()) <= used
