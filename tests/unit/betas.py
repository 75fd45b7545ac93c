"""v1 objects written back in the resource.k8s.io/v1beta1 and v1beta2 shapes, for tests.

The inverse of `quota.objects.conversion`, written independently from the other direction of
k/k v1.37 pkg/apis/resource/v1beta1/conversion.go (Convert_resource_DeviceRequest_To_
v1beta1_DeviceRequest, Convert_resource_Device_To_v1beta1_Device): `exactly`'s fields go
back on the request, a device's fields other than its name go under `basic`. v1beta2 has
the v1 shapes, so only its apiVersion changes. Used to make beta copies of whole
manifests (examples/) and of the fuzzers' seeds.
"""

from __future__ import annotations

import copy
from typing import Any

DRA_KINDS = ("DeviceClass", "ResourceSlice", "ResourceClaim", "ResourceClaimTemplate")


def downgrade(obj: dict[str, Any], version: str) -> dict[str, Any]:
    """`obj` (resource.k8s.io/v1) as `version` ("v1beta1" or "v1beta2"); others unchanged."""
    if obj.get("kind") not in DRA_KINDS or obj.get("apiVersion") != "resource.k8s.io/v1":
        return obj
    out = copy.deepcopy(obj)
    out["apiVersion"] = f"resource.k8s.io/{version}"
    if version == "v1beta2":
        return out
    kind, spec = out["kind"], out.get("spec") or {}
    if kind == "ResourceSlice":
        if isinstance(spec.get("devices"), list):
            spec["devices"] = [_basic(d) for d in spec["devices"]]
    elif kind == "ResourceClaim":
        _inline(spec)
    elif kind == "ResourceClaimTemplate":
        _inline(spec.get("spec") or {})
    return out


def _basic(device: dict[str, Any]) -> dict[str, Any]:
    rest = {k: v for k, v in device.items() if k != "name"}
    return {"name": device["name"], **({"basic": rest} if rest else {})}


def _inline(claim_spec: dict[str, Any]) -> None:
    for request in (claim_spec.get("devices") or {}).get("requests") or []:
        exactly = request.pop("exactly", None)
        if exactly:
            request.update(exactly)
