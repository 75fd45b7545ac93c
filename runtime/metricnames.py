"""Every metric name `dra-quota serve` exposes, and nothing else: naming a metric imports no admission code.

Neighbours: `webhook.metrics` defines each metric (help, labels, buckets) under these
names and `webhook.usagemetrics` the usage families; the Grafana and alert tests
(tests/unit/deploy) check every dashboard query against them; tests and benchmarks read
them from here. Constants only.
"""

__all__ = [
    "ADMIN_ACCESS_DECISIONS",
    "ADMISSION_DURATION",
    "ADMISSION_REQUESTS",
    "APPLIED_QUOTA_WRITES",
    "QUOTA_DENIALS",
    "ALLOCATED_DEVICE_SECONDS",
    "ALLOCATED_MEMORY_SECONDS",
    "ALLOCATION_WAIT",
    "ANNOTATIONS_REFUSED",
    "API_SERVER_REACHABLE",
    "BUILD_INFO",
    "CERTIFICATE_EXPIRATION",
    "CLAIM_DEVICE_INFO",
    "CLUSTER_QUOTA",
    "CLUSTER_QUOTA_NAMESPACE",
    "CONNECTIONS",
    "CONNECTIONS_DROPPED",
    "EVENTS_DROPPED",
    "EVENTS_WRITTEN",
    "EVENT_LOOP_STALL",
    "EVENT_LOOP_STALL_CPU_MAX",
    "EVENT_LOOP_STALL_MAX",
    "GC_PAUSE",
    "INVENTORY_ALLOCATED",
    "INVENTORY_DEVICES",
    "INVENTORY_MEMORY",
    "LEADER",
    "LEASE_ROOM",
    "ANNOTATIONS_PENDING",
    "ANNOTATION_WRITERS",
    "LEASE_WRITES",
    "NAMES",
    "NAMESPACE_USAGE",
    "PENDING_CLAIMS",
    "QUOTA",
    "RECONCILE_DURATION",
    "REQUEUE_CREDITS",
    "REQUEUE_PENDING",
    "REQUEUE_WRITES",
    "RESERVATION_ADMISSIONS",
    "WATCH_RELISTS",
    "WATCH_RESTARTS",
    "WATCH_SYNCED",
    "WORKLOADS_RESERVED",
]

# The exposed names, `_total` included.
ADMISSION_REQUESTS = "draquota_admission_requests_total"
# Claims and templates a quota denied (or, Audit, admitted over its hard), by that quota.
QUOTA_DENIALS = "draquota_quota_denials_total"
ADMISSION_DURATION = "draquota_admission_duration_seconds"
ADMIN_ACCESS_DECISIONS = "draquota_admin_access_decisions_total"
WATCH_SYNCED = "draquota_watch_cache_synced"
WATCH_RESTARTS = "draquota_watch_restarts_total"
WATCH_RELISTS = "draquota_watch_relists_total"
CERTIFICATE_EXPIRATION = "draquota_certificate_expiration_timestamp_seconds"
EVENTS_DROPPED = "draquota_events_dropped_total"
EVENTS_WRITTEN = "draquota_events_written_total"
BUILD_INFO = "draquota_build_info"
LEADER = "draquota_leader"
QUOTA = "draquota_quota"
# A ClusterDeviceQuota's (a team's) totals, and each selected namespace's part of them.
CLUSTER_QUOTA = "draquota_cluster_quota"
CLUSTER_QUOTA_NAMESPACE = "draquota_cluster_quota_namespace"
NAMESPACE_USAGE = "draquota_namespace_device_usage"
INVENTORY_DEVICES = "draquota_inventory_devices"
INVENTORY_MEMORY = "draquota_inventory_memory_bytes"
INVENTORY_ALLOCATED = "draquota_inventory_allocated_devices"
CLAIM_DEVICE_INFO = "draquota_claim_device_info"
RECONCILE_DURATION = "draquota_reconcile_duration_seconds"
# draquota_quota{type="reserved"} by source (status.reservedBy): a series of its own, so
# the kube_resourcequota-shaped one keeps its labels.
WORKLOADS_RESERVED = "draquota_quota_reserved_workloads"
# Claims existing unallocated per namespace (kueue_pending_workloads' counterpart).
PENDING_CLAIMS = "draquota_namespace_pending_claims"
# Creation to allocation of each claim, as the leader sees it (kueue_admission_wait_time_seconds').
ALLOCATION_WAIT = "draquota_claim_allocation_wait_seconds"
# The leader's writes of our annotations that a claim's own content refused (controllers.annotator).
ANNOTATIONS_REFUSED = "draquota_claim_annotations_refused"
EVENT_LOOP_STALL = "draquota_event_loop_stall_seconds"
EVENT_LOOP_STALL_MAX = "draquota_event_loop_stall_max_seconds"
# The same, counting only what the loop's own thread held the CPU for (runtime.stalls).
EVENT_LOOP_STALL_CPU_MAX = "draquota_event_loop_stall_cpu_max_seconds"
# How long each pass of the cyclic collector held the loop, by generation (runtime.stalls).
GC_PAUSE = "draquota_gc_pause_seconds"
# webhook.connections: open connections by listener and phase, and those it dropped.
CONNECTIONS = "draquota_connections"
CONNECTIONS_DROPPED = "draquota_connections_dropped_total"
# kube.leasebook: reservations admitted by path (lease, exact), this process's lease
# writes by outcome, and the room its leases hold.
RESERVATION_ADMISSIONS = "draquota_reservation_admissions_total"
LEASE_WRITES = "draquota_lease_writes_total"
LEASE_ROOM = "draquota_lease_room"
# controllers.annotator: claims whose charge the leader has yet to write, and its writers.
ANNOTATIONS_PENDING = "draquota_charge_annotations_pending"
ANNOTATION_WRITERS = "draquota_charge_annotation_writers"
# controllers.requeue: credits granted (one per deleted claim), template writes sent, and
# the writes still owed (0: every deletion answered and settled).
REQUEUE_CREDITS = "draquota_requeue_credits_total"
REQUEUE_WRITES = "draquota_requeue_template_writes_total"
REQUEUE_PENDING = "draquota_requeue_pending_writes"
# controllers.applied: AppliedClusterDeviceQuota writes by reason (own, refresh, spec, delete).
APPLIED_QUOTA_WRITES = "draquota_applied_quota_writes_total"
# kube.contact: 1 while the API server answers this replica's probe, 0 once it has not for the grace.
API_SERVER_REACHABLE = "draquota_api_server_reachable"
# webhook.showbackmetrics: device memory and devices allocated, integrated over time (the leader's).
ALLOCATED_MEMORY_SECONDS = "draquota_allocated_memory_byte_seconds_total"
ALLOCATED_DEVICE_SECONDS = "draquota_allocated_device_seconds_total"
NAMES = (ADMISSION_REQUESTS, QUOTA_DENIALS, ADMISSION_DURATION, ADMIN_ACCESS_DECISIONS, WATCH_SYNCED, WATCH_RESTARTS,
         WATCH_RELISTS, CERTIFICATE_EXPIRATION, EVENTS_DROPPED, EVENTS_WRITTEN, BUILD_INFO, LEADER, QUOTA, CLUSTER_QUOTA,
         CLUSTER_QUOTA_NAMESPACE, NAMESPACE_USAGE, INVENTORY_DEVICES, INVENTORY_MEMORY, INVENTORY_ALLOCATED,
         CLAIM_DEVICE_INFO, RECONCILE_DURATION, WORKLOADS_RESERVED, PENDING_CLAIMS, ALLOCATION_WAIT, EVENT_LOOP_STALL,
         EVENT_LOOP_STALL_MAX, EVENT_LOOP_STALL_CPU_MAX, GC_PAUSE, CONNECTIONS, CONNECTIONS_DROPPED,
         RESERVATION_ADMISSIONS, LEASE_WRITES, LEASE_ROOM, ANNOTATIONS_PENDING, ANNOTATION_WRITERS,
         REQUEUE_CREDITS, REQUEUE_WRITES, REQUEUE_PENDING, APPLIED_QUOTA_WRITES, API_SERVER_REACHABLE,
         ALLOCATED_MEMORY_SECONDS, ALLOCATED_DEVICE_SECONDS)
