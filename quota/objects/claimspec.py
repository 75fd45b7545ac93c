"""The spec of a ResourceClaim (or of the claim a ResourceClaimTemplate stamps): its requests.

Neighbours: `quota.objects.claims` parses the claim around it (metadata, allocation results, the
charge and allocation record the leader annotated) and DeviceClasses, with the field
parsers here; `quota.pricing.pricer` prices the `ClaimSpec` built here; `quota.objects.jsonclaims`
remembers specs by content. Defaults follow k/k pkg/apis/resource/v1/defaults.go
(allocationMode ExactCount, count 1); the shapes follow TYPES
(staging/src/k8s.io/api/resource/v1/types.go) and the field rules those of the API
server (pkg/apis/resource/validation/validation.go, through `quota.values.validation`): what
it would refuse (a negative capacity request, 33 requests, a count past int64) is
refused here. A malformed spec raises `ClaimError` whose message names the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType
from typing import Any

from quota.values.model import AllocationMode, DeviceClassName
from quota.values.quantity import non_negative_amount
from quota.values.raw import as_list, dig, show
from quota.values.validation import (
    MAX_ATTRIBUTES_AND_CAPACITIES,
    MAX_CEL_LENGTH,
    MAX_DEVICE_REQUESTS,
    MAX_FIRST_AVAILABLE,
    MAX_SELECTORS,
    MAX_TOLERATIONS,
    at_most,
    dns_label,
    dns_subdomain,
    integer,
    optional_string,
    qualified_name,
    string,
)

__all__ = [
    "ClaimError",
    "Toleration",
    "DeviceRequirement",
    "Request",
    "unnamed",
    "ClaimSpec",
    "parse_claim_spec",
    "request_classes",
    "parse_selectors",
    "parse_capacities",
]

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


def unnamed(req: DeviceRequirement, *, selectors: tuple[str, ...] | None = None) -> DeviceRequirement:
    """`req` without its name (and with `selectors`, if given): what pricing caches a
    requirement's charge by. Built directly: `dataclasses.replace` was a tenth of a
    stored claim's accounting at start (every requirement, every pricing mode)."""
    return DeviceRequirement("", req.device_class, req.selectors if selectors is None else selectors,
                             req.allocation_mode, req.count, req.admin_access, req.capacity_requests, req.tolerations)


@dataclass(frozen=True, slots=True)
class Request:
    name: str
    alternatives: tuple[DeviceRequirement, ...]
    first_available: bool = False


@dataclass(frozen=True, slots=True)
class ClaimSpec:
    requests: tuple[Request, ...]
    # Hashed once: a spec is part of every memo key a claim is counted by (several a
    # claim, each hashing every request and selector again: 0.65 us a spec, half a
    # second of a list of 150,000 claims, bench/startup_local.py), and equal specs are
    # parsed into one object (`quota.objects.jsonclaims`).
    _hash: int = field(init=False, repr=False, compare=False)
    # `request_classes`, and whether it names several classes: read for every allocated
    # claim (its results' classes, its allocation record), computed once a spec.
    _classes: Mapping[str, DeviceClassName] = field(init=False, repr=False, compare=False)
    _several: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash(self.requests))
        classes = {alt.name: alt.device_class for req in self.requests for alt in req.alternatives}
        object.__setattr__(self, "_classes", MappingProxyType(classes))
        object.__setattr__(self, "_several", len(set(classes.values())) > 1)

    def __hash__(self) -> int:
        return self._hash


def request_classes(spec: ClaimSpec) -> Mapping[str, DeviceClassName]:
    """Each request's name ("req", or "req/sub" for a `firstAvailable` subrequest, as an
    allocation result names it) and its DeviceClass (read only: one per spec)."""
    return spec._classes


def parse_claim_spec(spec: Any, prefix: str = "spec") -> ClaimSpec:
    if not isinstance(spec, dict):
        raise ClaimError(f"{prefix} is required")
    devices = spec.get("devices") or {}
    if not isinstance(devices, dict):
        raise ClaimError(f"{prefix}.devices must be an object")
    where = f"{prefix}.devices.requests"
    raw_requests = at_most(as_list(devices.get("requests"), where, ClaimError), MAX_DEVICE_REQUESTS, where, ClaimError)
    requests = []
    for i, raw in enumerate(raw_requests):
        if not isinstance(raw, dict):
            raise ClaimError(f"{where}[{i}] must be an object")
        requests.append(_request(raw, f"{where}[{i}]"))
    _unique([r.name for r in requests], where)
    return ClaimSpec(tuple(requests))


def _unique(names: list[str], where: str) -> None:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            raise ClaimError(f"{where}[{i}].name: duplicate name {name!r}")
        seen.add(name)


def _request(raw: Mapping[str, Any], where: str) -> Request:
    name = dns_label(raw.get("name"), f"{where}.name", ClaimError)
    exactly, first = raw.get("exactly"), raw.get("firstAvailable")
    if (exactly is None) == (first is None):
        raise ClaimError(f"{where}: exactly one of exactly or firstAvailable must be set")
    if exactly is not None:
        return Request(name, (_requirement(exactly, name, f"{where}.exactly", subrequest=False),))
    if not isinstance(first, list) or not first:
        raise ClaimError(f"{where}.firstAvailable must be a non-empty list")
    at_most(first, MAX_FIRST_AVAILABLE, f"{where}.firstAvailable", ClaimError)
    alternatives = []
    for j, sub in enumerate(first):
        sub_where = f"{where}.firstAvailable[{j}]"
        sub_name = dns_label(dig(sub, "name"), f"{sub_where}.name", ClaimError)
        alternatives.append(_requirement(sub, f"{name}/{sub_name}", sub_where, subrequest=True))
    _unique([a.name for a in alternatives], f"{where}.firstAvailable")
    return Request(name, tuple(alternatives), first_available=True)


def _requirement(raw: Any, name: str, where: str, *, subrequest: bool) -> DeviceRequirement:
    if not isinstance(raw, dict):
        raise ClaimError(f"{where} must be an object")
    cls = dns_subdomain(raw.get("deviceClassName"), f"{where}.deviceClassName", ClaimError)
    mode = raw.get("allocationMode") or "ExactCount"
    if mode not in ("ExactCount", "All"):
        raise ClaimError(f"{where}.allocationMode: unsupported value {show(mode)}: supported values: All, ExactCount")
    count = raw.get("count")
    if mode == "All":
        if count not in (None, 0):
            raise ClaimError(f"{where}.count must not be specified when allocationMode is All")
        count = 0
    else:
        # v1 defaults count to 1; a stored v1beta2 object may keep 0 on a last subrequest.
        count = 1 if count is None or count == 0 else integer(count, f"{where}.count", ClaimError, minimum=1)
    admin = raw.get("adminAccess")
    if admin is not None and type(admin) is not bool:
        raise ClaimError(f"{where}.adminAccess must be a boolean, got {show(admin)}")
    return DeviceRequirement(
        name=name,
        device_class=DeviceClassName(cls),
        selectors=parse_selectors(raw.get("selectors"), f"{where}.selectors"),
        allocation_mode="All" if mode == "All" else "ExactCount",
        count=count,
        # Subrequests cannot ask for adminAccess (TYPES: DeviceSubRequest has no such field).
        admin_access=admin is True and not subrequest,
        capacity_requests=parse_capacities(dig(raw, "capacity", "requests"), f"{where}.capacity.requests"),
        tolerations=_tolerations(raw.get("tolerations"), f"{where}.tolerations"),
    )


_OPERATORS = ("Exists", "Equal")
_EFFECTS = ("", "NoSchedule", "NoExecute")


def _tolerations(raw: Any, where: str) -> tuple[Toleration, ...]:
    out = []
    for i, item in enumerate(at_most(as_list(raw, where, ClaimError), MAX_TOLERATIONS, where, ClaimError)):
        if not isinstance(item, dict):
            raise ClaimError(f"{where}[{i}] must be an object")
        fields = {
            f: optional_string(item.get(f), f"{where}[{i}].{f}", ClaimError, max_length=316)
            for f in ("key", "operator", "value", "effect")
        }
        operator = fields["operator"] or "Equal"
        if operator not in _OPERATORS or fields["effect"] not in _EFFECTS:
            raise ClaimError(f"{where}[{i}]: operator must be Exists or Equal, effect NoSchedule, NoExecute or empty")
        out.append(Toleration(fields["key"], operator, fields["value"], fields["effect"]))
    return tuple(out)


def parse_selectors(raw: Any, where: str) -> tuple[str, ...]:
    """CEL selectors (a request's, or a DeviceClass's, `quota.objects.claims`): their expressions."""
    out = []
    for i, sel in enumerate(at_most(as_list(raw, where, ClaimError), MAX_SELECTORS, where, ClaimError)):
        expr = dig(sel, "cel", "expression")
        out.append(string(expr, f"{where}[{i}].cel.expression", ClaimError, max_length=MAX_CEL_LENGTH))
    return tuple(out)


def parse_capacities(raw: Any, where: str) -> tuple[tuple[str, Fraction], ...]:
    """Capacity requests, or an allocation result's consumed capacities (`quota.objects.claims`):
    qualified names to non-negative amounts."""
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise ClaimError(f"{where} must be a map of capacity name to quantity")
    if len(raw) > MAX_ATTRIBUTES_AND_CAPACITIES:
        raise ClaimError(f"{where}: must have at most {MAX_ATTRIBUTES_AND_CAPACITIES} entries")
    out = []
    for key, value in raw.items():
        qualified_name(key, f"{where}: key", ClaimError)
        out.append((key, non_negative_amount(value, f"{where}[{key}]", ClaimError)))
    return tuple(sorted(out))
