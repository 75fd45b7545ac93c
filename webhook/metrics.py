"""Prometheus metrics of `dra-quota serve`: each metric's help, labels and buckets.

Neighbours: `webhook.server` tells `Metrics.review` every verdict (its `observe` hook);
`kube.events` counts what it drops here; the reflectors (`kube.watching`, their
`ReflectorStats`), this process's leases (`kube.leasebook`, its `LeaseStats` and room)
and the served certificate (`certs.tls.ReloadingContext`, the self-managed
`certs.manager`) are read at scrape time by collectors, so neither `quota/` nor `certs/`
nor `kube/` imports prometheus. `webhook.metricsserver` serves the registry on its own
port (`--metrics-port`): reviews stay on the webhook's.

One `Metrics` per process owns one `CollectorRegistry` (never the global default, so
tests can build several). Every metric name is a constant in `runtime.metricnames` (STYLE: the
Grafana test checks each dashboard query against them); the usage metrics (`draquota_quota`,
`draquota_namespace_device_usage`, `draquota_claim_device_info`, inventory, leader) are
collectors `webhook.usagemetrics` registers on `Metrics.registry`.

The admission metrics' label values are closed sets, never user text: a caller that could
POST a review to the webhook directly must not be able to mint series. Resources outside
the webhook's routes read "other", unreadable reviews "unknown". Their `namespace` (and
the allocation-wait histogram's) is `NamespaceLabel`'s: a namespace that holds a
DeviceQuota when it is first seen, at most MAX_NAMESPACE_VALUES of them per process,
everything else "other" (namespaces are tenant-creatable; DeviceQuotas are the admins').
The usage metrics' label values come from the API objects in the caches (namespaces,
quota and claim names, device attributes): bounded by what the cluster holds, not by who
calls the webhook. prometheus_client's `_created` series are off (`Metrics`): one more
series per counter and histogram child that no dashboard reads.

A scrape renders one family at a time, and a large gauge family `RENDER_CHUNK` samples
at a time (prometheus_client spends ~40 us a sample), with a pause point
(`quota.values.work.pause_point`) between two: `webhook.metricsserver` runs it in slices.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kube.admissionreview import CAUSES, AdmissionRequest, Verdict
from kube.leasebook import PATHS, WRITE_OUTCOMES, LeaseBook
from kube.watching import Reflector
from quota.admission.policy import PolicyRecord
from quota.status.appliedplan import REASONS as APPLIED_REASONS
from quota.status.appliedplan import Reason as AppliedReason
from quota.values.work import pause_point
from quota.version import version
from runtime.metricnames import (
    ADMIN_ACCESS_DECISIONS,
    ADMISSION_DURATION,
    ADMISSION_REQUESTS,
    ALLOCATION_WAIT,
    API_SERVER_REACHABLE,
    QUOTA_DENIALS,
    ANNOTATIONS_REFUSED,
    ANNOTATION_WRITERS,
    APPLIED_QUOTA_WRITES,
    ANNOTATIONS_PENDING,
    BUILD_INFO,
    CERTIFICATE_EXPIRATION,
    CONNECTIONS,
    CONNECTIONS_DROPPED,
    EVENTS_DROPPED,
    EVENTS_WRITTEN,
    EVENT_LOOP_STALL,
    EVENT_LOOP_STALL_CPU_MAX,
    EVENT_LOOP_STALL_MAX,
    GC_PAUSE,
    LEASE_ROOM,
    LEASE_WRITES,
    RECONCILE_DURATION,
    REQUEUE_CREDITS,
    REQUEUE_PENDING,
    REQUEUE_WRITES,
    RESERVATION_ADMISSIONS,
    WATCH_RELISTS,
    WATCH_RESTARTS,
    WATCH_SYNCED,
)
from webhook.connections import DROP_REASONS, Connections
from webhook.endpoints import ADMITTING, MUTATING, VALIDATING

__all__ = [
    "DEFAULT_METRICS_PORT",
    "DURATION_BUCKETS",
    "MAX_NAMESPACE_VALUES",
    "NamespaceLabel",
    "RENDER_CHUNK",
    "Metrics",
    "decision_of",
    "render",
    "resource_of",
]

# controller-runtime's and kube-state-metrics' metrics port: what ServiceMonitors expect.
DEFAULT_METRICS_PORT = 8080
RENDER_CHUNK = 32  # samples rendered between two pause points of a scrape (~1-2 ms)
# Reviews that write nothing take well under a millisecond; a claim CREATE into a
# DeviceQuota a status write (a few ms to tens); the API server gives up after timeoutSeconds (5 in deploy/, 10 by default).
DURATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# A reconcile pass is one status write per changed quota (a few ms each, 8 at a time),
# conflicts retried; a resync of thousands of quotas takes seconds (the target is <= 1 s
# from an allocation to its status).
RECONCILE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# A claim waits for the scheduler (seconds), for a Pod to be scheduled or for quota to
# free (minutes to hours): Kueue's admission wait uses exponential buckets up to hours too.
WAIT_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 10800.0, 43200.0, 86400.0)
# Distinct `namespace` values of the per-request series (NamespaceLabel).
MAX_NAMESPACE_VALUES = 1000
# Distinct `quota` values of draquota_quota_denials_total (QuotaLabel).
MAX_QUOTA_VALUES = 1000
OTHER = "other"
# Stalls: under a millisecond is timer noise; past the webhook timeout (5-30 s) every
# review waiting on the loop has failed.
STALL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

# -- label values -----------------------------------------------------------------------------

Decision = Literal["allowed", "denied", "warned"]
AdminAction = Literal["claim", "template", "namespace_label"]
_WEBHOOKS = {"/validate": "validating", "/mutate": "mutating", "/admit": "admitting"}
# "resourceclaims", "resourceclaims/status", "namespaces/finalize", ...: what the routes serve.
_RESOURCES = frozenset(f"{resource}/{sub}" if sub else resource
                       for _, resource, sub, _ in (*VALIDATING, *MUTATING, *ADMITTING))
_OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")
_ADMIN_ACTIONS: dict[str, AdminAction] = {"ResourceClaim": "claim", "ResourceClaimTemplate": "template",
                                          "Namespace": "namespace_label"}


def resource_of(review: AdmissionRequest | None) -> str:
    """The `resource` label: `plural[/subresource]` when routed, else "other" ("unknown": unreadable)."""
    if review is None:
        return "unknown"
    name = f"{review.resource.resource}/{review.sub_resource}" if review.sub_resource else review.resource.resource
    return name if name in _RESOURCES else "other"


class NamespaceLabel:
    """The `namespace` label of per-request series: a namespace that holds a DeviceQuota when
    first seen (and keeps its value after), at most `limit` of them; else "other"."""

    def __init__(self, has_quota: Callable[[str], bool] = lambda _namespace: False, *,
                 limit: int = MAX_NAMESPACE_VALUES) -> None:
        self.has_quota = has_quota
        self._limit = limit
        self._named: set[str] = set()

    def __call__(self, namespace: str) -> str:
        if namespace in self._named:
            return namespace
        if not namespace or len(self._named) >= self._limit or not self.has_quota(namespace):
            return OTHER
        self._named.add(namespace)
        return namespace


class QuotaLabel:
    """The `quota` label of draquota_quota_denials_total: the quota's ref (a DeviceQuota's
    name, `ClusterDeviceQuota/<name>` for a team) as the first `limit` distinct (namespace,
    quota) pairs seen name it, "other" after. Quotas are the admins' objects, so only they
    grow the set; the limit holds even against a cluster with more quotas than a dashboard
    should draw."""

    def __init__(self, *, limit: int = MAX_QUOTA_VALUES) -> None:
        self._limit = limit
        self._named: set[tuple[str, str]] = set()

    def __call__(self, namespace: str, quota: str) -> str:
        key = (namespace, quota)
        if key in self._named:
            return quota
        if len(self._named) >= self._limit:
            return OTHER
        self._named.add(key)
        return quota


def decision_of(verdict: Verdict) -> Decision:
    """`warned`: admitted with warnings (an Audit quota over, no device matching now, ...)."""
    if not verdict.allowed:
        return "denied"
    return "warned" if verdict.warnings else "allowed"


def _admin_action(record: PolicyRecord) -> AdminAction:
    return _ADMIN_ACTIONS.get(record.kind, "claim")


# -- the metrics ------------------------------------------------------------------------------


class Metrics:
    """The process's registry and the metrics the server and the recorder update."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # process-wide; module doc
        self.registry = registry if registry is not None else CollectorRegistry()
        # `serve` points `namespace.has_quota` at the ledger once the caches exist.
        self.namespace = NamespaceLabel()
        self.requests = Counter(
            ADMISSION_REQUESTS, "Admission reviews answered, by webhook (validating|mutating), operation, "
            "resource (plural[/subresource]), decision (allowed|denied|warned), reason (why denied or warned: "
            f"{'|'.join(CAUSES)}) and namespace (one that holds a DeviceQuota, at most {MAX_NAMESPACE_VALUES}; "
            "else other).",
            ["webhook", "operation", "resource", "decision", "reason", "namespace"], registry=self.registry)
        self.quota = QuotaLabel()
        self.quota_denials = Counter(
            QUOTA_DENIALS, "Claim and template reviews a quota denied (decision denied) or, in Audit or with the "
            "account-only allocation check, admitted over its hard (decision warned), by namespace (as "
            f"{ADMISSION_REQUESTS}), quota (a DeviceQuota's name, ClusterDeviceQuota/<name> for a team; at most "
            f"{MAX_QUOTA_VALUES}, else other) and resource (resourceclaims: a claim's create; "
            "resourceclaimtemplates: a template's; resourceclaims/status: an allocation). One per quota: a "
            "review two quotas deny counts for each.",
            ["namespace", "quota", "decision", "resource"], registry=self.registry)
        self.duration = Histogram(
            ADMISSION_DURATION, "Seconds from reading an admission review to its answer, by webhook, operation and "
            "resource.", ["webhook", "operation", "resource"], buckets=DURATION_BUCKETS, registry=self.registry)
        self.admin_access = Counter(
            ADMIN_ACCESS_DECISIONS, "adminAccess policy decisions (dryRun excluded), by outcome (granted|refused) and "
            "action (claim|template|namespace_label).", ["outcome", "action"], registry=self.registry)
        self.events_dropped = Counter(
            EVENTS_DROPPED, "Kubernetes Events not recorded, by reason (queue_full: the recorder's queue for the "
            "namespace was full; write_failed: the API server refused or did not answer).", ["reason"], registry=self.registry)
        self.events_written = Counter(
            EVENTS_WRITTEN, "Kubernetes Event writes that succeeded, by operation (create: a new Event; patch: the "
            "count of a series).", ["operation"], registry=self.registry)
        self.reconcile = Histogram(
            RECONCILE_DURATION, "Seconds one pass of the quota controller took to compute and write the status of "
            "every DeviceQuota that changed since the last (conflicts retried included, the debounce wait "
            "excluded). Only the replica holding the Lease reconciles; the others export an empty histogram.",
            buckets=RECONCILE_BUCKETS, registry=self.registry)
        self.allocation_wait = Histogram(
            ALLOCATION_WAIT, "Seconds from a claim's creation (metadata.creationTimestamp) to its allocation as "
            "the replica holding the Lease first sees it allocated, by namespace (one that holds a DeviceQuota, at "
            f"most {MAX_NAMESPACE_VALUES}; else other). Observed once per claim, when the leader records its "
            "allocated charge; the other replicas export an empty histogram.", ["namespace"],
            buckets=WAIT_BUCKETS, registry=self.registry)
        self.annotations_refused = Counter(
            ANNOTATIONS_REFUSED, "The leader's writes of a claim's annotations (its allocation record, or its charge) "
            "that the claim's own content refused (annotations or the object at the API server's size limit), by "
            f"namespace (one that holds a DeviceQuota, at most {MAX_NAMESPACE_VALUES}; else other). Such a claim is "
            "counted at its reservation by a replica that starts without its record, and its next allocation is "
            "checked whole (docs/development/reservations.md).", ["namespace"], registry=self.registry)
        self.stall = Histogram(
            EVENT_LOOP_STALL, "Seconds the event loop ran a timer late (runtime.stalls: how long any ready review "
            "waited on other work), one observation per tick.", buckets=STALL_BUCKETS, registry=self.registry)
        self.stall_max = Gauge(EVENT_LOOP_STALL_MAX, "The longest event loop stall since the process started, "
                               "seconds.", registry=self.registry)
        self.stall_cpu_max = Gauge(
            EVENT_LOOP_STALL_CPU_MAX, "The longest event loop stall since the process started counting only what "
            "the loop's own thread was on the CPU for (runtime.stalls: serve's own work; the rest of a stall is "
            "the node's other processes), seconds.", registry=self.registry)
        gc_pause = Histogram(
            GC_PAUSE, "Seconds each pass of Python's cyclic garbage collector held the event loop, by generation "
            "(2: a full collection; kube.rebuilds schedules them), one observation per pass.", ["generation"],
            buckets=STALL_BUCKETS, registry=self.registry)
        self._gc_pauses = tuple(gc_pause.labels(str(generation)) for generation in range(3))
        build = Gauge(BUILD_INFO, "Always 1; the version of dra-quota and of Python serving.",
                      ["version", "python_version"], registry=self.registry)
        build.labels(version(), platform.python_version()).set(1)
        # Zeros from the start, so rate() and alerts see the series before the first event.
        for outcome in ("granted", "refused"):
            for action in ("claim", "template", "namespace_label"):
                self.admin_access.labels(outcome, action)
        for reason in ("queue_full", "write_failed"):
            self.events_dropped.labels(reason)
        for operation in ("create", "patch"):
            self.events_written.labels(operation)
        # labels() validates and locks on every call; the label sets are closed, so the
        # children are cached here: 1.7 µs per review instead of 6.4 (measured on a shared
        # 2-core machine, noisy), against a 200 µs in-process review budget.
        self._children: dict[tuple[str, ...], tuple[Counter, Histogram]] = {}
        self._rendered: list[Callable[[], Sequence[bytes]]] = []
        self._stall_max = self._stall_cpu_max = 0.0

    def review(self, path: str, review: AdmissionRequest | None, verdict: Verdict, seconds: float) -> None:
        """Count one answered review (`webhook.server.Observer`)."""
        webhook = _WEBHOOKS.get(path, "other")
        operation = review.operation if review is not None and review.operation in _OPERATIONS else "unknown"
        namespace = self.namespace(review.namespace) if review is not None else OTHER
        key = (webhook, operation, resource_of(review), decision_of(verdict), verdict.cause, namespace)
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = (self.requests.labels(*key), self.duration.labels(*key[:3]))
        children[0].inc()
        children[1].observe(seconds)
        if verdict.cause == "quota" and review is not None:
            for quota in verdict.quotas:
                self.quota_denials.labels(namespace, self.quota(review.namespace, quota), key[3], key[2]).inc()
        if review is not None and not review.dry_run:  # a dry run grants nothing
            for record in verdict.records:
                self.admin_access.labels(record.outcome, _admin_action(record)).inc()

    def allocated(self, namespace: str, seconds: float) -> None:
        """A claim of `namespace` waited `seconds` from creation to allocation
        (`controllers.annotator.Annotator`'s hook)."""
        self.allocation_wait.labels(self.namespace(namespace)).observe(max(seconds, 0.0))

    def unrecorded(self, namespace: str) -> None:
        """The leader could not write a claim of `namespace`'s annotations: its content refused them."""
        self.annotations_refused.labels(self.namespace(namespace)).inc()

    def stalled(self, seconds: float, cpu: float) -> None:
        """One tick of `runtime.stalls.watch`: the loop ran its timer `seconds` late, `cpu`
        of them on the CPU itself."""
        self.stall.observe(seconds)
        if seconds > self._stall_max:
            self._stall_max = seconds
            self.stall_max.set(seconds)
        if cpu > self._stall_cpu_max:
            self._stall_cpu_max = cpu
            self.stall_cpu_max.set(cpu)

    def collected(self, generation: int, seconds: float) -> None:
        """One pass of the cyclic collector (`runtime.stalls.time_collections`)."""
        self._gc_pauses[min(generation, 2)].observe(seconds)

    def connections(self, listeners: Mapping[str, Connections]) -> None:
        """Expose each listener's connections by phase and those it dropped (read at each scrape)."""
        self.registry.register(_Collect(lambda: _connection_metrics(listeners)))

    def watch(self, reflectors: Callable[[], Iterable[Reflector]]) -> None:
        """Expose the reflectors' state (read at each scrape)."""
        self.registry.register(_Collect(lambda: _reflector_metrics(reflectors())))

    def contact(self, reachable: Callable[[], bool]) -> None:
        """Expose whether the API server answers this replica's probe (`kube.contact`)."""
        def collect() -> Iterator[Metric]:
            gauge = GaugeMetricFamily(API_SERVER_REACHABLE, "1 while the API server answers this replica's probe; 0 "
                                      "once it has not for 10 s: not ready, and reviews are answered 503 so the "
                                      "webhooks' failurePolicy decides.")
            gauge.add_metric([], 1.0 if reachable() else 0.0)
            yield gauge

        self.registry.register(_Collect(collect))

    def leases(self, book: LeaseBook) -> None:
        """Expose the reservations admitted by path, the lease writes by outcome and the
        room the leases hold (read at each scrape)."""
        self.registry.register(_Collect(lambda: _lease_metrics(book)))

    def annotations(self, pending: Callable[[], int], writers: Callable[[], int]) -> None:
        """Expose the leader's backlog of charges to write on claims and its writers (read
        at each scrape; `controllers.annotator`)."""
        self.registry.register(_Collect(lambda: _annotation_metrics(pending(), writers())))

    def requeue(self, credits: Callable[[], int], writes: Callable[[], int], pending: Callable[[], int]) -> None:
        """Expose what the requeue of waiting Pods was granted, wrote and still owes (read
        at each scrape; `controllers.requeue`)."""
        self.registry.register(_Collect(lambda: _requeue_metrics(credits(), writes(), pending())))

    def applied_writes(self, writes: Callable[[], Mapping[AppliedReason, int]]) -> None:
        """Expose the leader's AppliedClusterDeviceQuota writes by reason (read at each
        scrape; `controllers.applied`)."""
        self.registry.register(_Collect(lambda: _applied_metrics(writes())))

    def certificates(self, expirations: Callable[[], Iterable[tuple[str, datetime]]]) -> None:
        """Expose certificate expiry: `expirations` yields (which, notAfter), e.g. ("serving", ...), ("ca", ...)."""
        self.registry.register(_Collect(lambda: _certificate_metrics(expirations())))

    def collect(self, collect: Callable[[], Iterable[Metric]]) -> None:
        """Expose the families `collect` builds at each scrape (`webhook.usagemetrics`)."""
        self.registry.register(_Collect(collect))

    def rendered(self, text: Callable[[], Sequence[bytes]]) -> None:
        """Append the pieces `text()` returns to each scrape: families already rendered (by
        `render`) and cached by their owner, for those with tens of thousands of samples
        (rendering costs ~10 µs a sample). Not in `registry`, so `get_sample_value` does
        not see them."""
        self._rendered.append(text)

    def exposition_parts(self) -> list[bytes]:
        """What `GET /metrics` serves, in pieces (module doc: with pause points between),
        never joined: a scrape of 150,000 claims is tens of MB, and each copy of it
        in one piece held the loop 20-40 ms (bench/stalls.py). `webhook.metricsserver`
        writes them as they are."""
        parts = []
        for family in self.registry.collect():
            parts.append(_render_family(family))
            pause_point()
        for text in self._rendered:
            parts.extend(text())
        return parts

    def exposition(self) -> bytes:
        """`exposition_parts`, joined (tests, benchmarks)."""
        return b"".join(self.exposition_parts())


def _render_family(family: Metric) -> bytes:
    """`render([family])`; a gauge's samples `RENDER_CHUNK` at a time, pausing between
    (a gauge has no `_created`-style samples that the format groups after the others)."""
    if family.type != "gauge" or len(family.samples) <= RENDER_CHUNK:
        return render([family])
    part = Metric(family.name, family.documentation, family.type, family.unit)
    parts = [render([part])]  # its HELP and TYPE lines
    for start in range(0, len(family.samples), RENDER_CHUNK):
        pause_point()
        part.samples = family.samples[start:start + RENDER_CHUNK]
        parts.append(render([part]).split(b"\n", 2)[2])
    return b"".join(parts)


def render(families: Iterable[Metric]) -> bytes:
    """`families` in the text format, as a scrape shows them (prometheus_client escapes)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collect(lambda: families))
    return generate_latest(registry)


class _Collect(Collector):
    def __init__(self, collect: Callable[[], Iterable[Metric]]) -> None:
        self._collect = collect

    def collect(self) -> Iterable[Metric]:
        return self._collect()


def _reflector_metrics(reflectors: Iterable[Reflector]) -> Iterator[Metric]:
    synced = GaugeMetricFamily(WATCH_SYNCED, "1 once the resource's cache has listed completely (readiness "
                               "needs every one), else 0.", labels=["resource"])
    restarts = CounterMetricFamily(WATCH_RESTARTS, "Watches reopened after an error, a silent connection or a "
                                   "410 Gone, by resource.", labels=["resource"])
    relists = CounterMetricFamily(WATCH_RELISTS, "Complete lists after a 410 Gone (the watch fell too far "
                                  "behind), by resource.", labels=["resource"])
    for r in reflectors:
        synced.add_metric([r.resource.plural], 1.0 if r.synced.is_set() else 0.0)
        restarts.add_metric([r.resource.plural], r.stats.restarts)
        relists.add_metric([r.resource.plural], r.stats.relists)
    yield from (synced, restarts, relists)


def _connection_metrics(listeners: Mapping[str, Connections]) -> Iterator[Metric]:
    gauge = GaugeMetricFamily(CONNECTIONS, "Connections open on a listener (webhook, metrics), by phase (opening, "
                              "headers, request, deciding, idle: webhook.connections).", labels=["listener", "phase"])
    dropped = CounterMetricFamily(CONNECTIONS_DROPPED, "Connections a listener dropped, by reason (evicted or refused "
                                  "at its cap; opening, headers, request, idle: that phase's deadline passed; "
                                  "shutdown).", labels=["listener", "reason"])
    for listener, connections in listeners.items():
        for phase, count in connections.counts().items():
            gauge.add_metric([listener, phase.name.lower()], count)
        for reason in DROP_REASONS:
            dropped.add_metric([listener, reason], connections.dropped[reason])
    yield from (gauge, dropped)


def _lease_metrics(book: LeaseBook) -> Iterator[Metric]:
    admitted = CounterMetricFamily(RESERVATION_ADMISSIONS, "Reservations admitted into a DeviceQuota or "
                                   "ClusterDeviceQuota, one per quota of each admitted claim or Workload, by path "
                                   "(lease: under this process's lease, no write; exact: an entry of its own, "
                                   "persisted). dryRun excluded.", labels=["path"])
    writes = CounterMetricFamily(LEASE_WRITES, "Status writes that changed this process's lease entry, by outcome "
                                 "(granted, renewed, shrunk: to what it admitted and has not settled, released), and "
                                 "lease writes refused by the DeviceQuota CRD's schema (refused: leases off for 5 "
                                 "minutes) or whose outcome is unknown (uncertain: the entry left to expire).",
                                 labels=["outcome"])
    room = GaugeMetricFamily(LEASE_ROOM, "What this process's leases hold, summed over quotas, by resource (memory "
                             "in bytes, devices a count).", labels=["resource"])
    for path in PATHS:
        admitted.add_metric([path], book.stats.admitted[path])
    for outcome in WRITE_OUTCOMES:
        writes.add_metric([outcome], book.stats.writes[outcome])
    held = book.room()
    room.add_metric(["memory"], held.memory)
    room.add_metric(["devices"], held.devices)
    yield from (admitted, writes, room)


def _annotation_metrics(pending: int, writers: int) -> Iterator[Metric]:
    yield GaugeMetricFamily(ANNOTATIONS_PENDING, "Claims whose charge annotations the leader has yet to write. Each "
                            "keeps its entry in its quota's status.reservations until written: a backlog that grows "
                            "is a record that grows.", value=pending)
    yield GaugeMetricFamily(ANNOTATION_WRITERS, "Charge annotation patches the leader may have in flight: 16, more "
                            "while a backlog lasts (up to 64).", value=writers)


def _requeue_metrics(credits: int, writes: int, pending: int) -> Iterator[Metric]:
    yield CounterMetricFamily(REQUEUE_CREDITS, "Template writes granted to the requeue of waiting Pods: one per "
                              "deleted claim, each buying one touch of a template waited on and its settle.",
                              value=credits)
    yield CounterMetricFamily(REQUEUE_WRITES, "ResourceClaimTemplate patches the leader's requeue sent: at most 2 "
                              "per credit.", value=writes)
    yield GaugeMetricFamily(REQUEUE_PENDING, "Template writes the requeue still owes: credits not spent, settles "
                            "due, writes in flight; 0 when idle.", value=pending)


def _applied_metrics(writes: Mapping[AppliedReason, int]) -> Iterator[Metric]:
    family = CounterMetricFamily(APPLIED_QUOTA_WRITES, "AppliedClusterDeviceQuota applies and deletes the leader "
                                 "made, by reason: own (a namespace's own part changed: one per claim event at "
                                 "most), refresh (team totals, each copy at most once per refresh period), spec "
                                 "(the team's spec or members changed), delete (a namespace left).",
                                 labels=["reason"])
    for reason in APPLIED_REASONS:
        family.add_metric([reason], writes.get(reason, 0))
    yield family


def _certificate_metrics(expirations: Iterable[tuple[str, datetime]]) -> Iterator[Metric]:
    gauge = GaugeMetricFamily(CERTIFICATE_EXPIRATION, "notAfter of the certificate served (serving) and of the CA "
                              "signing it when self-managed (ca), in seconds since the Unix epoch.",
                              labels=["certificate"])
    for which, not_after in expirations:
        gauge.add_metric([which], not_after.timestamp())
    yield gauge


