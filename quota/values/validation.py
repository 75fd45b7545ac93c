"""API-server field rules shared by the parsers: names, integer ranges, list limits.

Neighbours: `quota.objects.slices`, `quota.objects.claims`, `quota.objects.claimspec`,
`quota.quotas.devicequota` and `quota.values.meta` call these while reading raw objects, so that
what the API server would refuse is refused here too, by field, instead of changing the arithmetic
(a negative count, a 10^5000 generation). The rules and limits follow k/k
pkg/apis/resource/validation/validation.go and the constants of
staging/src/k8s.io/api/resource/v1/types.go; name formats follow
k8s.io/apimachinery/pkg/util/validation/validation.go. Every function takes the error class of its
caller so each parser keeps raising its own error type. Pure.
"""

from __future__ import annotations

import re
from typing import Any

from quota.values.raw import show

__all__ = [
    "MAX_INT64",
    "MAX_DEVICE_REQUESTS",
    "MAX_FIRST_AVAILABLE",
    "MAX_SELECTORS",
    "MAX_TOLERATIONS",
    "MAX_RESULTS",
    "MAX_SLICE_DEVICES",
    "MAX_SLICE_DEVICES_ADVANCED",
    "MAX_ATTRIBUTES_AND_CAPACITIES",
    "MAX_ATTRIBUTE_VALUES",
    "MAX_ATTRIBUTE_LENGTH",
    "MAX_VALID_VALUES",
    "MAX_TAINTS",
    "MAX_COUNTER_CONSUMPTIONS",
    "MAX_COUNTER_SETS",
    "MAX_CEL_LENGTH",
    "integer",
    "at_most",
    "dns_label",
    "is_dns_label",
    "is_dns_subdomain",
    "dns_subdomain",
    "pool_name",
    "qualified_name",
    "is_qualified_name",
    "string",
    "optional_string",
]

# Kubernetes int64 fields (count, pool.generation, resourceSliceCount): Go's json
# decoder refuses anything outside int64, so no Python big integer gets past a parser.
MAX_INT64 = 2**63 - 1

# staging/src/k8s.io/api/resource/v1/types.go
MAX_DEVICE_REQUESTS = 32  # DeviceRequestsMaxSize
MAX_FIRST_AVAILABLE = 8  # FirstAvailableDeviceRequestMaxSize
MAX_SELECTORS = 32  # DeviceSelectorsMaxSize (requests and DeviceClasses)
MAX_TOLERATIONS = 16  # DeviceTolerationsMaxLength
MAX_RESULTS = 32  # AllocationResultsMaxSize
MAX_SLICE_DEVICES = 128  # ResourceSliceMaxDevices
MAX_SLICE_DEVICES_ADVANCED = 64  # ResourceSliceMaxDevicesWithAdvancedFeatures (taints, counters, lists)
MAX_ATTRIBUTES_AND_CAPACITIES = 32  # ResourceSliceMaxAttributesAndCapacitiesPerDevice
MAX_ATTRIBUTE_VALUES = 48  # ResourceSliceMaxAttributeValuesPerDevice
MAX_ATTRIBUTE_LENGTH = 64  # DeviceAttributeMaxValueLength
MAX_VALID_VALUES = 10  # CapacityRequestPolicyDiscreteMaxOptions
MAX_TAINTS = 16  # DeviceTaintsMaxLength
MAX_COUNTER_CONSUMPTIONS = 2  # ResourceSliceMaxDeviceCounterConsumptionsPerDevice
MAX_COUNTER_SETS = 8  # ResourceSliceMaxCounterSets
MAX_CEL_LENGTH = 10 * 1024  # CELSelectorExpressionMaxLength
_MAX_DOMAIN = 63  # DeviceMaxDomainLength
_MAX_ID = 32  # DeviceMaxIDLength
_MAX_POOL_NAME = 253  # PoolNameMaxLength

# apimachinery util/validation: IsDNS1123Label, IsDNS1123Subdomain (ASCII only).
_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_DNS_LABEL = re.compile(_LABEL)
_DNS_SUBDOMAIN = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def integer(value: Any, where: str, error: type[Exception], *, minimum: int = 0, maximum: int = MAX_INT64) -> int:
    """A JSON integer field in [minimum, maximum]; bools and floats are not integers."""
    if type(value) is not int:
        raise error(f"{where} must be an integer, got {show(value)}")
    if not minimum <= value <= maximum:
        bound = f"at least {minimum}" if value < minimum else f"at most {maximum}"
        raise error(f"{where} must be {bound}, got {show(value)}")
    return value


def at_most(items: list[Any], maximum: int, where: str, error: type[Exception]) -> list[Any]:
    """A list the API server caps at `maximum` entries (validateSlice/validateSet)."""
    if len(items) > maximum:
        raise error(f"{where}: must have at most {maximum} items, got {len(items)}")
    return items


def string(value: Any, where: str, error: type[Exception], *, max_length: int | None = None) -> str:
    if value is None or value == "":
        raise error(f"{where} is required")
    if not isinstance(value, str):
        raise error(f"{where} must be a string, got {show(value)}")
    if max_length is not None and len(value) > max_length:
        raise error(f"{where} must be at most {max_length} characters, got {len(value)}")
    return value


def optional_string(value: Any, where: str, error: type[Exception], *, max_length: int | None = None) -> str:
    """A string field whose absence reads as "" (taint values, toleration fields, uids)."""
    return "" if value is None or value == "" else string(value, where, error, max_length=max_length)


def is_dns_label(value: Any) -> bool:
    """Whether `dns_label` takes `value` as it is: the check alone, for a caller that
    builds its message (`where`) only when it fails (a list of 150,000 claims)."""
    return type(value) is str and 0 < len(value) <= 63 and _DNS_LABEL.fullmatch(value) is not None


def is_dns_subdomain(value: Any, max_length: int = 253) -> bool:
    """Whether `dns_subdomain` takes `value` as it is (see `is_dns_label`)."""
    return type(value) is str and 0 < len(value) <= max_length and _DNS_SUBDOMAIN.fullmatch(value) is not None


def dns_label(value: Any, where: str, error: type[Exception]) -> str:
    """Device, request and counter names (IsDNS1123Label: lower-case, at most 63)."""
    text = string(value, where, error)
    if len(text) > 63 or _DNS_LABEL.fullmatch(text) is None:
        raise error(f"{where}: {show(text)} must be a DNS label (lower-case alphanumerics and '-', at most 63)")
    return text


def dns_subdomain(value: Any, where: str, error: type[Exception], *, max_length: int = 253) -> str:
    """Object, class and driver names (IsDNS1123Subdomain; drivers at most 63)."""
    text = string(value, where, error)
    if len(text) > max_length or _DNS_SUBDOMAIN.fullmatch(text) is None:
        raise error(
            f"{where}: {show(text)} must be a DNS subdomain (lower-case alphanumerics, '-' and '.', "
            f"at most {max_length})"
        )
    return text


def pool_name(value: Any, where: str, error: type[Exception]) -> str:
    """validatePoolName: at most 253, slash-separated DNS subdomains."""
    text = string(value, where, error)
    if not text or len(text) > _MAX_POOL_NAME or not all(_DNS_SUBDOMAIN.fullmatch(p) for p in text.split("/")):
        raise error(f"{where}: {show(text)} must be slash-separated DNS subdomains, at most {_MAX_POOL_NAME}")
    return text


def is_qualified_name(name: str) -> bool:
    """A DRA QualifiedName: a C identifier (<= 32) with an optional `<domain>/` prefix."""
    domain, sep, ident = name.rpartition("/")
    if sep and (len(domain) > _MAX_DOMAIN or _DNS_SUBDOMAIN.fullmatch(domain) is None):
        return False
    return len(ident) <= _MAX_ID and _C_IDENTIFIER.fullmatch(ident) is not None


def qualified_name(value: Any, where: str, error: type[Exception]) -> str:
    """Attribute and capacity names (validateQualifiedName)."""
    text = string(value, where, error)
    if not is_qualified_name(text):
        raise error(
            f"{where}: {show(text)} must be a C identifier of at most {_MAX_ID} characters, "
            f"optionally prefixed by a DNS subdomain of at most {_MAX_DOMAIN} and '/'"
        )
    return text
