"""`dra-quota top`: per-namespace DRA usage as the quota controller published it.

Neighbours: `commands.cli` lists DeviceQuotas through `kube.api` and prints what
`quota_usage` returns; `quota.devicequota` reads the spec. This module only reads what is
on each DeviceQuota: `spec.hard` and the `status` the leader-elected controller writes
(`used`, `reserved`, `claims`, `conditions`, `observedGeneration`), the way `kubectl top`
reads what metrics-server published instead of computing it. Nothing here recomputes
usage: two tools must never show two different numbers for one quota.

A status that is missing, or written for an older generation of the spec, is reported as
such (`current: false`), so a reader can tell "nothing used" from "not counted yet".
The JSON shape extends `dra-quota check`'s per-quota objects (same keys, integers: bytes
and counts) with `claims`, `exceeded` and `current`; an amount the status does not carry
is null.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quota.devicequota import RESOURCES, QuotaError, parse_device_quota
from quota.quantity import ceil_int, non_negative_amount
from quota.raw import as_map
from quota.validation import integer

__all__ = ["quota_usage"]


def quota_usage(obj: Mapping[str, Any]) -> dict[str, Any]:
    """One DeviceQuota's row; `QuotaError` names the field when the object is unreadable."""
    quota = parse_device_quota(obj)
    where = f"DeviceQuota {quota.namespace}/{quota.name}: status"
    status = as_map(obj.get("status"))
    meta = as_map(obj.get("metadata"))
    conditions = {
        str(c.get("type")): c.get("status")
        for c in status.get("conditions") or []
        if isinstance(c, dict)
    } if isinstance(status.get("conditions"), list) else {}
    generation = meta.get("generation")
    return {
        "namespace": quota.namespace,
        "name": quota.name,
        "hard": quota.hard.as_json(),
        "used": _amounts(status.get("used"), f"{where}.used"),
        "reserved": _amounts(status.get("reserved"), f"{where}.reserved"),
        "claims": {k: None if (n := as_map(status.get("claims")).get(k)) is None
                   else integer(n, f"{where}.claims.{k}", QuotaError) for k in ("allocated", "pending")},
        "exceeded": conditions.get("Exceeded") == "True",
        # The controller has counted this spec: its observedGeneration is the object's.
        "current": bool(status) and generation is not None and status.get("observedGeneration") == generation,
    }


def _amounts(raw: Any, where: str) -> dict[str, int | None]:
    values = as_map(raw)
    out: dict[str, int | None] = {}
    for resource in sorted(RESOURCES, reverse=True):  # memory, devices: the table's order
        value = values.get(resource)
        out[resource] = None if value is None else ceil_int(non_negative_amount(value, f"{where}.{resource}", QuotaError))
    return out

