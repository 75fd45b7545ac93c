"""`dra-quota top`: per-namespace and per-team DRA usage as the quota controller published it.

Neighbours: `commands.topcommand` lists DeviceQuotas and ClusterDeviceQuotas through `kube.api`
and prints what `quota_usage` and `team_usage` return; `quota.quotas.devicequota` reads the
spec. This module only reads what is on each quota: `spec.hard` and the `status` the
leader-elected controller writes (`used`, `reserved`, `claims`, `conditions`, a quota
with windows' `effectiveHard`, `activeWindow` and `nextChange`,
`observedGeneration`, and a team's `namespaces`, its per-namespace breakdown), the way
`kubectl top` reads what metrics-server published instead of computing it. Nothing here
recomputes usage: two tools must never show two different numbers for one quota.

A status that is missing, or written for an older generation of the spec, is reported as
such (`current: false`), so a reader can tell "nothing used" from "not counted yet".
The JSON shape extends `dra-quota check`'s per-quota objects (same keys, integers: bytes
and counts; a ClusterDeviceQuota's has namespace "" and `namespaces`) with `claims`,
`exceeded` and `current`; an amount the status does not carry is null.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quota.quotas.devicequota import (
    RESOURCES,
    DeviceQuota,
    QuotaError,
    parse_cluster_device_quota,
    parse_device_quota,
)
from quota.values.quantity import ceil_int, non_negative_amount
from quota.values.raw import as_map, show
from quota.values.validation import integer

__all__ = ["applied_usage", "quota_usage", "team_usage"]


def quota_usage(obj: Mapping[str, Any]) -> dict[str, Any]:
    """One DeviceQuota's row; `QuotaError` names the field when the object is unreadable."""
    quota = parse_device_quota(obj)
    return _row(quota, obj, f"DeviceQuota {quota.namespace}/{quota.name}: status")


def team_usage(obj: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any] | None:
    """One ClusterDeviceQuota's row: the team's totals and `namespaces`, each namespace's
    part (`status.namespaces`). With `namespace`, only that one's part, and None when
    the status does not list it (the team does not select it, or not counted yet)."""
    quota = parse_cluster_device_quota(obj)
    where = f"ClusterDeviceQuota {quota.name}: status"
    row = _row(quota, obj, where)
    members = as_map(obj.get("status")).get("namespaces")
    parts = [_part(item, f"{where}.namespaces[{i}]") for i, item in enumerate(members)
             if isinstance(item, dict)] if isinstance(members, list) else []
    if namespace is not None:
        parts = [part for part in parts if part["namespace"] == namespace]
        if not parts:
            return None
    row["namespaces"] = parts
    return row


def applied_usage(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A team's row as one member namespace sees it: an AppliedClusterDeviceQuota
    (`quota.status.applied`), read by a tenant who may not read the ClusterDeviceQuota. The shape
    of `team_usage(obj, namespace)`'s, with `applied: true`, `current` the team's, and when
    the team's totals were read (`observedAt`, RFC 3339) and how long after a change they
    may lag (`refreshSeconds`), each null when the copy does not say."""
    meta = as_map(obj.get("metadata"))
    name, namespace = meta.get("name"), meta.get("namespace")
    if not isinstance(name, str) or not name or not isinstance(namespace, str) or not namespace:
        raise QuotaError(f"AppliedClusterDeviceQuota: metadata.name and metadata.namespace must be names, "
                         f"got {show(name)} in {show(namespace)}")
    where = f"AppliedClusterDeviceQuota {namespace}/{name}: status"
    status = as_map(obj.get("status"))
    part = as_map(status.get("namespace"))
    return {
        "kind": "ClusterDeviceQuota", "namespace": "", "name": name, "applied": True,
        "hard": {k: v for k, v in _amounts(status.get("hard"), f"{where}.hard").items() if v is not None},
        "used": _amounts(status.get("used"), f"{where}.used"),
        "reserved": _amounts(status.get("reserved"), f"{where}.reserved"),
        "headroom": _amounts(status.get("headroom"), f"{where}.headroom"),
        "claims": _claims(status.get("claims"), f"{where}.claims"),
        "exceeded": status.get("exceeded") is True,
        "current": status.get("counted") is True,
        "namespaces": [_part({**part, "namespace": namespace}, f"{where}.namespace")],
        # How old the team's totals may be (this namespace's part is written with each change).
        "observedAt": stamp if isinstance(stamp := status.get("teamObservedAt"), str) else None,
        "refreshSeconds": seconds if isinstance(seconds := status.get("teamRefreshSeconds"), int) else None,
    }


def _row(quota: DeviceQuota, obj: Mapping[str, Any], where: str) -> dict[str, Any]:
    status = as_map(obj.get("status"))
    meta = as_map(obj.get("metadata"))
    conditions = {
        str(c.get("type")): c.get("status")
        for c in status.get("conditions") or []
        if isinstance(c, dict)
    } if isinstance(status.get("conditions"), list) else {}
    generation = meta.get("generation")
    return {
        "kind": quota.kind,
        "namespace": quota.namespace,
        "name": quota.name,
        "hard": _hard(quota, status, where),
        "used": _amounts(status.get("used"), f"{where}.used"),
        "reserved": _amounts(status.get("reserved"), f"{where}.reserved"),
        "claims": _claims(status.get("claims"), f"{where}.claims"),
        "exceeded": conditions.get("Exceeded") == "True",
        # The controller has counted this spec: its observedGeneration is the object's.
        "current": bool(status) and generation is not None and status.get("observedGeneration") == generation,
        **_windows(quota, status),
    }


def _hard(quota: DeviceQuota, status: Mapping[str, Any], where: str) -> dict[str, int]:
    """The hard in force as the controller wrote it (`status.effectiveHard`) for a quota with
    windows; `spec.hard` otherwise, or while the status has none yet."""
    written = status.get("effectiveHard") if quota.windows else None
    if not isinstance(written, dict):
        return quota.hard.as_json()
    return {k: v for k, v in _amounts(written, f"{where}.effectiveHard").items() if v is not None}


def _windows(quota: DeviceQuota, status: Mapping[str, Any]) -> dict[str, Any]:
    """A quota with windows: `window`, the open one (null: none), and `nextChange` (null:
    none within 400 days, or not written yet), as `dra-quota check --at` names them."""
    if not quota.windows:
        return {}
    window, change = status.get("activeWindow"), status.get("nextChange")
    return {"window": window if isinstance(window, str) else None,
            "nextChange": change if isinstance(change, str) else None}


def _part(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    """One item of a team's `status.namespaces`."""
    namespace = item.get("namespace")
    if not isinstance(namespace, str) or not namespace:
        raise QuotaError(f"{where}.namespace must be a namespace name, got {show(namespace)}")
    return {"namespace": namespace, "used": _amounts(item.get("used"), f"{where}.used"),
            "reserved": _amounts(item.get("reserved"), f"{where}.reserved"),
            "claims": _claims(item.get("claims"), f"{where}.claims")}


def _claims(raw: Any, where: str) -> dict[str, int | None]:
    return {k: None if (n := as_map(raw).get(k)) is None else integer(n, f"{where}.{k}", QuotaError)
            for k in ("allocated", "pending")}


def _amounts(raw: Any, where: str) -> dict[str, int | None]:
    values = as_map(raw)
    out: dict[str, int | None] = {}
    for resource in sorted(RESOURCES, reverse=True):  # memory, devices: the table's order
        value = values.get(resource)
        out[resource] = None if value is None else ceil_int(non_negative_amount(value, f"{where}.{resource}", QuotaError))
    return out
