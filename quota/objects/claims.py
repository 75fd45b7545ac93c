"""Parse ResourceClaims, ResourceClaimTemplates and DeviceClasses into domain values.

Neighbours: `quota.objects.claimspec` parses a claim's spec (its requests) into the `ClaimSpec`
`quota.pricing.pricer` prices; this module the claim around it: its allocation results, the
charge and allocation record the leader annotated, its Pod owner, its creation time.
`quota.reports.check` and the webhook feed raw JSON in. The shapes follow TYPES
(staging/src/k8s.io/api/resource/v1/types.go) and the field rules those of the API
server (pkg/apis/resource/validation/validation.go, through `quota.values.validation`): what
it would refuse (a negative consumedCapacity, 33 allocation results, a bad pool name) is
refused here. A malformed object raises `ClaimError` (`quota.objects.claimspec`) whose message
names the field.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from fractions import Fraction
from typing import Any, Literal

from quota.objects.allocationrecord import ALLOCATED_CHARGE_ANNOTATION, recorded_devices
from quota.objects.claimspec import ClaimError, ClaimSpec, parse_capacities, parse_claim_spec, parse_selectors
from quota.objects.conversion import as_v1
from quota.values.interning import Interned
from quota.values.meta import parse_meta
from quota.values.model import (
    Charge,
    ClaimUid,
    DeviceClass,
    DeviceClassName,
    DeviceKey,
    Namespace,
    RecordKey,
)
from quota.values.raw import as_list, dig, show, small_json
from quota.values.validation import (
    MAX_INT64,
    MAX_RESULTS,
    at_most,
    dns_label,
    dns_subdomain,
    optional_string,
    pool_name,
    string,
)

__all__ = [
    "pod_owner",
    "AllocatedDevice",
    "Claim",
    "claim_record",
    "parse_claim",
    "parse_device_class",
    "CHARGE_ANNOTATION",
    "QUOTAS_ANNOTATION",
]

CHARGE_ANNOTATION = "draquota.io/charge"
QUOTAS_ANNOTATION = "draquota.io/quotas"


ClaimKind = Literal["ResourceClaim", "ResourceClaimTemplate"]


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
    # The charge the leader recorded once the claim existed (`controllers.annotator`), if any.
    recorded_charge: Charge | None = None
    # The uid of the Pod the claim's controlling ownerReference names ("" for none): the
    # claims of an admitted Kueue Workload's Pods draw on its holding (`quota.accounting.workloads`).
    owner: str = ""
    # The memory charge of each allocation result, recorded after allocation by the leader
    # (`quota.objects.allocationrecord`): a device that later leaves the inventory keeps the charge
    # it had, and a deallocated claim counts its last allocation from it.
    recorded_devices: tuple[tuple[RecordKey, int], ...] = ()
    # metadata.creationTimestamp in seconds since the epoch (None: absent or unreadable):
    # the start of the wait the allocation-wait histogram measures (webhook.allocations).
    created: float | None = None

    @property
    def several_classes(self) -> bool:
        """Whether the claim's requests name more than one DeviceClass."""
        return self.spec._several

    @property
    def admin_access(self) -> bool:
        return any(alt.admin_access for req in self.spec.requests for alt in req.alternatives)


def parse_claim(obj: Mapping[str, Any], *, parse_spec: Callable[[Any, str], ClaimSpec] | None = None) -> Claim:
    """A ResourceClaim or ResourceClaimTemplate (templates are priced as the claim they stamp);
    `parse_spec`: `parse_claim_spec` or a memo of it (`quota.objects.jsonclaims`)."""
    if not isinstance(obj, dict):
        raise ClaimError("a ResourceClaim must be an object")
    kind = obj.get("kind", "ResourceClaim")
    if kind not in ("ResourceClaim", "ResourceClaimTemplate"):
        raise ClaimError(f"expected a ResourceClaim or ResourceClaimTemplate, got kind {show(kind)}")
    obj = as_v1(obj, kind, ClaimError)  # v1beta1/v1beta2 converted, other versions refused
    meta = parse_meta(obj, kind, ClaimError, namespaced=True, generate_name=True)
    spec = obj.get("spec")
    if kind == "ResourceClaimTemplate":
        if not isinstance(spec, dict):
            raise ClaimError("spec is required")
        spec = spec.get("spec")
        prefix = "spec.spec"
    else:
        prefix = "spec"
    status = obj.get("status")
    if status is not None and not isinstance(status, dict):
        raise ClaimError(f"status must be an object, got {show(status)}")
    claim_spec = (parse_spec or parse_claim_spec)(spec, prefix)
    allocation = _allocation((status or {}).get("allocation"))
    _check_result_requests(allocation, claim_spec)
    raw_meta = obj["metadata"]  # a map: `parse_meta` checked it
    annotations = meta.annotations
    return Claim(
        kind="ResourceClaim" if kind == "ResourceClaim" else "ResourceClaimTemplate",  # not the decoded copy
        namespace=Namespace(meta.namespace),  # one copy each (`quota.values.meta`)
        name=meta.name,
        uid=ClaimUid(meta.uid),
        spec=claim_spec,
        allocation=allocation,
        recorded_charge=_recorded_charge(annotations.get(CHARGE_ANNOTATION)),
        owner=(_owner_in(raw_meta) or ("", ""))[1],
        recorded_devices=claim_record(claim_spec, annotations),
        created=_timestamp(raw_meta.get("creationTimestamp")),
    )


def claim_record(spec: ClaimSpec, annotations: Mapping[str, Any]) -> tuple[tuple[RecordKey, int], ...]:
    """The allocation record `annotations` carry for a claim of `spec` (`Claim.recorded_devices`):
    by result only on a claim of several classes, and naming its requests
    (`quota.objects.allocationrecord.recorded_devices`)."""
    if ALLOCATED_CHARGE_ANNOTATION not in annotations:
        return ()  # the record's first annotation is the record (the second only refines it)
    return recorded_devices(annotations, requests=frozenset(spec._classes) if spec._several else frozenset())


def _timestamp(raw: Any) -> float | None:
    """An RFC 3339 time as the API server writes it (`2026-11-23T00:00:00Z`); None otherwise.
    Only informational (a metric), so never an error; bounded before parsing."""
    if not isinstance(raw, str) or len(raw) > 64:
        return None
    return _seconds(raw)


# Claims created in one second share their timestamp (a list brings them by the thousand).
@functools.lru_cache(maxsize=1024)
def _seconds(raw: str) -> float | None:
    try:
        return datetime.fromisoformat(raw).timestamp()
    except ValueError:
        return None


def pod_owner(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """(name, uid) of the Pod a claim's controlling ownerReference names, if any (the
    resourceclaim controller sets it on the claims it stamps for a Pod)."""
    meta = obj.get("metadata")
    return _owner_in(meta) if isinstance(meta, dict) else None


def _owner_in(meta: Mapping[str, Any]) -> tuple[str, str] | None:
    """`pod_owner` of a claim's metadata."""
    owners = meta.get("ownerReferences")
    if not owners:
        return None
    for owner in owners if isinstance(owners, list) else ():
        if (isinstance(owner, dict) and owner.get("apiVersion") == "v1" and owner.get("kind") == "Pod"
                and owner.get("controller") is True and isinstance(owner.get("uid"), str)):
            name = owner.get("name")
            # Read, not converted: str() of a hostile value (an int of 5,000 digits) raises.
            return (name if isinstance(name, str) else ""), owner["uid"]
    return None


def _check_result_requests(allocation: tuple[AllocatedDevice, ...] | None, spec: ClaimSpec) -> None:
    """Each result names a request of the spec: its class decides which quotas it counts in.

    The API server's validateRequestNameRef refuses a result naming no request; a result
    that named nothing would be charged to no class and slip past every DeviceQuota scoped
    by deviceClassNames. The scheduler writes <request>/<subrequest> for firstAvailable
    (allocator.go), and a bare parent name would leave the class ambiguous, so only the
    names of exactly-requests and of subrequests are accepted.
    """
    names = spec._classes
    for i, result in enumerate(allocation or ()):
        if result.request not in names:
            raise ClaimError(
                f"status.allocation.devices.results[{i}].request: {show(result.request)} is not the name of an "
                "exactly request or of a firstAvailable subrequest (<request>/<subrequest>) in the claim"
            )


def parse_device_class(obj: Mapping[str, Any]) -> DeviceClass:
    if not isinstance(obj, dict):
        raise ClaimError("a DeviceClass must be an object")
    obj = as_v1(obj, "DeviceClass", ClaimError)
    name = parse_meta(obj, "DeviceClass", ClaimError, namespaced=False).name
    spec = obj.get("spec") or {}
    if not isinstance(spec, dict):
        raise ClaimError(f"DeviceClass {name}: spec must be an object")
    selectors = parse_selectors(spec.get("selectors"), f"DeviceClass {name}: spec.selectors")
    ext = spec.get("extendedResourceName")
    if ext is not None:
        ext = string(ext, f"DeviceClass {name}: spec.extendedResourceName", ClaimError, max_length=253)
    created = optional_string(dig(obj, "metadata", "creationTimestamp"), f"DeviceClass {name}: metadata.creationTimestamp",
                              ClaimError, max_length=64)
    return DeviceClass(DeviceClassName(name), selectors, ext, created)


def _allocation(raw: Any) -> tuple[AllocatedDevice, ...] | None:
    if raw is None:
        return None
    where = "status.allocation.devices.results"
    if not isinstance(raw, dict):
        raise ClaimError(f"status.allocation must be an object, got {show(raw)}")
    results = at_most(as_list(dig(raw, "devices", "results"), where, ClaimError), MAX_RESULTS, where, ClaimError)
    return tuple(_result(res, f"{where}[{i}]") for i, res in enumerate(results))


def _result(res: Any, where: str) -> AllocatedDevice:
    if not isinstance(res, dict):
        raise ClaimError(f"{where} must be an object")
    key = DeviceKey(
        _checked(_drivers, res.get("driver"),
                 lambda raw: dns_subdomain(raw, f"{where}.driver", ClaimError, max_length=63)),
        _checked(_pools, res.get("pool"), lambda raw: pool_name(raw, f"{where}.pool", ClaimError)),
        _checked(_devices, res.get("device"), lambda raw: dns_label(raw, f"{where}.device", ClaimError)),
    )
    admin, share, consumed = res.get("adminAccess"), res.get("shareID"), res.get("consumedCapacity")
    if admin is not None and type(admin) is not bool:
        raise ClaimError(f"{where}.adminAccess must be a boolean, got {show(admin)}")
    return AllocatedDevice(
        request=_checked(_results, res.get("request"),
                         lambda raw: string(raw, f"{where}.request", ClaimError, max_length=127)),
        key=key,
        admin_access=admin is True,
        share_id=None if share is None else string(share, f"{where}.shareID", ClaimError, max_length=36),
        consumed_capacity=() if consumed is None else parse_capacities(consumed, f"{where}.consumedCapacity"),
    )


# The names a cache of claims repeats, one copy each, checked once: 150,000 claims held
# each its own decoded copy of each allocated device's driver, pool, device and request
# name (bench/startup.py; their namespaces: `quota.values.meta`), and checked each again. Bounded
# (`quota.values.interning`): tenants name requests, and nodes (pools) come and go; past the
# limit a name is checked each time and not shared.
_drivers: Interned[str] = Interned(1024)
_pools: Interned[str] = Interned(65536)
_devices: Interned[str] = Interned(4096)
_results: Interned[str] = Interned(4096)


def _checked(table: Interned[str], raw: Any, check: Callable[[Any], str]) -> str:
    """`check(raw)` (which raises on a bad value, naming its field), for a name `table`
    has not held yet; the one copy `table` holds of it."""
    if type(raw) is str and (found := table.held(raw)) is not None:
        return found
    return table(check(raw))


# Our own annotation is a two-field JSON object of int64s: anything longer, deeper or
# larger was not written by us (a claim from before the install; the webhook refuses ours
# on new claims) and is ignored rather than parsed at any cost.
_CHARGE_MAX_BYTES = 256


def _recorded_charge(raw: Any) -> Charge | None:
    """The `draquota.io/charge` annotation; ignored (None) when absent or not ours."""
    if not isinstance(raw, str) or len(raw) > _CHARGE_MAX_BYTES:
        return None
    return _charge_of(raw)


# Most claims carry one of a few charges (a template's claims, one each): decoding it again
# was 5 us a claim event (`small_json`), a quarter of `parse_claim`.
@functools.lru_cache(maxsize=256)
def _charge_of(raw: str) -> Charge | None:
    data = small_json(raw, max_bytes=_CHARGE_MAX_BYTES)
    if not isinstance(data, dict):
        return None
    memory, devices = data.get("memory"), data.get("devices")
    if type(memory) is not int or type(devices) is not int or \
            not (0 <= memory <= MAX_INT64 and 0 <= devices <= MAX_INT64):
        return None
    return Charge(memory, devices)
