"""`dra-quota serve`'s configuration: its options, its logging, the adminAccess policy's source.

Neighbours: `commands.servecommand` parses the flags into `ServeOptions` and sets up logging
(`configure_logging`) before `commands.serve.serve` runs; `webhook.adminpolicy` reads
the policy `policy_source` names. No I/O but reading a policy file.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from quota.admission.policy import PolicyError
from quota.devices.memorysources import MemorySources, default_memory_sources
from quota.status.breakdown import DEFAULT_SERIES
from quota.status.leases import Timing
from quota.values.model import Mode
from runtime.logbounds import CutLongMessages
from webhook.adminpolicy import PolicySource
from webhook.certificates import SelfManaged
from webhook.claimreview import AllocationCheck
from webhook.connections import Limits
from webhook.metrics import DEFAULT_METRICS_PORT

__all__ = ["JsonFormatter", "LeaderElection", "ServeError", "ServeOptions", "configure_logging", "policy_source"]


class ServeError(Exception):
    """A start-up failure worth one line (bad flag value, unreadable file)."""


@dataclass(frozen=True, slots=True)
class LeaderElection:
    lease_name: str = "dra-quota-controller"
    lease_namespace: str = "dra-quota-system"
    timing: Timing = Timing()
    identity: str = ""  # "": controllers.leader.default_identity() (POD_NAME, else the host name)


@dataclass(frozen=True, slots=True)
class ServeOptions:
    # --cert-mode files: both paths; --cert-mode self: `certificates`, and no paths.
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    certificates: SelfManaged | None = None
    kubeconfig: str | None = None  # None: $KUBECONFIG, in-cluster, ~/.kube/config (kube.credentials)
    bind_address: str = "0.0.0.0"
    port: int = 8443
    # The adminAccess allowlist: a file polled every policy_poll_seconds, or a ConfigMap
    # (namespace, name) watched through the API; at most one (webhook.adminpolicy).
    admin_access_policy: Path | None = None
    admin_access_configmap: tuple[str, str] | None = None
    policy_poll_seconds: float = 5.0
    allocation_check: AllocationCheck = "enforce"
    default_pricing: Mode = "conservative"
    # Where devices whose driver publishes no `memory` get theirs (quota.devices.memorysources):
    # the shipped defaults, each file replacing the drivers it names.
    memory_sources: MemorySources = field(default_factory=default_memory_sources)
    cert_poll_seconds: float = 5.0
    # How long a persisted reservation whose claim never appears holds before any replica
    # may drop it (quota.accounting.reservations: longer than the API server's request timeout plus
    # any replica's claim watch lag).
    reservation_ttl: float = 120.0
    # A replica's lease on a DeviceQuota's headroom (quota.accounting.headroom); 0: none.
    lease_period: float = 5.0
    # How far replicas' clocks may differ: a quota's windows apply their lower limits this
    # much early and their higher ones this much late (quota.quotas.windows).
    clock_skew: float = 5.0
    # SO_REUSEPORT: several processes on one host serve one port (the e2e test's replicas).
    reuse_port: bool = False
    # In-flight reviews get this long to finish after SIGTERM; the API server's webhook
    # timeout (timeoutSeconds, 5 in deploy/) bounds them anyway.
    shutdown_grace_seconds: float = 10.0
    # After SIGTERM, not ready (503) but still answering this long before the shutdown
    # sequence begins: the endpoints drop the Pod while it answers (`--shutdown-delay`).
    shutdown_delay_seconds: float = 0.0
    # Touch the templates Pods wait on when quota frees (controllers.requeue).
    requeue_waiting_pods: bool = True
    # GET /metrics (webhook.metricsserver); port 0: no metrics listener. Secure: HTTPS
    # with the serving certificate, to whom TokenReview + SubjectAccessReview allow;
    # else plain HTTP, on a loopback address only.
    metrics_bind_address: str = "0.0.0.0"
    metrics_port: int = DEFAULT_METRICS_PORT
    metrics_secure: bool = True
    # A ClusterDeviceQuota's per-namespace series: its N largest parts and one for the rest
    # (`quota.status.breakdown`), whatever its selector selects.
    team_namespace_series: int = DEFAULT_SERIES
    # The HTTPS listeners' connection cap and timeouts (webhook.connections).
    limits: Limits = Limits()
    # All replicas serve the webhooks; the one holding the Lease runs the quota
    # controller (controllers.leader, controllers.quotas). --no-webhook: no HTTPS listener
    # and no certificates at all (a controller-only Deployment).
    webhook: bool = True
    controller: bool = True
    leader_election: LeaderElection = LeaderElection()
    # Every quota's status is recomputed this often even without events (seconds).
    resync_seconds: float = 300.0
    # The team totals in a member's AppliedClusterDeviceQuota are refreshed at most this
    # often, but for an admin's change (controllers.applied): the tenant budget.
    team_totals_refresh_seconds: float = 60.0
    # The Kueue AdmissionCheck controller (controllers.kueue): "auto" runs it when the API
    # server serves kueue.x-k8s.io/v1beta2 workloads at start-up.
    kueue: Literal["auto", "on", "off"] = "auto"
    kueue_retry_seconds: int = 15


# -- logging ------------------------------------------------------------------------------------

# The fields webhook.server attaches to each review's log line.
_EXTRA_FIELDS = ("uid", "operation", "resource", "namespace", "object_name", "allowed", "duration_ms",
                 "suppressed")


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with the review fields a handler attached as `extra` (and
    `suppressed`: the count of a namespace's denials not logged, `webhook.decisionlog`)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        out.update({k: getattr(record, k) for k in _EXTRA_FIELDS if hasattr(record, k)})
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def configure_logging(log_format: Literal["text", "json"], level: str = "INFO") -> None:
    """`level` for our packages; libraries stay at INFO (asyncio and the kubeconfig loader
    are chatty at DEBUG and say nothing about reviews)."""
    handler = logging.StreamHandler()
    # Every line of either format: a message as long as a tenant's object (a denial's) is cut.
    handler.addFilter(CutLongMessages())
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=max(logging.INFO, logging.getLevelName(level.upper())), handlers=[handler], force=True)
    for package in ("quota", "runtime", "kube", "controllers", "webhook", "commands", "certs"):
        logging.getLogger(package).setLevel(level.upper())


# -- configuration ------------------------------------------------------------------------------


def policy_source(options: ServeOptions) -> PolicySource:
    """The adminAccess policy's source (`webhook.adminpolicy`); a file is read now."""
    if options.admin_access_configmap is not None:
        return PolicySource.from_configmap(*options.admin_access_configmap)
    if options.admin_access_policy is None:
        return PolicySource()
    try:
        return PolicySource.from_file(options.admin_access_policy, poll_seconds=options.policy_poll_seconds)
    except PolicyError as err:
        raise ServeError(f"--admin-access-policy {err}") from None
