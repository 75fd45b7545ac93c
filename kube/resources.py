"""Every API resource dra-quota reads or writes, named once, with the verbs it uses on each.

Neighbours: `kube.api.Resource` is the type (its `path` builds the URLs); the caches
(`commands.serve`), the controllers, the webhook's helpers and the status writer
(`kube.statuswriter`) name their collections from here rather than spelling out groups,
versions and plurals. As kopf's `_cogs/structs/references.py` keeps the resources the
framework itself uses beside the `Resource` type. Our own CRD's coordinates come from
`quota.quotas.devicequota`, the pure model of it.

`VERBS` says what `dra-quota serve` does with each collection (and subresource), every
entry naming the code that does it: the chart's RBAC (deploy/helm/dra-quota/templates)
must grant exactly these, no more, no fewer (tests/unit/kube/test_resources.py renders
the chart with every optional part on and compares; tests/e2e/test_chart.py runs `serve`
with those rights).
"""

from __future__ import annotations

from collections.abc import Mapping

from kube.api import Resource
from quota.quotas.devicequota import CLUSTER_PLURAL, GROUP, PLURAL, VERSION
from quota.status.applied import APPLIED_PLURAL

__all__ = [
    "ACCESS_REVIEWS",
    "ADMISSION_CHECKS",
    "APPLIED_QUOTAS",
    "CLAIMS",
    "CLASSES",
    "CLUSTER_QUOTAS",
    "CONFIGMAPS",
    "EVENTS",
    "KUEUE",
    "LEASES",
    "MUTATING_WEBHOOKS",
    "NAMESPACES",
    "NON_RESOURCE_URLS",
    "PODS",
    "QUOTAS",
    "RESOURCE_V1",
    "SECRETS",
    "SLICES",
    "TEMPLATES",
    "TOKEN_REVIEWS",
    "VALIDATING_WEBHOOKS",
    "VERBS",
    "WORKLOADS",
    "quota_resource",
]

RESOURCE_V1 = "resource.k8s.io/v1"
KUEUE = "kueue.x-k8s.io/v1beta2"

QUOTAS = Resource(f"{GROUP}/{VERSION}", PLURAL)
CLUSTER_QUOTAS = Resource(f"{GROUP}/{VERSION}", CLUSTER_PLURAL)
APPLIED_QUOTAS = Resource(f"{GROUP}/{VERSION}", APPLIED_PLURAL)
CLAIMS = Resource(RESOURCE_V1, "resourceclaims")
TEMPLATES = Resource(RESOURCE_V1, "resourceclaimtemplates")
SLICES = Resource(RESOURCE_V1, "resourceslices")
CLASSES = Resource(RESOURCE_V1, "deviceclasses")
NAMESPACES = Resource("v1", "namespaces")
PODS = Resource("v1", "pods")
CONFIGMAPS = Resource("v1", "configmaps")
SECRETS = Resource("v1", "secrets")
EVENTS = Resource("events.k8s.io/v1", "events")
LEASES = Resource("coordination.k8s.io/v1", "leases")
WORKLOADS = Resource(KUEUE, "workloads")
ADMISSION_CHECKS = Resource(KUEUE, "admissionchecks")
TOKEN_REVIEWS = Resource("authentication.k8s.io/v1", "tokenreviews")
ACCESS_REVIEWS = Resource("authorization.k8s.io/v1", "subjectaccessreviews")
VALIDATING_WEBHOOKS = Resource("admissionregistration.k8s.io/v1", "validatingwebhookconfigurations")
MUTATING_WEBHOOKS = Resource("admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations")

# (collection, subresource) -> the verbs `serve` uses there, each optional part included
# (--requeue-waiting-pods, --kueue, --metrics-secure, --cert-mode self).
VERBS: Mapping[tuple[Resource, str], frozenset[str]] = {
    # The caches (commands.serve Caches): one kube.watching.Reflector each, list then watch.
    (SLICES, ""): frozenset({"list", "watch"}),
    (CLASSES, ""): frozenset({"list", "watch"}),
    # ... and the leader's annotations on claims (controllers.annotator, a merge patch).
    (CLAIMS, ""): frozenset({"list", "watch", "patch"}),
    # ... and the governed label (controllers.governed).
    (NAMESPACES, ""): frozenset({"list", "watch", "patch"}),
    # ... and a re-read after a conflict or for a dryRun check (kube.statuswriter).
    (QUOTAS, ""): frozenset({"get", "list", "watch"}),
    # Reservations and the controller's fields: a conditional PUT (kube.statuswriter).
    (QUOTAS, "status"): frozenset({"update"}),
    # ClusterDeviceQuotas (team quotas): the same, cluster-scoped.
    (CLUSTER_QUOTAS, ""): frozenset({"get", "list", "watch"}),
    (CLUSTER_QUOTAS, "status"): frozenset({"update"}),
    # Each team's numbers in its member namespaces (controllers.applied AppliedQuotas):
    # list its own on start, server-side apply (which creates: create and patch), delete
    # when a namespace leaves.
    (APPLIED_QUOTAS, ""): frozenset({"list", "create", "patch", "delete"}),
    # Requeue (controllers.requeue) lists unscheduled Pods (metadata), reads a few, touches
    # their templates;
    # Kueue (controllers.kueue) caches both and reads one Pod its cache lacks.
    (PODS, ""): frozenset({"get", "list", "watch"}),
    (TEMPLATES, ""): frozenset({"list", "watch", "patch"}),
    (WORKLOADS, ""): frozenset({"list", "watch"}),
    (ADMISSION_CHECKS, ""): frozenset({"list", "watch"}),
    # Server-side apply of our parts (controllers.kueue AdmissionCheckController).
    (WORKLOADS, "status"): frozenset({"patch"}),
    (ADMISSION_CHECKS, "status"): frozenset({"patch"}),
    # Events (kube.events KubeSink): create the first occurrence, patch its series.
    (EVENTS, ""): frozenset({"create", "patch"}),
    # Leader election (controllers.leader LeaderElector).
    (LEASES, ""): frozenset({"create", "get", "update"}),
    # The adminAccess allowlist (webhook.adminpolicy), one ConfigMap watched.
    (CONFIGMAPS, ""): frozenset({"list", "watch"}),
    # --metrics-secure (webhook.metricsserver TokenAccess).
    (TOKEN_REVIEWS, ""): frozenset({"create"}),
    # The same, and who may label adminaccess.draquota.io (webhook.labelaccess LabelAccess).
    (ACCESS_REVIEWS, ""): frozenset({"create"}),
    # --cert-mode self (webhook.certificates KubeStore): our Secret, our configurations' caBundle.
    (SECRETS, ""): frozenset({"create", "get", "update"}),
    (VALIDATING_WEBHOOKS, ""): frozenset({"get", "patch"}),
    (MUTATING_WEBHOOKS, ""): frozenset({"get", "patch"}),
}

# The API server's own endpoints serve reads, with the verbs: granted by the chart exactly
# as `VERBS` (the same test). The reachability probe (kube.contact Contact) reads /readyz:
# granted, not left to system:public-info-viewer, which hardened clusters unbind.
NON_RESOURCE_URLS: Mapping[str, frozenset[str]] = {"/readyz": frozenset({"get"})}


def quota_resource(namespace: str) -> tuple[Resource, str | None]:
    """The collection of the quota keyed `(namespace, name)` and the namespace of its path:
    a ClusterDeviceQuota's key has no namespace (`quota.accounting.ledger.QuotaKey`)."""
    return (QUOTAS, namespace) if namespace else (CLUSTER_QUOTAS, None)
