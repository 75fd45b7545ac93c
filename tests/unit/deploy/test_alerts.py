"""The alerts: promtool accepts them, its unit tests pass (each alert firing and silent),
and every expression reads only metrics the code exports. The PrometheusRule the chart
renders from them is tests/unit/test_chart.py's.

promtool comes from Debian's `prometheus` package, which .ci/prometheus.sh installs: these
tests fail (never skip) without it. The quota and leader alerts read the quota
controller's metrics and fail the name check until runtime/metricnames.py has them.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from ..test_docs import anchors
from .queries import ROOT, RULES, alert_rules, metric_names, recording_rules, unknown

PROMETHEUS = ROOT / "deploy/prometheus"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.fail("promtool is not installed: run .ci/prometheus.sh (Debian's 'prometheus' package)")
    return subprocess.run([tool, *args], capture_output=True, text=True, cwd=PROMETHEUS, check=False, timeout=120)


def test_promtool_accepts_the_rules() -> None:
    result = promtool("check", "rules", RULES.name)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules()) + len(recording_rules())} rules found" in result.stdout


def test_promtool_unit_tests_pass() -> None:
    result = promtool("test", "rules", "dra-quota-rules.test.yaml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_is_unit_tested_firing_and_silent() -> None:
    tests = yaml.safe_load((PROMETHEUS / "dra-quota-rules.test.yaml").read_text())["tests"]
    cases = [case for test in tests for case in test.get("alert_rule_test", [])]
    for name in alert_rules():
        outcomes = {bool(case["exp_alerts"]) for case in cases if case["alertname"] == name}
        assert outcomes == {True, False}, f"{name}: needs a firing and a silent case"


def test_every_alert_has_a_severity_and_says_what_happened() -> None:
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in (r for r in group["rules"] if "alert" in r):
            assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
            assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]


@pytest.mark.parametrize("name", list(alert_rules()))
def test_every_alert_reads_metrics_the_code_exports(name: str) -> None:
    expr = alert_rules()[name]
    assert metric_names(expr), expr
    assert unknown(expr) == set(), f"{name} reads metrics nobody exports: {expr}"


def test_every_alert_links_its_runbook_in_the_troubleshooting_page() -> None:
    """Each alert's runbook_url is docs/troubleshooting.md#<its name>, a heading that exists."""
    page = ROOT / "docs" / "troubleshooting.md"
    groups = yaml.safe_load(RULES.read_text())["groups"]
    links = {rule["alert"]: rule["annotations"].get("runbook_url", "") for g in groups for rule in g["rules"]
             if "alert" in rule}
    assert len(links) == len(alert_rules()) >= 10
    assert {a: u for a, u in links.items() if u != f"docs/troubleshooting.md#{a.lower()}"} == {}
    assert sorted(a for a in links if a.lower() not in anchors(page)) == []


@pytest.mark.parametrize("name", list(recording_rules()))
def test_every_recording_rule_reads_what_is_exported_or_recorded_before_it(name: str) -> None:
    rules = list(recording_rules())
    expr = recording_rules()[name]
    recorded_later = set(rules[rules.index(name):])
    assert metric_names(expr) and unknown(expr) == set(), f"{name} reads metrics nobody exports: {expr}"
    assert metric_names(expr) & recorded_later == set(), f"{name} reads a series recorded after it"


def test_every_showback_total_is_unit_tested_with_known_values() -> None:
    """Each hourly and daily total (and the idle ratio) has a promtool case with expected samples."""
    tests = yaml.safe_load((PROMETHEUS / "dra-quota-rules.test.yaml").read_text())["tests"]
    checked = {case["expr"] for test in tests for case in test.get("promql_expr_test", []) if case["exp_samples"]}
    totals = {n for n in recording_rules() if ":increase1" in n or n.endswith(":ratio")}
    # Each kind of total (per namespace, model, team; memory and devices; 1h and 1d) once at least.
    kinds = {(n.split(":")[0], n.split(":")[1]) for n in totals}
    assert {(n.split(":")[0], n.split(":")[1]) for n in checked & totals} == kinds
