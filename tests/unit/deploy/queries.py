"""Every PromQL query we ship, and the metric names each one reads.

Neighbours: deploy/grafana/dra-quota.json (panel targets and the `namespace` variable),
deploy/prometheus/dra-quota-rules.yaml (alert expressions, recording rules); test_dashboard.py and
test_alerts.py check their names against runtime/metricnames.py; tests/e2e/test_dashboards.py
evaluates them on a real Prometheus. Metric names are read with a small lexer (strings,
label matchers, groupings and ranges removed; what remains that is not a function call or
keyword is a metric), enough for the PromQL we write; `test_metric_names_are_read` pins it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

import runtime.metricnames

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deploy/grafana/dra-quota.json"
RULES = ROOT / "deploy/prometheus/dra-quota-rules.yaml"

# dcgm-exporter's default counters (NVIDIA/dcgm-exporter etc/default-counters.csv) the
# dashboard joins; not ours to export.
DCGM = frozenset({"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"})
_HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")
_LABEL_VALUES = re.compile(r"^label_values\((\w+),\s*(\w+)\)$")


@dataclass(frozen=True)
class Query:
    where: str  # "panel <title> <refId>", "variable <name>", "alert <name>"
    expr: str  # as shipped: may hold the dashboard's $variables


def dashboard_queries() -> list[Query]:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = []
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            # label_values(m, l) is Grafana's, not PromQL: the series it reads are these.
            match = _LABEL_VALUES.match(variable["query"]["query"])
            assert match, variable["query"]
            queries.append(Query(f"variable {variable['name']}", f"count by ({match[2]}) ({match[1]})"))
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            queries.append(Query(f"panel {panel['title']!r} {target['refId']}", target["expr"]))
    return queries


def alert_rules() -> dict[str, str]:
    """alert name -> expression."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {rule["alert"]: rule["expr"] for group in groups for rule in group["rules"] if "alert" in rule}


def recording_rules() -> dict[str, str]:
    """recorded series name -> expression (the showback totals)."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {rule["record"]: rule["expr"] for group in groups for rule in group["rules"] if "record" in rule}


def alert_queries() -> list[Query]:
    return [Query(f"alert {name}", expr) for name, expr in alert_rules().items()]


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_RANGE = re.compile(r"\[[^\]]*\]")
_IDENT = re.compile(r"(?<![\w.])[a-zA-Z_:][a-zA-Z0-9_:]*")
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
                       "group_left", "group_right", "inf", "nan"})


def metric_names(expr: str) -> set[str]:
    text = _RANGE.sub("", _GROUPING.sub("", _MATCHERS.sub("", _STRING.sub('""', expr))))
    names = set()
    for match in _IDENT.finditer(text):
        rest = text[match.end():].lstrip()
        if match[0].lower() in _KEYWORDS or rest.startswith("("):
            continue  # a keyword or a function call
        names.add(match[0])
    return names


def exported() -> set[str]:
    """The names `dra-quota serve` exposes: runtime.metricnames' name constants (histograms'
    series included), whatever they are called there; and the series our rules record."""
    names = {value for value in vars(runtime.metricnames).values()
             if isinstance(value, str) and value.startswith("draquota_")}
    return names | {f"{name}{suffix}" for name in names for suffix in _HISTOGRAM_SERIES} | set(recording_rules())


def unknown(expr: str) -> set[str]:
    """The names `expr` reads that neither dra-quota nor dcgm-exporter's defaults export."""
    return metric_names(expr) - exported() - DCGM
