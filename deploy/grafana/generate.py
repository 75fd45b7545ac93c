"""Generate the Grafana dashboard deploy/grafana/dra-quota.json (its only source).

`python deploy/grafana/generate.py` rewrites the JSON; `--check` exits 1 when the committed
file differs (tests/unit/deploy/test_dashboard.py runs it, and checks every query's metric
names against runtime/metricnames.py; tests/e2e/test_dashboards.py evaluates every query
against a real Prometheus scraping `dra-quota serve`). Plain dicts, no SDK: the panels
are a table of titles and PromQL, the rest is layout.

Usage queries reduce over replicas with max, never sum: only the leader exports usage,
and max stays right while two replicas overlap at a handover. `$namespace` filters the quota and usage panels; the DCGM panels join
dcgm-exporter's per-GPU series to `draquota_claim_device_info` on `UUID` (and
`GPU_I_PROFILE`, for MIG) and are empty where dcgm-exporter is not installed.
`$namespace` lists the namespaces of `draquota_quota`, which every namespace holding a
DeviceQuota has from the moment it exists (claims or not); the per-request series name
only those namespaces too (their other namespaces read "other", webhook/metrics.py).
`$quota` lists the ClusterDeviceQuotas (`draquota_cluster_quota`) and filters the team
row: each team's totals and its namespaces' parts (`draquota_cluster_quota_namespace`).
Tables are instant queries merged on their labels (Grafana's `merge` transformation), one
column per query, renamed by `organize`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TARGET = Path(__file__).resolve().parent / "dra-quota.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
NS = 'namespace=~"$namespace"'
TEAM = 'quota=~"$quota"'
MODEL = "driver, model, profile"


@dataclass(frozen=True)
class Q:
    expr: str
    legend: str = ""
    instant: bool = False
    column: str = ""  # a table's column for this query's value (instant, merged on the labels)


@dataclass(frozen=True)
class Panel:
    title: str
    kind: str  # timeseries | bargauge | stat | table
    unit: str
    queries: tuple[Q, ...]
    description: str = ""
    width: int = 8
    options: dict[str, Any] = field(default_factory=dict)
    thresholds: tuple[tuple[float | None, str], ...] = ((None, "green"),)
    mappings: tuple[dict[str, Any], ...] = ()
    stack: bool = False
    # table: a transformation after the merge (groupingToMatrix), and per-column units.
    transformations: tuple[dict[str, Any], ...] = ()
    column_units: tuple[tuple[str, str], ...] = ()


def _held(resource: str) -> str:
    return (f"sum by (namespace, state) (max by (namespace, device_class, resource, state) "
            f'(draquota_namespace_device_usage{{resource="{resource}", {NS}}}))')


def _top(resource: str) -> str:
    return (f"topk(10, sum by (namespace) (max by (namespace, device_class, resource, state) "
            f'(draquota_namespace_device_usage{{resource="{resource}", state="allocated"}})))')


@dataclass(frozen=True)
class Quotas:
    """Where a kind of quota's series are: DeviceQuotas in draquota_quota by (namespace,
    quota), filtered by `$namespace`; ClusterDeviceQuotas (teams) in draquota_cluster_quota
    by quota, filtered by `$quota`."""

    metric: str
    by: str
    match: str
    legend: str  # a quota's name in a legend


DEVICE_QUOTAS = Quotas("draquota_quota", "namespace, quota", NS, "{{namespace}}/{{quota}}")
TEAMS = Quotas("draquota_cluster_quota", "quota", TEAM, "{{quota}}")
PARTS = "draquota_cluster_quota_namespace"


def _by_quota(resource: str, kind: str, of: Quotas = DEVICE_QUOTAS) -> str:
    return f'max by ({of.by}) ({of.metric}{{resource="{resource}", type="{kind}", {of.match}}})'


def _headroom(resource: str, of: Quotas) -> str:
    """hard - (used + reserved): what the next claims may still take (negative: exceeded)."""
    committed = (f"sum by ({of.by}) (max by ({of.by}, type) "
                 f'({of.metric}{{resource="{resource}", type=~"used|reserved", {of.match}}}))')
    return f"{_by_quota(resource, 'hard', of)} - on ({of.by}) {committed}"


def _quota_table(of: Quotas) -> tuple[Q, ...]:
    queries = []
    for resource in ("memory", "devices"):
        queries += [Q(_by_quota(resource, kind, of), instant=True, column=f"{resource} {kind}")
                    for kind in ("hard", "used", "reserved")]
        queries.append(Q(_headroom(resource, of), instant=True, column=f"{resource} headroom"))
    return tuple(queries)


def _utilisation(of: Quotas) -> str:
    """(used + reserved) / hard per quota and resource, for the limits above 0."""
    return (f"sum by ({of.by}, resource) (max by ({of.by}, resource, type) "
            f'({of.metric}{{type=~"used|reserved", {of.match}}})) / on ({of.by}, resource) '
            f'max by ({of.by}, resource) ({of.metric}{{type="hard", {of.match}}} > 0)')


def _limits(of: Quotas, noun: str, whose: str, alert: str) -> tuple[Panel, Panel, Panel]:
    """Memory and devices used / reserved / hard over time, and (used + reserved) / hard now."""
    def series(resource: str) -> tuple[Q, ...]:
        return tuple(Q(_by_quota(resource, kind, of), f"{of.legend} {kind}") for kind in ("used", "reserved", "hard"))

    return (
        Panel(f"{noun} memory: used, reserved, hard", "timeseries", "bytes", series("memory"),
              f"{whose} memory: allocated (used), admitted but not yet allocated (reserved), and its limit."),
        Panel(f"{noun} devices: used, reserved, hard", "timeseries", "short", series("devices"),
              f"{whose} device count: used, reserved and its limit."),
        Panel(f"{noun} utilisation: (used + reserved) / hard", "bargauge", "percentunit",
              (Q(_utilisation(of), f"{of.legend} {{{{resource}}}}", instant=True),),
              f"How much of each limit is committed; above 90% the {alert} alert fires, at 100% new claims are "
              "denied.", thresholds=PERCENT_THRESHOLDS,
              options={"displayMode": "gradient", "orientation": "horizontal"}),
    )


def _parts(resource: str) -> Q:
    """Each namespace's part of its team, used and reserved (stacked: the team's total)."""
    return Q(f'max by (quota, namespace, type) ({PARTS}{{resource="{resource}", {TEAM}}})',
             "{{quota}} {{namespace}} {{type}}")


def _part(resource: str, kind: str) -> str:
    return f'max by (quota, namespace) ({PARTS}{{resource="{resource}", type="{kind}", {TEAM}}})'


def _share(resource: str) -> str:
    """A namespace's used + reserved over its team's hard."""
    committed = (f"sum by (quota, namespace) (max by (quota, namespace, type) "
                 f'({PARTS}{{resource="{resource}", type=~"used|reserved", {TEAM}}}))')
    return f"{committed} / on (quota) group_left () ({_by_quota(resource, 'hard', TEAMS)} > 0)"


def _breakdown_table() -> tuple[Q, ...]:
    queries = []
    for resource in ("memory", "devices"):
        queries += [Q(_part(resource, kind), instant=True, column=f"{resource} {kind}")
                    for kind in ("used", "reserved")]
        queries.append(Q(_share(resource), instant=True, column=f"{resource} share of team hard"))
    return tuple(queries)


def _wait(q: float) -> Q:
    # sum over replicas: only the leader observes.
    return Q(f"histogram_quantile({q}, sum by (le) "
             f"(rate(draquota_claim_allocation_wait_seconds_bucket{{{NS}}}[$__rate_interval])))", f"p{round(q * 100)}")


def _percentile(q: float) -> Q:
    return Q(f"histogram_quantile({q}, sum by (webhook, le) "
             f"(rate(draquota_admission_duration_seconds_bucket[$__rate_interval])))",
             f"{{{{webhook}}}} p{round(q * 100)}")


def _holders(by: str) -> str:
    """Who holds each GPU, keyed as dcgm-exporter keys its series: `UUID` (a MIG device's parent)
    and `GPU_I_PROFILE` (absent for a whole GPU), the label names draquota_claim_device_info
    uses. A GPU or MIG profile several holders share (consumable capacity, two instances of
    one profile) is left out: its utilisation cannot be split between them, and a
    non-unique right side would fail the whole query (many-to-many). Counted over every
    namespace, not only `$namespace`."""
    key = "UUID, GPU_I_PROFILE"
    info = f"max by ({by}, {key}) (draquota_claim_device_info{{{NS}}})"
    single = f"count by ({key}) (max by ({by}, {key}) (draquota_claim_device_info)) == 1"
    return f"({info} and on ({key}) ({single}))"


def _dcgm(metric: str, agg: str, by: str, scale: str = "") -> str:
    return f"{agg} by ({by}) ({metric} * on (UUID, GPU_I_PROFILE) group_left ({by}) {_holders(by)}){scale}"


def _reconcile(q: float) -> Q:
    # sum over replicas: only the leader observes, and a handover keeps both halves.
    return Q(f"histogram_quantile({q}, sum by (le) "
             f"(rate(draquota_reconcile_duration_seconds_bucket[$__rate_interval])))", f"p{round(q * 100)}")


PERCENT_THRESHOLDS = ((None, "green"), (0.9, "orange"), (1.0, "red"))
DCGM_NOTE = (" From dcgm-exporter's series joined on UUID (and GPU_I_PROFILE) with draquota_claim_device_info; "
             "empty where dcgm-exporter is not installed. GPUs shared by several claims are left out.")

SHOWBACK_NOTE = (" Counters summed over replicas (only the leader's grow); dra-quota report prints the same per "
                 "namespace, team or model.")
TEAMS_OF = 'group by (namespace, team) (label_replace(draquota_cluster_quota_namespace, "team", "$1", "quota", "(.*)"))'


def _gib_hours(by: str) -> str:
    return f"{by} (increase(draquota_allocated_memory_byte_seconds_total[$__range])) / 2^30 / 3600"


def _by_team(per_namespace: str) -> str:
    return f"sum by (team) ({TEAMS_OF} * on (namespace) group_left () {per_namespace})"


ROWS: tuple[tuple[str, tuple[Panel, ...]], ...] = (
    ("Quotas", (
        *_limits(DEVICE_QUOTAS, "Quota", "Each DeviceQuota's", "DraQuotaNearLimit"),
        Panel("Device memory held per namespace (every class)", "timeseries", "bytes",
              (Q(_held("memory"), "{{namespace}} {{state}}"),),
              "Allocated and reserved device memory per namespace, with or without a DeviceQuota.", stack=True),
        Panel("Devices held per namespace (every class)", "timeseries", "short",
              (Q(_held("devices"), "{{namespace}} {{state}}"),),
              "Allocated and reserved devices per namespace, with or without a DeviceQuota.", stack=True),
        Panel("Top consumers: allocated device memory", "bargauge", "bytes",
              (Q(_top("memory"), "{{namespace}}", instant=True),),
              "The ten namespaces holding the most allocated device memory.",
              options={"displayMode": "gradient", "orientation": "horizontal"}),
        Panel("DeviceQuotas: hard, used, reserved, headroom", "table", "none", _quota_table(DEVICE_QUOTAS),
              "One row per DeviceQuota: its limits, what allocated claims use, what admitted claims reserve, and "
              "the headroom left (hard - used - reserved; negative: Exceeded). Empty cells: a resource the quota "
              "does not limit.", width=16,
              column_units=tuple((f"memory {k}", "bytes") for k in ("hard", "used", "reserved", "headroom"))),
        Panel("Devices held per namespace and GPU model", "table", "short",
              (Q("count by (namespace, model) (max by (namespace, driver, pool, device, model) "
                 f"(draquota_claim_device_info{{{NS}}}))", instant=True, column="devices"),),
              "Allocated devices by namespace (rows) and model (columns: the productName attribute, else model; a "
              "MIG device counts under its GPU's), each device once however many pods use it.", width=8,
              transformations=({"id": "groupingToMatrix", "options": {
                  "columnField": "model", "rowField": "namespace", "valueField": "devices"}},)),
    )),
    ("Teams (ClusterDeviceQuotas)", (
        *_limits(TEAMS, "Team", "Each team's (ClusterDeviceQuota's, over every namespace it selects)",
                 "DraQuotaTeamNearLimit"),
        Panel("Team memory per namespace", "timeseries", "bytes", (_parts("memory"),),
              "Each namespace's part of its team's memory, used and reserved, stacked: together they are the "
              "team's total. A relabelled namespace moves from one team to the other.", width=12, stack=True),
        Panel("Team devices per namespace", "timeseries", "short", (_parts("devices"),),
              "Each namespace's part of its team's devices, used and reserved, stacked.", width=12, stack=True),
        Panel("ClusterDeviceQuotas: hard, used, reserved, headroom", "table", "none", _quota_table(TEAMS),
              "One row per team: its limits, what its namespaces' allocated claims use, what their admitted "
              "claims reserve, and the headroom left (hard - used - reserved; negative: Exceeded).", width=12,
              column_units=tuple((f"memory {k}", "bytes") for k in ("hard", "used", "reserved", "headroom"))),
        Panel("Team breakdown per namespace", "table", "none", _breakdown_table(),
              "One row per team and namespace it selects: the namespace's part (used, reserved) and what share "
              "of the team's hard it commits (empty: a resource the team does not limit).", width=12,
              column_units=(("memory used", "bytes"), ("memory reserved", "bytes"),
                            ("memory share of team hard", "percentunit"),
                            ("devices share of team hard", "percentunit"))),
    )),
    ("Claims", (
        Panel("Pending claims per namespace", "timeseries", "short",
              (Q(f"max by (namespace) (draquota_namespace_pending_claims{{{NS}}})", "{{namespace}}"),),
              "Claims that exist unallocated: their Pods wait for the scheduler (for devices, or for a quota to "
              "free), as kueue_pending_workloads counts Workloads."),
        Panel("Denied claims per namespace", "timeseries", "short",
              (Q("sum by (namespace) (increase(draquota_admission_requests_total{decision=\"denied\", "
                 f'resource=~"resourceclaims|resourceclaimtemplates", {NS}}}[$__rate_interval]))', "{{namespace}}"),),
              "Claim and template creates denied, by namespace (a namespace without a DeviceQuota counts as "
              "other). Denials by reason are under Admission."),
        Panel("Time from claim creation to allocation", "timeseries", "s", (_wait(0.5), _wait(0.9), _wait(0.99)),
              "Seconds from a claim's creation to its allocation as the leader sees it "
              "(draquota_claim_allocation_wait_seconds, like kueue_admission_wait_time_seconds): waits for the "
              "scheduler, for its Pod, or for quota to free. Admission itself is under Admission latency."),
    )),
    ("Admission", (
        Panel("Denials by reason", "timeseries", "reqps",
              (Q("sum by (reason) (rate(draquota_admission_requests_total"
                 '{decision="denied"}[$__rate_interval]))', "{{reason}}"),),
              "Reviews denied per second: quota (a DeviceQuota is full), admin_access, pricing, annotations, "
              "invalid; unavailable, timeout and error are the webhook failing (DraQuotaWebhookErrors)."),
        Panel("Quota denials by quota and reason", "timeseries", "short",
              (Q(f"sum by (namespace, quota, decision, resource) (increase(draquota_quota_denials_total{{{NS}}}"
                 "[$__rate_interval]))", "{{namespace}}/{{quota}} {{decision}} {{resource}}"),),
              "Claim creates (resourceclaims), template creates and allocations (resourceclaims/status) each "
              "quota denied, or admitted over its hard with a warning (warned: an Audit quota, or the "
              "account-only allocation check). A team's ClusterDeviceQuota/<name> shows under each namespace "
              "it denied in. Quotas past the first 1,000 read other."),
        Panel("Reviews by decision", "timeseries", "reqps",
              (Q("sum by (webhook, decision) (rate(draquota_admission_requests_total[$__rate_interval]))",
                 "{{webhook}} {{decision}}"),),
              "Admission reviews answered per second, by webhook and decision (warned: admitted with warnings)."),
        Panel("Admission latency percentiles", "timeseries", "s",
              (_percentile(0.5), _percentile(0.9), _percentile(0.99)),
              "Seconds from reading a review to answering it (not the API server's round trip)."),
        Panel("adminAccess decisions", "timeseries", "short",
              (Q("sum by (outcome, action) (increase(draquota_admin_access_decisions_total[$__rate_interval]))",
                 "{{outcome}} {{action}}"),),
              "adminAccess grants and refusals (claims, templates, the namespace label)."),
    )),
    ("Inventory", (
        Panel("Devices by model: total and allocated", "timeseries", "short",
              (Q(f"max by ({MODEL}) (draquota_inventory_devices)", "{{model}} {{profile}} total"),
               Q(f"max by ({MODEL}) (draquota_inventory_allocated_devices)", "{{model}} {{profile}} allocated")),
              "Devices of complete ResourceSlice pools by driver, model (productName) and MIG profile, and how "
              "many are allocated to claims (adminAccess excluded)."),
        Panel("Device memory by model", "timeseries", "bytes",
              (Q(f"max by ({MODEL}) (draquota_inventory_memory_bytes)", "{{model}} {{profile}}"),),
              "Memory capacity of the published devices, by model and MIG profile."),
        Panel("Share of each model allocated", "bargauge", "percentunit",
              (Q(f"max by ({MODEL}) (draquota_inventory_allocated_devices) / on ({MODEL}) "
                 f"max by ({MODEL}) (draquota_inventory_devices > 0)", "{{model}} {{profile}}", instant=True),),
              "Allocated devices over published devices, per model.", thresholds=PERCENT_THRESHOLDS,
              options={"displayMode": "gradient", "orientation": "horizontal"}),
    )),
    ("Health", (
        Panel("Leader", "stat", "none", (Q("max by (instance) (draquota_leader)", "{{instance}}", instant=True),),
              "Which replica holds the lease and writes usage (DraQuotaNoLeader when none does).", width=6,
              mappings=({"type": "value", "options": {"0": {"text": "standby", "color": "blue"},
                                                       "1": {"text": "leader", "color": "green"}}},)),
        Panel("Certificate expiry", "stat", "s",
              (Q("min by (certificate) (draquota_certificate_expiration_timestamp_seconds) - time()",
                 "{{certificate}}", instant=True),),
              "Time left before the served certificate (and the self-managed CA) expires.", width=6,
              thresholds=((None, "red"), (86400, "orange"), (7 * 86400, "green"))),
        Panel("Watch caches synced", "stat", "none",
              (Q("min by (resource) (draquota_watch_cache_synced)", "{{resource}}", instant=True),),
              "1 once every replica has listed the resource (DraQuotaCacheNotSynced when not).", width=6,
              thresholds=((None, "red"), (1, "green"))),
        Panel("Watch restarts, relists, Events dropped", "timeseries", "short",
              (Q("sum by (resource) (increase(draquota_watch_restarts_total[$__rate_interval]))",
                 "{{resource}} restarts"),
               Q("sum by (resource) (increase(draquota_watch_relists_total[$__rate_interval]))",
                 "{{resource}} relists"),
               Q("sum by (reason) (increase(draquota_events_dropped_total[$__rate_interval]))",
                 "Events dropped: {{reason}}")),
              "Watches reopened after an error or silence, complete relists after 410 Gone, Events not recorded.",
              width=6),
        Panel("Quota controller: reconcile pass duration", "timeseries", "s",
              (_reconcile(0.5), _reconcile(0.99)),
              "Seconds the leader's quota controller took per pass to write the status of the DeviceQuotas that "
              "changed (the target is the status within 1 s of an allocation); standbys do not reconcile.",
              width=12),
    )),
    ("GPU utilisation (dcgm-exporter)", (
        Panel("GPU utilisation per namespace", "timeseries", "percent",
              (Q(_dcgm("DCGM_FI_DEV_GPU_UTIL", "avg", "namespace"), "{{namespace}}"),),
              "Average DCGM_FI_DEV_GPU_UTIL of the GPUs each namespace's claims hold." + DCGM_NOTE),
        Panel("GPU utilisation per claim", "timeseries", "percent",
              (Q(_dcgm("DCGM_FI_DEV_GPU_UTIL", "avg", "namespace, claim"), "{{namespace}}/{{claim}}"),),
              "Average DCGM_FI_DEV_GPU_UTIL of each claim's GPUs (draquota_claim_device_info also names "
              "the pod, to join further)." + DCGM_NOTE),
        Panel("GPU memory in use per namespace", "timeseries", "bytes",
              (Q(_dcgm("DCGM_FI_DEV_FB_USED", "sum", "namespace", " * 1048576"), "{{namespace}}"),),
              "Framebuffer memory in use (DCGM_FI_DEV_FB_USED, MiB, shown in bytes) on the GPUs each "
              "namespace holds: compare with the memory its claims were charged." + DCGM_NOTE),
    )),
    ("Showback (GPU-memory-hours)", (
        Panel("GPU-memory-hours by team", "bargauge", "short",
              (Q(_by_team(_gib_hours("sum by (namespace)")), "{{team}}", instant=True),),
              "GiB-hours of device memory allocated over the dashboard's range, per team (the ClusterDeviceQuota "
              "selecting each namespace now; a namespace in two teams counts in both)." + SHOWBACK_NOTE,
              options={"displayMode": "gradient", "orientation": "horizontal"}),
        Panel("GPU-memory-hours by model", "bargauge", "short",
              (Q(_gib_hours("sum by (model)"), "{{model}}", instant=True),),
              "GiB-hours of device memory allocated over the dashboard's range, per device model." + SHOWBACK_NOTE,
              options={"displayMode": "gradient", "orientation": "horizontal"}),
        Panel("Top idle namespaces: GiB-hours on idle GPUs", "bargauge", "short",
              (Q("topk(10, sum by (namespace) (sum_over_time("
                 "namespace_model:draquota_idle_memory_bytes:rate5m[$__range])) / 60 / 2^30)", "{{namespace}}",
                 instant=True),),
              "GiB-hours allocated on GPUs under 5% utilisation over the dashboard's range (the chart's recording "
              "rules and dcgm-exporter; empty without them)." + SHOWBACK_NOTE,
              options={"displayMode": "gradient", "orientation": "horizontal"}),
        Panel("GPU-memory-hours per hour, by team", "timeseries", "short",
              (Q("team:draquota_gpu_memory_gib_hours:increase1h", "{{team}}"),),
              "GiB-hours allocated in the hour before each point, per team as it was then (the chart's recording "
              "rules)." + SHOWBACK_NOTE, width=24),
    )),
)


def _panel(panel: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    if panel.kind == "table":
        return _table(panel, pid, x, y)
    defaults: dict[str, Any] = {
        "unit": panel.unit,
        "thresholds": {"mode": "absolute",
                       "steps": [{"value": v, "color": c} for v, c in panel.thresholds]},
        "mappings": list(panel.mappings),
    }
    if panel.kind == "timeseries":
        defaults["custom"] = {"stacking": {"mode": "normal" if panel.stack else "none", "group": "A"},
                              "fillOpacity": 10 if panel.stack else 0}
    options = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}} \
        if panel.kind in ("stat", "bargauge") else {"legend": {"displayMode": "list", "placement": "bottom"},
                                                    "tooltip": {"mode": "multi"}}
    return {
        "id": pid, "type": panel.kind, "title": panel.title, "description": panel.description,
        "datasource": DATASOURCE, "gridPos": {"h": 8, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {**options, **panel.options},
        "targets": [{"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": q.expr,
                     "legendFormat": q.legend or "__auto", "instant": q.instant, "range": not q.instant}
                    for i, q in enumerate(panel.queries)],
    }


def _table(panel: Panel, pid: int, x: int, y: int) -> dict[str, Any]:
    """Instant queries merged on their labels; each value column named after its query."""
    names = {f"Value #{chr(ord('A') + i)}": q.column for i, q in enumerate(panel.queries)}
    if len(panel.queries) == 1:
        names["Value"] = panel.queries[0].column  # Grafana names a lone query's column so
    return {
        "id": pid, "type": "table", "title": panel.title, "description": panel.description,
        "datasource": DATASOURCE, "gridPos": {"h": 8, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": [
            {"matcher": {"id": "byName", "options": name}, "properties": [{"id": "unit", "value": unit}]}
            for name, unit in panel.column_units]},
        "options": {"showHeader": True, "cellHeight": "sm"},
        "transformations": [
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {"excludeByName": {"Time": True}, "renameByName": names}},
            *panel.transformations,
        ],
        "targets": [{"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": q.expr, "format": "table",
                     "instant": True, "range": False} for i, q in enumerate(panel.queries)],
    }


def _variables() -> list[dict[str, Any]]:
    return [
        {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
         "current": {}, "hide": 0},
        {"name": "namespace", "label": "Namespace", "type": "query", "datasource": DATASOURCE,
         "query": {"query": "label_values(draquota_quota, namespace)", "refId": "namespace"},
         "definition": "label_values(draquota_quota, namespace)",
         "refresh": 2, "multi": True, "includeAll": True, "allValue": ".*", "current": {}, "sort": 1, "hide": 0},
        {"name": "quota", "label": "Team (ClusterDeviceQuota)", "type": "query", "datasource": DATASOURCE,
         "query": {"query": "label_values(draquota_cluster_quota, quota)", "refId": "quota"},
         "definition": "label_values(draquota_cluster_quota, quota)",
         "refresh": 2, "multi": True, "includeAll": True, "allValue": ".*", "current": {}, "sort": 1, "hide": 0},
    ]


def dashboard() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    y = 0
    for title, row in ROWS:
        panels.append({"id": len(panels) + 1, "type": "row", "title": title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        y += 1
        x = 0
        for panel in row:
            if x + panel.width > 24:
                x, y = 0, y + 8
            panels.append(_panel(panel, len(panels) + 1, x, y))
            x += panel.width
        y += 8
    return {
        "title": "dra-quota", "uid": "dra-quota", "description":
            "DRA device quotas (dra-quota): usage per namespace and DeviceQuota, headroom, devices by model, "
            "pending and denied claims, time to allocation, admission, inventory, health, GPU utilisation per "
            "namespace and claim from dcgm-exporter, and showback (GPU-memory-hours by team and model, idle).",
        "tags": ["dra-quota", "kubernetes", "dra", "gpu"], "editable": True, "graphTooltip": 1,
        "schemaVersion": 39, "version": 1, "refresh": "1m", "time": {"from": "now-6h", "to": "now"},
        "timezone": "", "annotations": {"list": []}, "links": [],
        "templating": {"list": _variables()}, "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def main(argv: list[str]) -> int:
    rendered = render()
    if argv[1:] == ["--check"]:
        if not TARGET.exists() or TARGET.read_text() != rendered:
            print(f"{TARGET} differs from what generate.py renders: run python deploy/grafana/generate.py",
                  file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(rendered)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
