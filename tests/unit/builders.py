"""Small builders for raw Kubernetes objects used across the unit tests.

They produce plain dicts exactly as the API server (or a YAML file) would, so the
parsers are exercised on every test.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from quota.objects.allocationrecord import record_annotations
from quota.quotas.advice import Case, advice
from quota.values.model import RecordKey

GiB = 2**30
MiB = 2**20


def attr(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    if isinstance(value, str) and value.startswith("v:"):
        return {"version": value[2:]}
    return {"string": value}


def make_device(name: str, *, memory: str | None = "80Gi", attrs: dict[str, Any] | None = None,
                shared: bool = False, policy: dict[str, Any] | None = None,
                capacity: dict[str, Any] | None = None, taints: list[dict[str, str]] | None = None,
                node: str | None = None) -> dict[str, Any]:
    dev: dict[str, Any] = {"name": name, "attributes": {k: attr(v) for k, v in (attrs or {"type": "gpu"}).items()}}
    caps: dict[str, Any] = {}
    if memory is not None:
        caps["memory"] = {"value": memory, **({"requestPolicy": policy} if policy else {})}
    for key, value in (capacity or {}).items():
        caps[key] = {"value": value}
    dev["capacity"] = caps
    if shared:
        dev["allowMultipleAllocations"] = True
    if taints:
        dev["taints"] = taints
    if node:
        dev["nodeName"] = node
    return dev


def make_slice(name: str, devices: list[dict[str, Any]], *, driver: str = "gpu.example.com",
               pool: str | None = None, node: str | None = "node-1", generation: int = 1,
               count: int = 1, all_nodes: bool = False, per_device: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "driver": driver,
        "pool": {"name": pool or node or name, "generation": generation, "resourceSliceCount": count},
        "devices": devices,
    }
    if per_device:
        spec["perDeviceNodeSelection"] = True
    elif all_nodes:
        spec["allNodes"] = True
    elif node:
        spec["nodeName"] = node
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name}, "spec": spec}


def make_counter_slice(name: str, counter_sets: dict[str, dict[str, str]], *, driver: str = "gpu.example.com",
                       node: str = "node-1", count: int = 2, generation: int = 1) -> dict[str, Any]:
    """A slice of `sharedCounters` only (the API keeps them apart from devices), in `node`'s pool."""
    obj = make_slice(name, [], driver=driver, node=node, count=count, generation=generation)
    del obj["spec"]["devices"]
    obj["spec"]["sharedCounters"] = [
        {"name": set_name, "counters": {k: {"value": v} for k, v in counters.items()}}
        for set_name, counters in counter_sets.items()
    ]
    return obj


def consumes(counter_set: str, **counters: str) -> list[dict[str, Any]]:
    """A device's `consumesCounters` (counter names with `-` written as `_`)."""
    return [{"counterSet": counter_set,
             "counters": {k.replace("_", "-"): {"value": v} for k, v in counters.items()}}]


def make_class(name: str, *selectors: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": s}} for s in selectors]},
    }


def exactly(cls: str, *selectors: str, count: int | None = None, mode: str | None = None,
            admin: bool = False, capacity: dict[str, str] | None = None,
            tolerations: list[dict[str, str]] | None = None) -> dict[str, Any]:
    req: dict[str, Any] = {"deviceClassName": cls}
    if selectors:
        req["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    if count is not None:
        req["count"] = count
    if mode is not None:
        req["allocationMode"] = mode
    if admin:
        req["adminAccess"] = True
    if capacity:
        req["capacity"] = {"requests": capacity}
    if tolerations:
        req["tolerations"] = tolerations
    return req


def make_claim(name: str = "claim", *requests: dict[str, Any], namespace: str = "team-a",
               allocation: list[dict[str, Any]] | None = None, annotations: dict[str, str] | None = None,
               kind: str = "ResourceClaim") -> dict[str, Any]:
    """`requests` are {"name": ..., "exactly": {...}} or {"name": ..., "firstAvailable": [...]}."""
    spec = {"devices": {"requests": list(requests)}}
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if annotations:
        meta["annotations"] = annotations
    obj: dict[str, Any] = {"apiVersion": "resource.k8s.io/v1", "kind": kind, "metadata": meta}
    if kind == "ResourceClaimTemplate":
        obj["spec"] = {"spec": spec}
    else:
        obj["spec"] = spec
    if allocation is not None:
        obj["status"] = {"allocation": {"devices": {"results": allocation}}}
    return obj


def request(name: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "exactly": body}


def first_available(name: str, *subs: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"name": name, "firstAvailable": [{"name": n, **body} for n, body in subs]}


def result(req: str, device: str, *, pool: str = "node-1", driver: str = "gpu.example.com",
           admin: bool = False, consumed: dict[str, str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"request": req, "driver": driver, "pool": pool, "device": device}
    if admin:
        out["adminAccess"] = True
    if consumed:
        out["consumedCapacity"] = consumed
        out["shareID"] = "6ba7b810-9dad-11d1-80b4-00c04fd430c8"
    return out


def make_quota(name: str, *, namespace: str = "team-a", memory: str | None = None, devices: int | None = None,
               classes: list[str] | None = None, enforcement: str | None = None,
               pricing: str | None = None, drivers: list[str] | None = None,
               selectors: list[str] | None = None, windows: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """`drivers` and `selectors` make its `spec.devices` (absent when both are None)."""
    hard: dict[str, Any] = {}
    if memory is not None:
        hard["memory"] = memory
    if devices is not None:
        hard["devices"] = devices
    spec: dict[str, Any] = {"hard": hard}
    if classes:
        spec["deviceClassNames"] = classes
    if enforcement:
        spec["enforcement"] = enforcement
    if pricing:
        spec["pricing"] = pricing
    if drivers is not None or selectors is not None:
        spec["devices"] = {**({"drivers": drivers} if drivers is not None else {}),
                           **({"selectors": [{"cel": {"expression": s}} for s in selectors]}
                              if selectors is not None else {})}
    if windows is not None:
        spec["windows"] = windows
    return {"apiVersion": "draquota.io/v1alpha1", "kind": "DeviceQuota",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def make_cluster_quota(name: str, *, team: str | None = None, selector: dict[str, Any] | None = None,
                       **fields: Any) -> dict[str, Any]:
    """A ClusterDeviceQuota: `make_quota`'s spec, selecting `team.draquota.io/name: <team>`
    (or `selector` as written)."""
    quota = make_quota(name, **fields)
    spec = {**quota["spec"], "namespaceSelector": selector if selector is not None
            else {"matchLabels": {"team.draquota.io/name": team or name}}}
    return {"apiVersion": "draquota.io/v1alpha1", "kind": "ClusterDeviceQuota", "metadata": {"name": name},
            "spec": spec}


@dataclass(frozen=True)
class _Shape:
    """What `record_annotations` asks of a claim."""

    several_classes: bool
    recorded_devices: tuple[tuple[RecordKey, int], ...] = ()


def record_for(record: Mapping[RecordKey, int], *, several_classes: bool = False) -> dict[str, str]:
    """The allocation record's annotations the leader writes for `record` on a claim of one
    device class (or of several)."""
    return record_annotations(_Shape(several_classes), record)


_DENIED_BY = re.compile(r'exceeded (DeviceQuota|ClusterDeviceQuota) "([^"]+)": ')


def advised(in_tree: str, case: Case = "full", *, namespace: str = "team-a") -> str:
    """A quota's denial as `quota.quotas.devicequota.check` writes it: `in_tree` (the numbers, in the
    in-tree form, maybe after a prefix), then the advice for `case` to a requester in
    `namespace` from the quota `in_tree` names. The advice's wording is pinned by
    tests/unit/quota/quotas/test_advice.py; these tests pin the numbers and which case applies."""
    found = _DENIED_BY.search(in_tree)
    assert found is not None, in_tree
    kind, name = found.groups()
    team = kind == "ClusterDeviceQuota"
    return f"{in_tree}; {advice(kind=kind, name=name, team=team, namespace=namespace, case=case)}"
