"""Unknown fields, reported as the API server's strict field validation reports them.

Neighbours: `quota.reports.check` calls `unknown_fields` on every object it reads before the
parsers (`quota.objects.claims`, `quota.objects.slices`, `quota.quotas.devicequota`) see it; the webhook does
not: the API server has already refused (kubectl's default `--validate=strict`) or
dropped an unknown field before any webhook runs. Read leniently, a misspelt field
vanishes and the object means something else: `deviceClassname` left a request with no
class ("deviceClassName is required", pointing away from the typo), a misspelt
`selectors` would price a claim at every device of its class.

The trees follow the Go types field for field (json names): resource.k8s.io v1 and
v1beta2 (the same JSON), v1beta1 (requests write the `exactly` fields inline, devices
keep everything but their name under `basic`) from k8s.io/api v0.37 resource/*/types.go,
ObjectMeta and Condition from k8s.io/apimachinery meta/v1, NodeSelector from core/v1;
DeviceQuota's spec from its CRD (deploy/crds/devicequota.yaml, checked by
tests/unit/quota/objects/test_knownfields.py). A DeviceQuota's status is written by dra-quota alone
and not read by `check`: not checked. Free-form values (opaque driver parameters,
managedFields' fieldsV1, allocated device data) are not walked.

Paths read as the API server writes them: `unknown field "spec.devices.requests[0].
exactly.deviceClassname"` (list indexes in brackets, map keys as fields). Bounded: the
walk visits each value of the (already size- and depth-bounded) input at most once and
stops describing after MAX_REPORTED fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeAlias

__all__ = ["MAX_REPORTED", "Schema", "SCHEMAS", "unknown_fields", "strict_error"]

# None: any value; a dict: an object with these fields (the key "*": a map, any key);
# a one-item list: a list of that.
Schema: TypeAlias = "None | dict[str, Schema] | list[Schema]"
MAX_REPORTED = 10
_ANY_KEY = "*"


def _fields(*names: str, **nested: Schema) -> dict[str, Schema]:
    return {**dict.fromkeys(names), **nested}


def _map(value: Schema = None) -> dict[str, Schema]:
    return {_ANY_KEY: value}


_META = _fields(
    "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation", "creationTimestamp",
    "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations", "finalizers",
    ownerReferences=[_fields("apiVersion", "kind", "name", "uid", "controller", "blockOwnerDeletion")],
    managedFields=[_fields("manager", "operation", "apiVersion", "time", "fieldsType", "fieldsV1", "subresource")],
)
_CONDITION = _fields("type", "status", "observedGeneration", "lastTransitionTime", "reason", "message")
_REQUIREMENT = _fields("key", "operator", "values")
_NODE_SELECTOR = _fields(nodeSelectorTerms=[_fields(matchExpressions=[_REQUIREMENT], matchFields=[_REQUIREMENT])])
_SELECTOR = _fields(cel=_fields("expression"))
_OPAQUE = _fields(opaque=_fields("driver", "parameters"))
_TOLERATION = _fields("key", "operator", "value", "effect", "tolerationSeconds")
_DERIVED = _fields("name", "expression")
_COUNTERS = _map(_fields("value"))

# -- resource.k8s.io/v1 (and v1beta2) --------------------------------------------------------

_EXACT = _fields("deviceClassName", "allocationMode", "count", "adminAccess", selectors=[_SELECTOR],
                 tolerations=[_TOLERATION], capacity=_fields(requests=_map()), derivedAttributes=[_DERIVED])
_SUBREQUEST = _fields("name", **{k: v for k, v in _EXACT.items() if k != "adminAccess"})


def _claim_spec(request: Schema) -> dict[str, Schema]:
    return _fields(devices=_fields(requests=[request],
                                   constraints=[_fields("requests", "matchAttribute", "distinctAttribute")],
                                   config=[_fields("requests", **_OPAQUE)]))


_CLAIM_STATUS = _fields(
    allocation=_fields(
        "allocationTimestamp",
        devices=_fields(
            results=[_fields("request", "driver", "pool", "device", "adminAccess", "bindingConditions",
                             "bindingFailureConditions", "shareID", "consumedCapacity", "skipNodeOperations",
                             tolerations=[_TOLERATION])],
            config=[_fields("source", "requests", **_OPAQUE)],
        ),
        nodeSelector=_NODE_SELECTOR,
    ),
    reservedFor=[_fields("apiGroup", "resource", "name", "uid")],
    devices=[_fields("driver", "pool", "device", "shareID", "data", conditions=[_CONDITION],
                     networkData=_fields("interfaceName", "ips", "hardwareAddress"))],
)
_DEVICE_FIELDS = _fields(
    "nodeName", "allNodes", "bindsToNode", "bindingConditions", "bindingFailureConditions",
    "allowMultipleAllocations",
    attributes=_map(_fields("int", "bool", "string", "version", "ints", "bools", "strings", "versions")),
    capacity=_map(_fields("value", requestPolicy=_fields("default", "validValues",
                                                         validRange=_fields("min", "max", "step")))),
    consumesCounters=[_fields("counterSet", "compatibilityGroups", counters=_COUNTERS)],
    nodeSelector=_NODE_SELECTOR,
    taints=[_fields("key", "value", "effect", "timeAdded")],
    nodeAllocatableResources=_map(_fields(
        mapping=_fields("capacityKey", "capacityMultiplier", "deviceMultiplier"),
        overhead=_fields("perPod", "perContainer"))),
)


def _slice(device: Schema) -> dict[str, Schema]:
    return _fields("driver", "nodeName", "allNodes", "perDeviceNodeSelection", "partitionTypeAttribute",
                   "skipNodeOperations", pool=_fields("name", "generation", "resourceSliceCount"),
                   nodeSelector=_NODE_SELECTOR, devices=[device],
                   sharedCounters=[_fields("name", counters=_COUNTERS)])


def _object(**fields: Schema) -> dict[str, Schema]:
    """A top-level object: TypeMeta, ObjectMeta and `fields`."""
    return _fields("apiVersion", "kind", metadata=_META, **fields)


def _objects(claim_spec: Schema, device: Schema) -> dict[str, dict[str, Schema]]:
    """The kinds `check` reads, for one resource.k8s.io version's shapes."""
    return {
        "DeviceClass": _object(spec=_fields("extendedResourceName", selectors=[_SELECTOR], config=[_OPAQUE])),
        "ResourceSlice": _object(spec=_slice(device)),
        "ResourceClaim": _object(spec=claim_spec, status=_CLAIM_STATUS),
        "ResourceClaimTemplate": _object(spec=_fields(metadata=_META, spec=claim_spec)),
    }


_V1 = _objects(_claim_spec(_fields("name", exactly=_EXACT, firstAvailable=[_SUBREQUEST])),
               _fields("name", **_DEVICE_FIELDS))
# v1beta1: a request writes its `exactly` fields inline; a device keeps all but its name under
# `basic`. The v1 places (`exactly`, a device's own fields) are left to `quota.objects.conversion`,
# whose message names the version that has them.
_V1BETA1 = _objects(_claim_spec(_fields("name", exactly=_EXACT, firstAvailable=[_SUBREQUEST], **_EXACT)),
                    _fields("name", basic=_DEVICE_FIELDS, **_DEVICE_FIELDS))

# -- draquota.io/v1alpha1 ---------------------------------------------------------------------

DEVICE_QUOTA_SPEC = _fields("deviceClassNames", "enforcement", "pricing", hard=_fields("memory", "devices"),
                            devices=_fields("drivers", selectors=[_SELECTOR]),
                            windows=[_fields("name", "start", "end", "schedule", "duration", "timeZone",
                                             hard=_fields("memory", "devices"))])

_REQUIREMENT = _fields("key", "operator", "values")
CLUSTER_DEVICE_QUOTA_SPEC = {**DEVICE_QUOTA_SPEC,
                             "namespaceSelector": _fields(matchLabels=None, matchExpressions=[_REQUIREMENT])}

SCHEMAS: dict[str, dict[str, dict[str, Schema]]] = {
    "resource.k8s.io/v1": _V1,
    "resource.k8s.io/v1beta2": _V1,
    "resource.k8s.io/v1beta1": _V1BETA1,
    "draquota.io/v1alpha1": {"DeviceQuota": _object(status=None, spec=DEVICE_QUOTA_SPEC),
                             "ClusterDeviceQuota": _object(status=None, spec=CLUSTER_DEVICE_QUOTA_SPEC)},
}


def unknown_fields(obj: Mapping[str, Any]) -> tuple[list[str], int]:
    """The paths of `obj`'s unknown fields (at most MAX_REPORTED) and how many there are in
    all; ([], 0) for a kind and version without a schema here (the parsers judge those)."""
    version, kind = obj.get("apiVersion"), obj.get("kind")
    kinds = SCHEMAS.get(version) if isinstance(version, str) else None
    schema = kinds.get(kind) if kinds is not None and isinstance(kind, str) else None
    if schema is None:
        return [], 0
    found: list[str] = []
    total = _walk(obj, schema, "", found)
    return found, total


def strict_error(obj: Mapping[str, Any]) -> str | None:
    """The API server's words for `obj`'s unknown fields, None when it has none."""
    found, total = unknown_fields(obj)
    if not found:
        return None
    more = f", and {total - len(found)} more" if total > len(found) else ""
    return "strict decoding error: " + ", ".join(f'unknown field "{path}"' for path in found) + more


def _walk(value: Any, schema: Schema, path: str, found: list[str]) -> int:
    """Unknown fields under `value` (appended to `found` up to MAX_REPORTED); their count.

    Values of the wrong type are left to the parsers, which name the field and the type.
    Recursive: the loader bounds nesting at 100 levels."""
    if schema is None:
        return 0
    if isinstance(schema, list):
        if not isinstance(value, list):
            return 0
        return sum(_walk(item, schema[0], f"{path}[{i}]", found) for i, item in enumerate(value))
    if not isinstance(value, dict):
        return 0
    count = 0
    free = _ANY_KEY in schema  # a map: every key is known, its values have one schema
    for key, item in value.items():
        where = f"{path}.{key}" if path else str(key)
        if free:
            count += _walk(item, schema[_ANY_KEY], where, found)
        elif key not in schema:
            count += 1
            if len(found) < MAX_REPORTED:
                found.append(where)
        else:
            count += _walk(item, schema[key], where, found)
    return count
