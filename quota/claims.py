"""Parse ResourceClaims, ResourceClaimTemplates and DeviceClasses into domain values.

Neighbours: `quota.pricing` prices the `ClaimSpec` built here; `quota.check` and the
webhook feed raw JSON in. Defaults follow k/k pkg/apis/resource/v1/defaults.go
(allocationMode ExactCount, count 1); the shapes follow TYPES
(staging/src/k8s.io/api/resource/v1/types.go). A malformed object raises `ClaimError`
whose message names the field to fix.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

from quota.model import (
    AllocationMode,
    Charge,
    ClaimUid,
    DeviceClass,
    DeviceClassName,
    DeviceKey,
    Namespace,
)
from quota.quantity import QuantityError, parse_quantity
from quota.raw import as_list, as_map, dig

__all__ = [
    "ClaimError",
    "Toleration",
    "DeviceRequirement",
    "Request",
    "ClaimSpec",
    "AllocatedDevice",
    "Claim",
    "parse_claim",
    "parse_claim_spec",
    "parse_device_class",
    "CHARGE_ANNOTATION",
    "QUOTAS_ANNOTATION",
]

CHARGE_ANNOTATION = "draquota.io/charge"
QUOTAS_ANNOTATION = "draquota.io/quotas"

ClaimKind = Literal["ResourceClaim", "ResourceClaimTemplate"]


class ClaimError(ValueError):
    """A claim, template or class this tool cannot read; the message names the field."""


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str
    operator: str
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class DeviceRequirement:
    """An `exactly` request or one `firstAvailable` subrequest (name "req" or "req/sub")."""

    name: str
    device_class: DeviceClassName
    selectors: tuple[str, ...] = ()
    allocation_mode: AllocationMode = "ExactCount"
    count: int = 1
    admin_access: bool = False
    # Sorted (name, quantity) pairs: hashable, so pricing can cache on the requirement.
    capacity_requests: tuple[tuple[str, Fraction], ...] = ()
    tolerations: tuple[Toleration, ...] = ()


@dataclass(frozen=True, slots=True)
class Request:
    name: str
    alternatives: tuple[DeviceRequirement, ...]
    first_available: bool = False


@dataclass(frozen=True, slots=True)
class ClaimSpec:
    requests: tuple[Request, ...]


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    request: str
    key: DeviceKey
    admin_access: bool = False
    share_id: str | None = None
    consumed_capacity: tuple[tuple[str, Fraction], ...] = ()


@dataclass(frozen=True, slots=True)
class Claim:
    kind: ClaimKind
    namespace: Namespace
    name: str
    uid: ClaimUid
    spec: ClaimSpec
    allocation: tuple[AllocatedDevice, ...] | None = None
    # The charge written by our mutating webhook at admission, if any.
    recorded_charge: Charge | None = None

    @property
    def admin_access(self) -> bool:
        return any(alt.admin_access for req in self.spec.requests for alt in req.alternatives)


def parse_claim(obj: Mapping[str, Any]) -> Claim:
    """A ResourceClaim or ResourceClaimTemplate (templates are priced as the claim they stamp)."""
    if not isinstance(obj, Mapping):
        raise ClaimError("a ResourceClaim must be an object")
    kind = obj.get("kind", "ResourceClaim")
    if kind not in ("ResourceClaim", "ResourceClaimTemplate"):
        raise ClaimError(f"expected a ResourceClaim or ResourceClaimTemplate, got kind {kind!r}")
    meta = as_map(obj.get("metadata"))
    name = str(meta.get("name") or meta.get("generateName") or "")
    spec = obj.get("spec")
    if kind == "ResourceClaimTemplate":
        spec = dig(spec, "spec")
        prefix = "spec.spec"
    else:
        prefix = "spec"
    status = as_map(obj.get("status"))
    annotations = as_map(meta.get("annotations"))
    return Claim(
        kind=kind,
        namespace=Namespace(str(meta.get("namespace") or "default")),
        name=name,
        uid=ClaimUid(str(meta.get("uid") or "")),
        spec=parse_claim_spec(spec, prefix),
        allocation=_allocation(status.get("allocation")),
        recorded_charge=_recorded_charge(annotations.get(CHARGE_ANNOTATION)),
    )


def parse_claim_spec(spec: Any, prefix: str = "spec") -> ClaimSpec:
    if not isinstance(spec, Mapping):
        raise ClaimError(f"{prefix} is required")
    devices = spec.get("devices") or {}
    if not isinstance(devices, Mapping):
        raise ClaimError(f"{prefix}.devices must be an object")
    raw_requests = devices.get("requests") or []
    if not isinstance(raw_requests, list):
        raise ClaimError(f"{prefix}.devices.requests must be a list")
    requests = []
    for i, raw in enumerate(raw_requests):
        where = f"{prefix}.devices.requests[{i}]"
        if not isinstance(raw, Mapping):
            raise ClaimError(f"{where} must be an object")
        requests.append(_request(raw, where))
    return ClaimSpec(tuple(requests))


def parse_device_class(obj: Mapping[str, Any]) -> DeviceClass:
    if not isinstance(obj, Mapping):
        raise ClaimError("a DeviceClass must be an object")
    name = dig(obj, "metadata", "name")
    if not isinstance(name, str) or not name:
        raise ClaimError("DeviceClass without metadata.name")
    spec = obj.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise ClaimError(f"DeviceClass {name!r}: spec must be an object")
    selectors = _selectors(spec.get("selectors"), f"DeviceClass {name!r}: spec.selectors")
    ext = spec.get("extendedResourceName")
    return DeviceClass(DeviceClassName(name), selectors, ext if isinstance(ext, str) else None)


def _request(raw: Mapping[str, Any], where: str) -> Request:
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise ClaimError(f"{where}.name is required")
    exactly, first = raw.get("exactly"), raw.get("firstAvailable")
    if (exactly is None) == (first is None):
        raise ClaimError(f"{where}: exactly one of exactly or firstAvailable must be set")
    if exactly is not None:
        return Request(name, (_requirement(exactly, name, f"{where}.exactly", subrequest=False),))
    if not isinstance(first, list) or not first:
        raise ClaimError(f"{where}.firstAvailable must be a non-empty list")
    alternatives = []
    for j, sub in enumerate(first):
        sub_where = f"{where}.firstAvailable[{j}]"
        sub_name = dig(sub, "name")
        if not isinstance(sub_name, str) or not sub_name:
            raise ClaimError(f"{sub_where}.name is required")
        alternatives.append(_requirement(sub, f"{name}/{sub_name}", sub_where, subrequest=True))
    return Request(name, tuple(alternatives), first_available=True)


def _requirement(raw: Any, name: str, where: str, *, subrequest: bool) -> DeviceRequirement:
    if not isinstance(raw, Mapping):
        raise ClaimError(f"{where} must be an object")
    cls = raw.get("deviceClassName")
    if not isinstance(cls, str) or not cls:
        raise ClaimError(f"{where}.deviceClassName is required")
    mode = raw.get("allocationMode") or "ExactCount"
    if mode not in ("ExactCount", "All"):
        raise ClaimError(f"{where}.allocationMode: unsupported value {mode!r}: supported values: All, ExactCount")
    count = raw.get("count")
    if count is None or count == 0:
        # v1 defaults count to 1; a stored v1beta2 object may keep 0 on a last subrequest.
        count = 1
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ClaimError(f"{where}.count must be a positive integer, got {count!r}")
    if mode == "All":
        count = 0
    requests = dig(raw, "capacity", "requests")
    return DeviceRequirement(
        name=name,
        device_class=DeviceClassName(cls),
        selectors=_selectors(raw.get("selectors"), f"{where}.selectors"),
        allocation_mode="All" if mode == "All" else "ExactCount",
        count=count,
        # Subrequests cannot ask for adminAccess (TYPES: DeviceSubRequest has no such field).
        admin_access=(raw.get("adminAccess") is True) and not subrequest,
        capacity_requests=_capacity_requests(requests, f"{where}.capacity.requests"),
        tolerations=tuple(
            Toleration(
                str(t.get("key", "")), str(t.get("operator") or "Equal"), str(t.get("value", "")),
                str(t.get("effect", "")),
            )
            for t in as_list(raw.get("tolerations"), f"{where}.tolerations", ClaimError)
            if isinstance(t, Mapping)
        ),
    )


def _selectors(raw: Any, where: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ClaimError(f"{where} must be a list")
    out = []
    for i, sel in enumerate(raw):
        expr = dig(sel, "cel", "expression")
        if not isinstance(expr, str):
            raise ClaimError(f"{where}[{i}].cel.expression is required")
        out.append(expr)
    return tuple(out)


def _capacity_requests(raw: Any, where: str) -> tuple[tuple[str, Fraction], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise ClaimError(f"{where} must be a map of capacity name to quantity")
    out = []
    for key, value in raw.items():
        try:
            out.append((str(key), parse_quantity(value)))
        except QuantityError as err:
            raise ClaimError(f"{where}[{key}]: {err}") from None
    return tuple(sorted(out))


def _allocation(raw: Any) -> tuple[AllocatedDevice, ...] | None:
    if not isinstance(raw, Mapping):
        return None
    results = dig(raw, "devices", "results")
    out = []
    for i, res in enumerate(as_list(results, "status.allocation.devices.results", ClaimError)):
        where = f"status.allocation.devices.results[{i}]"
        if not isinstance(res, Mapping):
            raise ClaimError(f"{where} must be an object")
        try:
            key = DeviceKey(str(res["driver"]), str(res["pool"]), str(res["device"]))
        except KeyError as err:
            raise ClaimError(f"{where}.{err.args[0]} is required") from None
        consumed = res.get("consumedCapacity") or {}
        out.append(
            AllocatedDevice(
                request=str(res.get("request", "")),
                key=key,
                admin_access=res.get("adminAccess") is True,
                share_id=res.get("shareID") if isinstance(res.get("shareID"), str) else None,
                consumed_capacity=_capacity_requests(consumed, f"{where}.consumedCapacity"),
            )
        )
    return tuple(out)


def _recorded_charge(raw: Any) -> Charge | None:
    """The `draquota.io/charge` annotation; ignored (None) when absent or not ours."""
    if not isinstance(raw, str):
        return None
    try:
        data = json.loads(raw)
        memory, devices = data["memory"], data["devices"]
    except (ValueError, TypeError, KeyError):
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (memory, devices)):
        return None
    return Charge(memory, devices)
