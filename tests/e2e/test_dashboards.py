"""Every Grafana panel query and every alert expression, evaluated by a real Prometheus.

Prometheus (Debian's 2.42, tests/e2e/prometheus.py) scrapes a running `dra-quota serve`
(its --metrics-port) and a stand-in for dcgm-exporter, and loads the shipped rules file.
serve is scraped as the Prometheus Operator scrapes the chart's ServiceMonitor: over HTTPS
(its tlsConfig's server name, the test CA standing in for the serving Secret's ca.crt)
with a bearer token of a ServiceAccount bound to the chart's metrics-reader ClusterRole
(serve checks it with a TokenReview and a SubjectAccessReview), with its honorLabels and
the operator's target labels (namespace, pod, service, container of the replica), so
every per-namespace answer below also shows that honorLabels keeps our own `namespace`
(with honor_labels off, those panels and the quota alerts come up empty: checked once by
hand when this was written).
The scenario: a DeviceQuota of 160Gi, two pods whose template claims the real scheduler
allocates (two 80Gi GPUs), a claim denied for quota and one for an unknown class (pricing),
then a second DeviceQuota of 80Gi created below what is already allocated, and two
ClusterDeviceQuotas selecting the namespace (team quotas: one of 160Gi, full, one of
80Gi, over). Then, through /api/v1/query, with the dashboard's `$namespace` set to the
test's namespace and `$quota` to its two teams:
- every dashboard query (panels and the namespace variable) returns data, and the ones
  with known answers return them (denial reasons, the quotas' bytes, the GPU utilisation
  per claim and per namespace from the DCGM join, the leader);
- every alert rule is healthy in Prometheus' rule engine; DraQuotaNearLimit fires for the
  full quota and DraQuotaOverLimit for the one below its usage, and their team
  counterparts for the two teams; every other alert is silent while every metric it
  reads has series (so silence is not a missing metric).

No GPU exists here: the DCGM series come from a loopback target serving dcgm-exporter's
real metric and label names (DCGM_FI_DEV_GPU_UTIL / DCGM_FI_DEV_FB_USED{gpu, UUID, device,
modelName, Hostname, ...}) for the UUIDs the fake driver publishes; the values are the
test's. What is proven is the join, not the exporter.

The quota, namespace-usage, inventory, leader and DCGM-join checks read the quota
controller's usage metrics; each failure names the metrics runtime/metricnames.py
does not name yet.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import pytest_asyncio

from ..unit.deploy.queries import RULES, alert_rules, dashboard_queries, metric_names, recording_rules, unknown
from .cluster import ControlPlane
from .driver import RESOURCE_V1, allocation_results, claim_spec, create_claim_template, create_pod, exact_request, \
    wait_pod_allocated
from .harness import DQ, Served, Setup, create, denial, make_quota, metered
from .kube import Kube, WaitTimeout, poll
from .prometheus import Gpu, Prometheus, Sample, as_the_operator_scrapes, chart_reader_token, dcgm_exporter

pytestmark = pytest.mark.e2e

GI = 1024**3
RATE_INTERVAL = "5m"  # $__rate_interval and $__range: the whole scenario, so rates and quantiles have samples
DEADLINE = 120.0  # seconds for every query to show what it must, after the scenario


@pytest_asyncio.fixture(loop_scope="session")
async def served(cluster: ControlPlane, crd: None, tmp_path: Path) -> AsyncIterator[Served]:
    async for handle in metered(cluster, tmp_path):
        yield handle


def values(result: list[Sample], *labels: str) -> dict[tuple[str, ...], float]:
    return {tuple(s["metric"].get(label, "") for label in labels): float(s["value"][1]) for s in result}


def close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(b))


async def test_every_dashboard_and_alert_query_against_prometheus(kube: Kube, setup: Setup, tmp_path: Path) -> None:
    ns, fleet, served = setup.namespace, setup.fleet, setup.served
    published = await kube.get(RESOURCE_V1, "resourceslices", fleet.slices[0])
    uuids = {d["name"]: d["attributes"]["uuid"]["string"] for d in published["spec"]["devices"]}
    # Every other GPU idle (under the showback rules' 5%), so the idle share is known.
    gpus = [Gpu(i, uuids[name], fleet.nodes[0], "NVIDIA A100-SXM4-80GB",
                utilisation=1.0 if i % 2 == 0 else 10.0 + 20 * i, memory_used_mib=1000.0 * (i + 1))
            for i, name in enumerate(sorted(uuids))]
    by_uuid = {g.uuid: g for g in gpus}

    token = tmp_path / "prometheus-token"
    token.write_text(await chart_reader_token(kube, setup.served))
    async with dcgm_exporter(gpus) as dcgm:
        prometheus = Prometheus(tmp_path / "prometheus", {"dra-quota": f"127.0.0.1:{served.metrics_port}",
                                                          "dcgm-exporter": dcgm}, rule_files=(RULES,),
                                jobs={"dra-quota": as_the_operator_scrapes(token, served.cluster.ca_file)})
        try:
            with served.log_on_failure():
                await prometheus.start()
                claims = await scenario(kube, setup)
                failures = await check_everything(prometheus, ns, {c: [by_uuid[u] for u in us]
                                                                   for c, us in claims.items()})
        finally:
            await prometheus.stop()
            for team in teams(ns):
                await kube.delete(DQ, "clusterdevicequotas", team)
    assert not failures, "\n".join(failures) + f"\n--- prometheus log ---\n{prometheus.log_text()}"


async def scenario(kube: Kube, setup: Setup) -> dict[str, list[str]]:
    """Drive admissions, denials and allocations; returns each allocated claim's GPU UUIDs."""
    ns, fleet = setup.namespace, setup.fleet
    await make_quota(kube, setup, "gpus", "160Gi")
    await create_claim_template(kube, ns, "one-gpu", claim_spec(exact_request("gpu", fleet.device_class)))
    for pod in ("p1", "p2"):
        await create_pod(kube, ns, pod, template="one-gpu", node_selector=fleet.node_selector)
    slices = [await kube.get(RESOURCE_V1, "resourceslices", s) for s in fleet.slices]
    uuid_of = {(s["spec"]["pool"]["name"], d["name"]): d["attributes"]["uuid"]["string"]
               for s in slices for d in s["spec"]["devices"]}
    claims = {}
    for pod in ("p1", "p2"):
        _, claim = await wait_pod_allocated(kube, ns, pod)
        claims[claim["metadata"]["name"]] = [uuid_of[(r["pool"], r["device"])] for r in allocation_results(claim)]
    assert 'exceeded DeviceQuota "gpus"' in await denial(create(kube, setup, "over"))
    missing = {"kind": "ResourceClaim", "metadata": {"name": "no-class"},
               "spec": claim_spec(exact_request("gpu", f"missing-{uuid.uuid4().hex[:6]}"))}
    assert "not found" in await denial(kube.create(RESOURCE_V1, "resourceclaims", missing, namespace=ns))
    # Memory below what is already allocated (over its limit at once); devices 2 of 4 (quiet).
    await kube.create(DQ, "devicequotas", {"kind": "DeviceQuota", "metadata": {"name": "small"},
                                           "spec": {"hard": {"memory": "80Gi", "devices": 4}}}, namespace=ns)
    # The namespace joins two teams with its claims: one full (memory 160Gi, devices 2 of 4),
    # one over at once (memory 80Gi).
    full, small = teams(ns)
    for name, hard in ((full, {"memory": "160Gi", "devices": 4}), (small, {"memory": "80Gi"})):
        await kube.create(DQ, "clusterdevicequotas", {"kind": "ClusterDeviceQuota", "metadata": {"name": name},
                                                      "spec": {"hard": hard, "namespaceSelector": {"matchLabels": {
                                                          "kubernetes.io/metadata.name": ns}}}})
    return claims


def teams(ns: str) -> tuple[str, str]:
    """The scenario's two ClusterDeviceQuotas (cluster-scoped: named after the namespace)."""
    return f"{ns}-team", f"{ns}-small-team"


Check = Callable[[list[Sample]], bool]


def panel_checks(ns: str, claims: dict[str, list[Gpu]]) -> dict[str, Check]:
    """What the panels with a known answer must show (the others: any data)."""
    held = [g for gs in claims.values() for g in gs]
    full, small = teams(ns)
    return {
        "panel 'Denials by reason' A": lambda r: {"quota", "pricing"} <= {k[0] for k in values(r, "reason")},
        # The claim "over", denied by DeviceQuota gpus at its create; the pricing denial names no quota.
        "panel 'Quota denials by quota and reason' A": lambda r: {
            k for k in values(r, "namespace", "quota", "decision", "resource") if k[0] == ns} == {
                (ns, "gpus", "denied", "resourceclaims")},
        "panel 'Quota memory: used, reserved, hard' A":  # used
            lambda r: values(r, "namespace", "quota").get((ns, "gpus")) == 160 * GI,
        "panel 'Quota memory: used, reserved, hard' C":  # hard
            lambda r: {k: v for k, v in values(r, "namespace", "quota").items() if k[0] == ns} == {
                (ns, "gpus"): 160 * GI, (ns, "small"): 80 * GI},
        "panel 'Quota devices: used, reserved, hard' A":  # used
            lambda r: values(r, "namespace", "quota").get((ns, "small")) == 2,
        "panel 'Leader' A": lambda r: 1.0 in values(r, "instance").values(),
        # headroom: "gpus" full (160Gi used of 160Gi), "small" 80Gi below what is already used
        "panel 'DeviceQuotas: hard, used, reserved, headroom' D": lambda r: {
            k: v for k, v in values(r, "namespace", "quota").items() if k[0] == ns} == {
            (ns, "gpus"): 0, (ns, "small"): -80 * GI},
        "panel 'Devices held per namespace and GPU model' A": lambda r: values(r, "namespace", "model").get(
            (ns, held[0].model)) == len(held),
        "panel 'Pending claims per namespace' A": lambda r: values(r, "namespace").get((ns,)) == 0,
        "panel 'Denied claims per namespace' A": lambda r: (ns,) in values(r, "namespace"),
        "panel 'GPU utilisation per claim' A": lambda r: all(
            close(values(r, "namespace", "claim").get((ns, claim), -1), sum(g.utilisation for g in gs) / len(gs))
            for claim, gs in claims.items()) and {k for k in values(r, "namespace", "claim") if k[0] == ns} == {
            (ns, c) for c in claims},
        "panel 'GPU utilisation per namespace' A": lambda r: close(
            values(r, "namespace").get((ns,), -1), sum(g.utilisation for g in held) / len(held)),
        "panel 'GPU memory in use per namespace' A": lambda r: close(
            values(r, "namespace").get((ns,), -1), sum(g.memory_used_mib for g in held) * 1048576),
        # The teams: each counts the namespace's two allocated GPUs.
        "panel 'Team memory: used, reserved, hard' A":  # used
            lambda r: values(r, "quota") == {(full,): 160 * GI, (small,): 160 * GI},
        "panel 'Team devices: used, reserved, hard' C":  # hard: only the team limiting devices
            lambda r: values(r, "quota") == {(full,): 4},
        "panel 'ClusterDeviceQuotas: hard, used, reserved, headroom' D":  # memory headroom
            lambda r: values(r, "quota") == {(full,): 0, (small,): -80 * GI},
        "panel 'Team breakdown per namespace' A":  # memory used
            lambda r: values(r, "quota", "namespace") == {(full, ns): 160 * GI, (small, ns): 160 * GI},
        "panel 'Team breakdown per namespace' C":  # memory share of the team's hard
            lambda r: values(r, "quota", "namespace") == {(full, ns): 1.0, (small, ns): 2.0},
        # Showback: the namespace's two GPUs, billed to both its teams and to their model.
        "panel 'GPU-memory-hours by team' A": lambda r: {full, small} <= {k[0] for k, v in values(r, "team").items()
                                                          if v > 0},
        "panel 'GPU-memory-hours by model' A": lambda r: values(r, "model").get((held[0].model,), 0) > 0,
    }


def firing(ns: str) -> dict[str, tuple[str, str]]:
    """alert -> the (namespace, quota) it fires for; a team's has no namespace."""
    full, small = teams(ns)
    return {"DraQuotaNearLimit": (ns, "gpus"), "DraQuotaOverLimit": (ns, "small"),
            "DraQuotaTeamNearLimit": ("", full), "DraQuotaTeamOverLimit": ("", small)}


@dataclass
class Checks:
    """Every check shares one deadline; each failure is recorded, so one report lists them all."""

    prometheus: Prometheus
    deadline: float
    failures: list[str] = field(default_factory=list)

    async def until(self, what: str, probe: Callable[[], Awaitable[bool]], needs: set[str] | None = None) -> bool:
        try:
            await poll(probe, timeout=max(1.0, self.deadline - time.monotonic()), what=what, max_interval=1.0)
        except WaitTimeout:
            err: AssertionError = AssertionError(f"not within {DEADLINE:.0f}s")
        except AssertionError as refused:  # a query Prometheus refused, or a wrong rule set
            err = refused
        else:
            return True
        missing = f" [reads {sorted(needs)}: not named in runtime/metricnames.py]" if needs else ""
        self.failures.append(f"{what}: {err}{missing}")
        return False


async def check_everything(prometheus: Prometheus, ns: str, claims: dict[str, list[Gpu]]) -> list[str]:
    checks = Checks(prometheus, time.monotonic() + DEADLINE)

    async def up() -> bool:
        return values(await prometheus.query("up"), "job") == {("dra-quota",): 1.0, ("dcgm-exporter",): 1.0}

    await checks.until("both targets scraped (up == 1)", up)

    async def rules_healthy() -> bool:
        rules = [r for g in (await prometheus.api("rules"))["groups"] for r in g["rules"]]
        assert {r["name"] for r in rules} == set(alert_rules()) | set(recording_rules()), rules
        bad = [(r["name"], r["health"], r.get("lastError")) for r in rules if r["health"] != "ok"]
        assert not [b for b in bad if b[1] == "err"], bad
        return not bad

    await checks.until("every alert and recording rule evaluated without error by Prometheus", rules_healthy)

    expected = panel_checks(ns, claims)
    queries = dashboard_queries()
    assert set(expected) <= {q.where for q in queries}, set(expected) - {q.where for q in queries}
    for query in queries:
        expr = query.expr.replace("$__rate_interval", RATE_INTERVAL).replace("$__range", RATE_INTERVAL).replace(
            "$namespace", ns).replace(
            "$quota", "|".join(teams(ns)))
        check: Check = expected.get(query.where, bool)

        async def answers(expr: str = expr, check: Check = check) -> bool:
            return check(await prometheus.query(expr))

        what = "its expected answer" if query.where in expected else "data"
        await checks.until(f"{query.where} shows {what}: {expr}", answers, unknown(query.expr))

    # The showback rules' idle share: the namespace's GPUs whose utilisation is under 5%.
    held = [g for gs in claims.values() for g in gs]
    idle = sum(g.utilisation < 5 for g in held) / len(held)

    async def idle_share() -> bool:
        result = await prometheus.query(f'namespace_model:draquota_idle_devices:ratio{{namespace="{ns}"}}')
        return values(result, "model") == {(held[0].model,): idle}

    await checks.until(f"recorded idle share of {ns}'s GPUs is {idle}", idle_share)
    for name, expr in alert_rules().items():
        await check_alert(checks, ns, name, expr)
    return checks.failures


async def check_alert(checks: Checks, ns: str, name: str, expr: str) -> None:
    prometheus, needs = checks.prometheus, unknown(expr)
    if name in (fired := firing(ns)):
        ours = {ns, *teams(ns)}  # the test's namespace and teams: the cluster is shared

        async def fires() -> bool:
            result = values(await prometheus.query(expr), "namespace", "quota", "resource")
            return {k for k in result if k[0] in ours or k[1] in ours} == {(*fired[name], "memory")}

        await checks.until(f"alert {name} fires for {fired[name]} memory, and nothing else of the test's", fires,
                           needs)
        return

    names = sorted(metric_names(expr))

    async def inputs() -> bool:
        return all([await prometheus.query(metric) for metric in names])

    # Silent because the values say so, not because a metric it reads is missing.
    if await checks.until(f"alert {name}: every metric it reads has series {names}", inputs, needs):
        result = await prometheus.query(expr)
        if result:
            checks.failures.append(f"alert {name} is not silent: {result}")
