"""resource.k8s.io v1beta1 and v1beta2 objects read as v1, converted as the API server does.

Neighbours: the DRA parsers (`quota.objects.claims`, `quota.objects.slices`) call `as_v1` where they
check the apiVersion, so every reader of DeviceClasses, ResourceSlices, ResourceClaims
and ResourceClaimTemplates takes the older shapes, and the v1 parsers do all the
validation (an invalid v1beta1 object gets the v1 field path, as from the API server,
which validates the converted object). `quota.reports.check` calls `require_dra_version` early
to stop a run on an unknown version. `quota.values.meta` still guards the other kinds.

What the conversion does, from k/k v1.37 pkg/apis/resource/v1beta1/conversion.go and
the generated zz_generated.conversion.go of v1beta1 and v1beta2 (checked field by field
against staging/src/k8s.io/api/resource/{v1,v1beta1,v1beta2}/types.go):
- v1beta2 has the v1 shapes field for field: only the apiVersion changes.
- v1beta1 DeviceRequest writes the ExactDeviceRequest fields inline. If any of them is
  set (a non-empty deviceClassName or allocationMode, a non-zero count, or any of
  selectors, adminAccess, tolerations, capacity, derivedAttributes present and not
  null) they move under `exactly`; `firstAvailable` converts unchanged. Before that,
  v1beta1 defaulting (SetDefaults_DeviceRequest) runs only when deviceClassName is set:
  allocationMode ExactCount, count 1. A request with both ends up with both set and is
  refused by validation, as the API server refuses it.
- v1beta1 Device keeps everything but its name under `basic`; v1 flattens it. Empty
  attributes/capacity maps and empty consumesCounters/taints lists become absent.
- v1beta1 ResourceSliceSpec has `nodeName: ""` and `allNodes: false` for "unset"
  (plain string and bool); v1 has pointers, so those values become absent.
- Everything else (DeviceClass, capacity `{value, requestPolicy}`, attributes,
  sharedCounters, consumesCounters, taints, allocation results with consumedCapacity,
  shareID, adminAccess, bindingConditions) has the same JSON in all three versions.
v1beta1 fields written in the v1 place (`exactly` on a request; `attributes`,
`capacity`... on a device beside `basic`) are refused by name, as kubectl's default
strict field validation refuses unknown fields: read leniently, they would vanish and
price the device at no memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quota.values.raw import show

__all__ = ["V1", "BETAS", "as_v1", "require_dra_version"]

GROUP = "resource.k8s.io"
V1 = f"{GROUP}/v1"
V1BETA1 = f"{GROUP}/v1beta1"
V1BETA2 = f"{GROUP}/v1beta2"
BETAS = (V1BETA1, V1BETA2)

# v1beta1 DeviceRequest fields that v1 keeps under `exactly` (hasAnyMainRequestFieldsSet).
_REQUEST_FIELDS = ("deviceClassName", "selectors", "allocationMode", "count", "adminAccess",
                   "tolerations", "capacity", "derivedAttributes")
# v1beta1 BasicDevice fields, which v1 has on the Device itself.
_BASIC_FIELDS = ("attributes", "capacity", "consumesCounters", "nodeName", "nodeSelector", "allNodes",
                 "taints", "bindsToNode", "bindingConditions", "bindingFailureConditions",
                 "allowMultipleAllocations", "nodeAllocatableResources")
# Emptiness that Convert_v1beta1_Device_To_resource_Device turns into nil.
_DROPPED_WHEN_EMPTY = ("attributes", "capacity", "consumesCounters", "taints")


def require_dra_version(obj: Mapping[str, Any], kind: str, error: type[Exception]) -> None:
    """Refuse an object of a DRA `kind` in a version this tool does not convert."""
    if not isinstance(obj, dict):
        raise error(f"a {kind} must be an object, got {show(obj)}")
    version = obj.get("apiVersion")
    if version == V1 or version in BETAS:
        return
    got = "no apiVersion" if version is None else f"apiVersion {show(version)}"
    raise error(
        f"{kind} with {got} is not supported: use {V1} "
        f"(dra-quota also reads {V1BETA1} and {V1BETA2}, converted to {V1} as the API server does)"
    )


def as_v1(obj: Mapping[str, Any], kind: str, error: type[Exception]) -> dict[str, Any]:
    """`obj` as a resource.k8s.io/v1 object; the input is not modified.

    Raises `error` for an unsupported version, or for a v1beta1 object that mixes in v1
    fields (see the module docstring); any other defect is left for the v1 parser.
    """
    require_dra_version(obj, kind, error)
    assert isinstance(obj, dict)  # require_dra_version checked it
    version = obj["apiVersion"]
    if version == V1:
        return obj
    out = {**obj, "apiVersion": V1}
    if version == V1BETA2:
        return out
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return out
    if kind == "ResourceSlice":
        out["spec"] = _slice_spec(spec, f"ResourceSlice {_name(obj)}: spec", error)
    elif kind == "ResourceClaim":
        out["spec"] = _claim_spec(spec, "spec", error)
    elif kind == "ResourceClaimTemplate" and isinstance(spec.get("spec"), dict):
        out["spec"] = {**spec, "spec": _claim_spec(spec["spec"], "spec.spec", error)}
    return out


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else "(unnamed)"


def _claim_spec(spec: dict[str, Any], where: str, error: type[Exception]) -> dict[str, Any]:
    devices = spec.get("devices")
    if not isinstance(devices, dict) or not isinstance(devices.get("requests"), list):
        return spec
    at = f"{where}.devices.requests"
    requests = [_request(r, f"{at}[{i}]", error) if isinstance(r, dict) else r
                for i, r in enumerate(devices["requests"])]
    return {**spec, "devices": {**devices, "requests": requests}}


def _request(raw: dict[str, Any], where: str, error: type[Exception]) -> dict[str, Any]:
    if "exactly" in raw:
        raise error(f"{where}.exactly: unknown field in {V1BETA1}, which writes deviceClassName, selectors, "
                    f"count... on the request itself (exactly is {V1} and {V1BETA2})")
    inline = {f: raw[f] for f in _REQUEST_FIELDS if f in raw}
    out = {k: v for k, v in raw.items() if k not in inline}
    if inline.get("deviceClassName") not in (None, ""):
        # SetDefaults_DeviceRequest, which v1beta1 runs before converting.
        if inline.get("allocationMode") in (None, ""):
            inline["allocationMode"] = "ExactCount"
        if inline["allocationMode"] == "ExactCount" and inline.get("count") in (None, 0):
            inline["count"] = 1
    if any(_is_set(f, v) for f, v in inline.items()):
        out["exactly"] = {f: v for f, v in inline.items() if v is not None}
    return out


def _is_set(field: str, value: Any) -> bool:
    """hasAnyMainRequestFieldsSet: Go's zero values (null, "", count 0) are not set."""
    if value is None:
        return False
    if field in ("deviceClassName", "allocationMode"):
        return value != "" if isinstance(value, str) else True
    if field == "count":
        return not (type(value) is int and value == 0)
    return True


def _slice_spec(spec: dict[str, Any], where: str, error: type[Exception]) -> dict[str, Any]:
    out = dict(spec)
    # Plain string and bool in v1beta1: their zero values mean "unset".
    if out.get("nodeName") == "":
        del out["nodeName"]
    if out.get("allNodes") is False:
        del out["allNodes"]
    devices = spec.get("devices")
    if isinstance(devices, list):
        out["devices"] = [_device(d, f"{where}.devices[{i}]", error) if isinstance(d, dict) else d
                          for i, d in enumerate(devices)]
    return out


def _device(raw: dict[str, Any], where: str, error: type[Exception]) -> dict[str, Any]:
    flat = [f for f in _BASIC_FIELDS if f in raw]
    if flat:
        raise error(f"{where}.{flat[0]}: unknown field in {V1BETA1}, which keeps it under basic "
                    f"(devices are flat in {V1} and {V1BETA2})")
    basic = raw.get("basic")
    out = {k: v for k, v in raw.items() if k != "basic"}
    if basic is None:
        return out
    if not isinstance(basic, dict):
        raise error(f"{where}.basic must be an object, got {show(basic)}")
    for field in _BASIC_FIELDS:
        value = basic.get(field)
        if value is None or (field in _DROPPED_WHEN_EMPTY and value in ({}, [])):
            continue
        out[field] = value
    return out
