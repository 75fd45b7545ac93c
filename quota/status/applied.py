"""AppliedClusterDeviceQuota: a team quota's numbers as one member namespace may see them.

Neighbours: `quota.status.published.team_usage` reads a ClusterDeviceQuota's published status (spec.hard,
the totals, each member's part); `controllers.applied` writes what `applied_quotas` returns
into the member namespaces and `quota.status.published.applied_usage` reads it back for `top -n`.
Built from the published status only, never from the ledger: kubectl on the team quota,
kubectl on its applied copy and `top` show one set of numbers.

An applied quota holds the team's `hard`, `used`, `reserved`, `claims`, its headroom
(hard - used - reserved, per limit set, never below 0), whether it is exceeded or not
counted yet, and this namespace's part; nothing of the other members, whose names and
usage the cluster-scoped object shows to whoever may read it. And how current the team's
numbers are: the team's generation they were counted for (`teamGeneration`), when the
leader read them (`teamObservedAt`) and how long after they move a copy may lag
(`teamRefreshSeconds`): the own part is written with each of this namespace's changes, the
team's totals at most once per refresh period (`quota.status.appliedplan`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from quota.quotas.devicequota import CLUSTER_KIND, GROUP, VERSION
from quota.status.published import team_usage
from quota.values.quantity import format_quantity
from quota.values.raw import Obj, as_map

__all__ = ["APPLIED_KIND", "APPLIED_PLURAL", "MANAGED_BY", "applied_quotas", "headroom"]

APPLIED_KIND = "AppliedClusterDeviceQuota"
APPLIED_PLURAL = "appliedclusterdevicequotas"
# The label every applied quota carries: the leader lists its own by it.
MANAGED_BY = ("app.kubernetes.io/managed-by", "dra-quota")


def applied_quotas(team: Mapping[str, Any], *, observed_at: str | None = None,
                   refresh_seconds: float | None = None) -> dict[str, Obj]:
    """Member namespace -> the AppliedClusterDeviceQuota to write there, one per namespace
    the team's `status.namespaces` lists (`QuotaError` when the object is unreadable).
    `observed_at` (RFC 3339): when the leader read the team's totals; `refresh_seconds`: how
    long after they move the copy may still show older ones (`quota.status.appliedplan`)."""
    row = team_usage(team)
    assert row is not None  # no namespace asked: every member
    meta = as_map(team.get("metadata"))
    owner = {"apiVersion": f"{GROUP}/{VERSION}", "kind": CLUSTER_KIND, "name": row["name"],
             "uid": meta.get("uid"), "controller": True}
    totals: dict[str, Any] = {
        "hard": _shown(row["hard"]), "used": _shown(row["used"]), "reserved": _shown(row["reserved"]),
        "headroom": _shown(headroom(row)), "claims": _present(row["claims"]),
        "exceeded": row["exceeded"], "counted": row["current"]}
    if isinstance(generation := meta.get("generation"), int):
        totals["teamGeneration"] = generation
    if observed_at is not None:
        totals["teamObservedAt"] = observed_at
    if refresh_seconds is not None:
        totals["teamRefreshSeconds"] = math.ceil(refresh_seconds)
    return {part["namespace"]: {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": APPLIED_KIND,
        "metadata": {"name": row["name"], "namespace": part["namespace"], "labels": dict([MANAGED_BY]),
                     "ownerReferences": [owner] if owner["uid"] else []},
        "status": {**totals, "namespace": {"name": part["namespace"], "used": _shown(part["used"]),
                                           "reserved": _shown(part["reserved"]), "claims": _present(part["claims"])}},
    } for part in row["namespaces"]}


def headroom(row: Mapping[str, Any]) -> dict[str, int | None]:
    """hard - used - reserved for each limit set (None where no limit), at least 0; an
    amount the status does not carry counts as 0."""
    return {resource: None if hard is None else max(0, hard - (row["used"][resource] or 0)
                                                     - (row["reserved"][resource] or 0))
            for resource, hard in row["hard"].items()}


def _shown(amounts: Mapping[str, int | None]) -> dict[str, str | int]:
    """Memory as a quantity (as on the ClusterDeviceQuota), devices as a count; unset left out."""
    return {resource: format_quantity(value) if resource == "memory" else value
            for resource, value in amounts.items() if value is not None}


def _present(counts: Mapping[str, int | None]) -> dict[str, int]:
    return {key: value for key, value in counts.items() if value is not None}
