"""The Grafana dashboard: generated without drift, every query reading only exported metrics.

The usage panels (quota, namespace usage, inventory, leader, the DCGM join) read metrics
the quota controller exports; until runtime/metricnames.py names them, their cases
here fail and say which names are missing. tests/e2e/test_dashboards.py evaluates the
same queries on a real Prometheus.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

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
            "draquota_certificate_expiration_timestamp_seconds", "DCGM_FI_DEV_GPU_UTIL", "draquota_cluster_quota",
            "draquota_cluster_quota_namespace"} <= read
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


# -- the DCGM join, by promtool on hand-made series (no GPU here) ------------------------------

GPU_UTIL_PANELS = {"namespace": "panel 'GPU utilisation per namespace' A",
                   "claim": "panel 'GPU utilisation per claim' A"}


def _series(name: str, value: float, **labels: str) -> dict[str, str]:
    body = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{body}}}", "values": f"{value}x5"}


def _info(ns: str, claim: str, pod: str, uuid: str, profile: str = "") -> dict[str, str]:
    # As webhook/usagemetrics.py labels it (an empty GPU_I_PROFILE is no label at all in Prometheus).
    labels = dict(namespace=ns, claim=claim, pod=pod, driver="gpu.nvidia.com", pool="n1", device=f"d-{claim}",
                  UUID=uuid, instance="dra-quota-0")
    return _series("draquota_claim_device_info", 1, **(labels | ({"GPU_I_PROFILE": profile} if profile else {})))


def _dcgm(uuid: str, util: float, profile: str = "") -> dict[str, str]:
    # dcgm-exporter's labels; its pod mapping's namespace is some other pod's (overwritten by the join).
    labels = dict(gpu="0", UUID=uuid, device="nvidia0", modelName="NVIDIA A100-SXM4-80GB", Hostname="n1",
                  namespace="gpu-operator", instance="dcgm-0")
    return _series("DCGM_FI_DEV_GPU_UTIL", util, **(labels | ({"GPU_I_PROFILE": profile, "GPU_I_ID": "1"}
                                                             if profile else {})))


def test_the_dcgm_join_attributes_each_gpu_to_its_one_holder(tmp_path: Path) -> None:
    """GPU-A: claim a1; GPU-B: shared by b1 and b2 of two namespaces (left out); GPU-C: claim c1
    used by two pods; GPU-D: two MIG profiles held by d1 and d2; GPU-E: nobody's."""
    series = [
        _info("ns1", "a1", "pa", "GPU-A"), _dcgm("GPU-A", 10),
        _info("ns1", "b1", "pb1", "GPU-B"), _info("ns2", "b2", "pb2", "GPU-B"), _dcgm("GPU-B", 99),
        _info("ns1", "c1", "pc1", "GPU-C"), _info("ns1", "c1", "pc2", "GPU-C"), _dcgm("GPU-C", 30),
        _info("ns2", "d1", "pd1", "GPU-D", "1g.10gb"), _dcgm("GPU-D", 40, "1g.10gb"),
        _info("ns2", "d2", "pd2", "GPU-D", "3g.40gb"), _dcgm("GPU-D", 60, "3g.40gb"),
        _dcgm("GPU-E", 77),
    ]
    exprs = {q.where: q.expr.replace("$namespace", ".*") for q in QUERIES}
    cases = [
        {"expr": exprs[GPU_UTIL_PANELS["claim"]], "eval_time": "2m", "exp_samples": [
            {"labels": f'{{namespace="{ns}",claim="{c}"}}', "value": v}
            for ns, c, v in (("ns1", "a1", 10), ("ns1", "c1", 30), ("ns2", "d1", 40), ("ns2", "d2", 60))]},
        {"expr": exprs[GPU_UTIL_PANELS["namespace"]], "eval_time": "2m", "exp_samples": [
            {"labels": '{namespace="ns1"}', "value": 20}, {"labels": '{namespace="ns2"}', "value": 50}]},
    ]
    promtool_test(tmp_path, series, cases)


def promtool_test(tmp_path: Path, series: list[dict[str, str]], cases: list[dict[str, Any]]) -> None:
    """`promtool test rules` of `cases` (promql_expr_test) over `series`."""
    test_file = tmp_path / "queries.test.yaml"
    test_file.write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": "1m", "tests": [
        {"interval": "1m", "input_series": series, "promql_expr_test": cases}]}))
    tool = shutil.which("promtool")
    if tool is None:
        pytest.fail("promtool is not installed: run .ci/prometheus.sh (Debian's 'prometheus' package)")
    result = subprocess.run([tool, "test", "rules", str(test_file)], capture_output=True, text=True, check=False,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


# -- the team view, by promtool on hand-made series ---------------------------------------------

def _team(name: str, value: float, instance: str, **labels: str) -> dict[str, str]:
    return _series(name, value, **labels, instance=instance)


def test_the_team_view_adds_up_each_team_and_its_namespaces(tmp_path: Path) -> None:
    """Team ml: 100 memory hard, namespace a 30 used + 10 reserved, b 50 used; team cv: no
    memory limit, namespace c 20 used. Two replicas export the same series (a handover):
    the max reductions count each once."""
    series = []
    for instance in ("r1", "r2"):
        series += [_team("draquota_cluster_quota", v, instance, quota=q, resource="memory", type=t)
                   for q, t, v in (("ml", "hard", 100), ("ml", "used", 80), ("ml", "reserved", 10),
                                   ("cv", "used", 20), ("cv", "reserved", 0))]
        series += [_team("draquota_cluster_quota_namespace", v, instance, quota=q, namespace=ns, resource="memory",
                         type=t)
                   for q, ns, t, v in (("ml", "a", "used", 30), ("ml", "a", "reserved", 10), ("ml", "b", "used", 50),
                                       ("ml", "b", "reserved", 0), ("cv", "c", "used", 20), ("cv", "c", "reserved", 0))]
    exprs = {q.where: q.expr.replace("$quota", ".*") for q in QUERIES}
    breakdown = "panel 'Team breakdown per namespace'"
    teams = "panel 'ClusterDeviceQuotas: hard, used, reserved, headroom'"
    cases = [
        {"expr": exprs["panel 'Team utilisation: (used + reserved) / hard' A"], "eval_time": "2m", "exp_samples": [
            {"labels": '{quota="ml",resource="memory"}', "value": 0.9}]},
        {"expr": exprs[f"{teams} D"], "eval_time": "2m", "exp_samples": [  # memory headroom
            {"labels": '{quota="ml"}', "value": 10}]},
        {"expr": exprs[f"{breakdown} A"], "eval_time": "2m", "exp_samples": [  # memory used
            {"labels": f'{{quota="{q}",namespace="{ns}"}}', "value": v}
            for q, ns, v in (("ml", "a", 30), ("ml", "b", 50), ("cv", "c", 20))]},
        {"expr": exprs[f"{breakdown} C"], "eval_time": "2m", "exp_samples": [  # memory share of the team's hard
            {"labels": '{quota="ml",namespace="a"}', "value": 0.4},
            {"labels": '{quota="ml",namespace="b"}', "value": 0.5}]},
        {"expr": exprs["panel 'Team memory per namespace' A"], "eval_time": "2m", "exp_samples": [
            {"labels": f'{{quota="{q}",namespace="{ns}",type="{t}"}}', "value": v}
            for q, ns, t, v in (("ml", "a", "used", 30), ("ml", "a", "reserved", 10), ("ml", "b", "used", 50),
                                ("ml", "b", "reserved", 0), ("cv", "c", "used", 20), ("cv", "c", "reserved", 0))]},
    ]
    promtool_test(tmp_path, series, cases)
