"""The Grafana dashboard: generated without drift, every query reading only exported metrics.

The usage panels (quota, namespace usage, inventory, leader, the DCGM join) read metrics
the quota controller exports (issue 8); until webhook/metrics.py names them, their cases
here fail and say which names are missing. tests/e2e/test_dashboards.py evaluates the
same queries on a real Prometheus.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .queries import DASHBOARD, ROOT, Query, dashboard_queries, metric_names, unknown

QUERIES = dashboard_queries()


def test_the_committed_json_is_what_the_generator_renders() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "deploy/grafana/generate.py"), "--check"],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("query", QUERIES, ids=[q.where for q in QUERIES])
def test_every_query_reads_metrics_the_code_exports(query: Query) -> None:
    assert metric_names(query.expr), f"no metric found in {query.expr}"
    assert unknown(query.expr) == set(), f"{query.where} reads metrics nobody exports: {query.expr}"


def test_the_dashboard_covers_what_operators_ask_for() -> None:
    read = set().union(*(metric_names(q.expr) for q in QUERIES))
    assert {"draquota_quota", "draquota_namespace_device_usage", "draquota_admission_requests_total",
            "draquota_admission_duration_seconds_bucket", "draquota_claim_device_info", "draquota_leader",
            "draquota_certificate_expiration_timestamp_seconds", "DCGM_FI_DEV_GPU_UTIL"} <= read
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    # Every panel and target uses the datasource variable, so an import picks the Prometheus.
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]


@pytest.mark.parametrize(("expr", "names"), [
    ('sum by (reason) (rate(draquota_admission_requests_total{decision="denied"}[5m]))',
     {"draquota_admission_requests_total"}),
    ('histogram_quantile(0.99, sum by (webhook, le) (rate(x_bucket[$__rate_interval])))', {"x_bucket"}),
    ('a * on (UUID) group_left (namespace) label_replace(max by (namespace, uuid) (b{n=~"$namespace"}) '
     'and on (uuid) (count by (uuid) (c) == 1), "UUID", "$1", "uuid", "(.+)") * 1048576', {"a", "b", "c"}),
    ('max(draquota_leader) < 1 or absent(draquota_leader)', {"draquota_leader"}),
    ("min by (certificate) (y) - time() < 7 * 86400 unless z offset 5m", {"y", "z"}),
    ("1e3 * w", {"w"}),
])
def test_metric_names_are_read(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names
