"""The shipped monitoring of deploy/monitoring/: the alert rules pass ``promtool check rules`` and
their unit tests ``promtool test rules``; every alert has a test that fires it and one that does
not, and breaking an alert fails its tests; every metric the rules and the Grafana dashboard
name is one the code serves (a real manager's registry and the API's ``/metrics``); every
panel's query parses; every runbook points at a section of the docs."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from datetime import timedelta
from functools import cache
from pathlib import Path
from typing import Any, cast

import promql_parser
import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from periodic_manager.clock import VirtualClock
from periodic_manager.contracts import RunRecord
from periodic_manager.db.engine import create_engine
from periodic_manager.runtime.metrics import ManagerMetrics, ManagerView
from tests.conftest import _unavailable
from tests.project.test_docs import anchors
from tests.support import ROOT
from tests.support.api import T0, api_client
from tests.support.metrics_view import Config, Entry, View

MONITORING = ROOT / "deploy" / "monitoring"
RULES = yaml.safe_load((MONITORING / "alerts.yaml").read_text())
UNIT_TESTS = yaml.safe_load((MONITORING / "alerts.test.yaml").read_text())
DASHBOARD = json.loads((MONITORING / "grafana-dashboard.json").read_text())
ALERTS = {r["alert"]: r for g in RULES["groups"] for r in g["rules"] if "alert" in r}
PANEL_TARGETS = [(p["title"], t["expr"]) for p in DASHBOARD["panels"] for t in p["targets"]]


def promtool(*args: str, cwd: Path = MONITORING) -> subprocess.CompletedProcess[str]:
    if shutil.which("promtool") is None:
        _unavailable("promtool", FileNotFoundError("promtool (Debian package prometheus)"))
    return subprocess.run(
        ["promtool", *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (parsed by promql-parser; a syntax error raises)."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            assert node.name, f"a selector without a metric name in {expr!r}"
            found.add(node.name)
            return
        for attr in ("expr", "lhs", "rhs", "vector_selector", "param"):
            child = getattr(node, attr, None)
            if isinstance(child, promql_parser.Expr):
                walk(child)
        for arg in getattr(node, "args", None) or ():
            walk(arg)

    walk(promql_parser.parse(expr))
    return found


# -- the names the code serves ---------------------------------------------------------------------


def sample_names(text: str) -> set[str]:
    return {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}


@cache
def manager_samples() -> frozenset[str]:
    """Every sample name a real manager's registry serves once it has seen slots of each kind,
    a sync and a broker's loss."""
    one = {"1": Entry("1", Config("default", {"metrics": True}))}  # series of its own
    metrics = ManagerMetrics(cast(ManagerView, View(by_key=one)))
    slot = T0 - timedelta(seconds=2)
    metrics.observe_runs(
        [
            RunRecord("1", "reports.daily", slot, "enqueued", slot + timedelta(milliseconds=5)),
            RunRecord("1", "reports.daily", slot, "skipped", T0, reason="late"),
            RunRecord("1", "reports.daily", slot, "failed", T0, reason="target-down"),
        ]
    )
    metrics.broker_data_lost("redis")
    with metrics.time_sync():
        pass
    return frozenset(sample_names(generate_latest(metrics.registry).decode()))


@pytest.fixture
async def served(migrated_sqlite_url: str) -> set[str]:
    """The manager's sample names and those of the API's own ``/metrics``."""
    engine = create_engine(migrated_sqlite_url)
    try:
        async with api_client(migrated_sqlite_url, VirtualClock(T0), engine) as client:
            r = await client.get("/metrics")
            assert r.status_code == 200, r.text
            api = sample_names(r.text)
    finally:
        await engine.dispose()
    assert "periodic_manager_api_database_up" in api
    return set(manager_samples()) | api


# -- the alert rules ----------------------------------------------------------------------------


def test_promtool_checks_the_rules() -> None:
    checked = promtool("check", "rules", "alerts.yaml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in checked.stdout


def test_the_unit_tests_pass() -> None:
    tested = promtool("test", "rules", "alerts.test.yaml")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_there_are_the_alerts_the_operators_need() -> None:
    assert len(ALERTS) >= 8
    needed = {
        "periodic_manager_live_managers",
        "periodic_manager_partitions",
        "periodic_manager_enqueue_lateness_seconds_bucket",
        "periodic_manager_schedule_lateness_seconds_bucket",
        "periodic_manager_slots_total",
        "periodic_manager_target_down",
        "periodic_manager_broker_data_lost_total",
        "periodic_manager_api_database_up",
        "periodic_manager_clock_offset_seconds",
        "periodic_manager_last_sync_ok",
    }
    named = set().union(*(metric_names(r["expr"]) for r in ALERTS.values()))
    assert sorted(needed - named) == []


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_each_alert_is_documented_and_points_at_its_runbook(name: str) -> None:
    rule = ALERTS[name]
    notes = rule["annotations"]
    assert notes["summary"].strip() and notes["description"].strip()
    assert rule["labels"]["severity"] in ("warning", "critical")
    page, _, anchor = notes["runbook"].partition("#")
    assert (ROOT / page).is_file() and anchor in anchors(ROOT / page), notes["runbook"]
    assert f"`{name}`" in (ROOT / "docs" / "operations.md").read_text(), "not in operations.md"


@pytest.mark.parametrize("name", sorted(ALERTS))
def test_each_alert_has_a_test_that_fires_it_and_one_that_does_not(name: str) -> None:
    checks = [
        check
        for test in UNIT_TESTS["tests"]
        for check in test.get("alert_rule_test", ())
        if check["alertname"] == name
    ]
    assert any(check.get("exp_alerts") for check in checks), f"no test fires {name}"
    assert any(not check.get("exp_alerts") for check in checks), f"no test keeps {name} quiet"


@pytest.mark.parametrize(
    ("broken_expr", "expected"),
    [("vector(0) > 1", "[\n"), ("vector(1)", "[], \n")],
    ids=["never", "always"],
)
def test_breaking_the_alerts_fails_the_test_of_each(
    broken_expr: str, expected: str, tmp_path: Path
) -> None:
    """Every alert made never to fire fails a check that expects it to fire, and made always to
    fire fails a check that expects it quiet (``exp:[]``): the tests look at each rule
    (promtool names the alert and what it expected for each failed check)."""
    rules = yaml.safe_load((MONITORING / "alerts.yaml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule["expr"] = broken_expr
    (tmp_path / "alerts.yaml").write_text(yaml.safe_dump(rules))
    shutil.copy(MONITORING / "alerts.test.yaml", tmp_path)
    tested = promtool("test", "rules", "alerts.test.yaml", cwd=tmp_path)
    assert tested.returncode != 0
    checks = re.findall(r"alertname: (\w+), time: \S+, \n\s*exp:(\[\], \n|\[\n)", tested.stderr)
    failed = {name for name, exp in checks if exp == expected}
    assert sorted(set(ALERTS) - failed) == [], f"alerts whose tests pass as {broken_expr!r}"


async def test_every_metric_the_rules_name_is_served(served: set[str]) -> None:
    named = {m: a for a, rule in ALERTS.items() for m in metric_names(rule["expr"])}
    assert sorted(set(named) - served) == [], "metrics the code does not serve"


# -- the dashboard ------------------------------------------------------------------------------


def test_the_dashboard_has_its_panels() -> None:
    panels = DASHBOARD["panels"]
    assert len(panels) >= 6
    assert len({p["id"] for p in panels}) == len(panels)
    assert all(p["targets"] and p["title"] and "gridPos" in p for p in panels)
    queries = " ".join(expr for _, expr in PANEL_TARGETS)
    for shown in (
        "sum by (queue, le) (rate(periodic_manager_enqueue_lateness_seconds_bucket",
        "sum by (status) (rate(periodic_manager_slots_total",
        "periodic_manager_slots_by_reason_total",
        "topk(10, histogram_quantile(0.99, sum by (schedule, le)",
        "periodic_manager_live_managers",
        "periodic_manager_partitions",
        "periodic_manager_clock_offset_seconds",
    ):
        assert shown in queries, shown


@pytest.mark.parametrize(("title", "expr"), PANEL_TARGETS, ids=[e for _, e in PANEL_TARGETS])
def test_each_panel_query_parses(title: str, expr: str) -> None:
    assert metric_names(expr), f"{title}: {expr!r} selects no metric"


async def test_every_metric_the_dashboard_names_is_served(served: set[str]) -> None:
    named = set().union(*(metric_names(expr) for _, expr in PANEL_TARGETS))
    assert sorted(named - served) == [], "metrics the code does not serve"


def test_a_bad_query_is_refused_by_the_parser() -> None:
    """The parse above is a real check: a query with a syntax error raises."""
    with pytest.raises(ValueError, match=re.escape("unclosed left parenthesis")):
        metric_names("rate(periodic_manager_slots_total[5m]")
