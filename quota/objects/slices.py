"""Parse one resource.k8s.io/v1 ResourceSlice into `Device` values.

Neighbours: `quota.devices.inventory` (the only caller) owns pools and generations; this module
only reads JSON. Objects are the dicts `json.loads` or YAML give (plain `dict` checks: the ABC
`Mapping` check dominated load time). Names follow TYPES (staging/src/k8s.io/api/resource/v1/types.go):
attribute and capacity names without a domain belong to the driver's domain, exactly
one of nodeName / nodeSelector / allNodes / perDeviceNodeSelection scopes the slice.
Field rules are the API server's (pkg/apis/resource/validation/validation.go, through
`quota.values.validation`): names, list limits, non-negative int64 counts and quantities,
unique device names, consistent requestPolicies. What it refuses, we refuse by field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from quota.objects.conversion import as_v1
from quota.objects.requestpolicy import parse_policy
from quota.values import validation
from quota.values.interning import Interned
from quota.values.meta import parse_meta
from quota.values.model import (
    AttributeValue,
    Capacity,
    CounterConsumption,
    Device,
    DeviceKey,
    RequestPolicy,
    Taint,
    Version,
)
from quota.values.quantity import non_negative_amount
from quota.values.raw import as_list, show
from quota.values.validation import at_most, dns_label, dns_subdomain, integer, optional_string, qualified_name, string

__all__ = ["SliceError", "ParsedSlice", "parse_slice"]


class SliceError(ValueError):
    """A ResourceSlice this tool cannot read; the message names the slice and field."""


@dataclass(frozen=True, slots=True)
class ParsedSlice:
    name: str
    driver: str
    pool: str
    pool_generation: int
    slice_count: int
    devices: tuple[Device, ...]
    # `sharedCounters`: per counter set of the pool, its counters (a slice holds these or devices).
    counter_sets: tuple[tuple[str, Mapping[str, Fraction]], ...] = ()

    @property
    def pool_key(self) -> tuple[str, str]:
        return (self.driver, self.pool)


_SCALAR_KINDS = ("int", "bool", "string", "version")
# Semantic Versioning 2.0.0 (semver.org's own regex): the API server rejects slices whose
# version attributes do not parse (pkg/apis/resource/validation), so we do too.
_SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?",
    re.ASCII,  # Go's \d is ASCII only
)
_LIST_KINDS = {"ints": "int", "bools": "bool", "strings": "string", "versions": "version"}
_MIN_INT64 = -(2**63)
_DEVICE_NAME = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")  # IsDNS1123Label, fast path


def parse_slice(obj: Mapping[str, Any]) -> ParsedSlice:
    if not isinstance(obj, dict):
        raise SliceError("a ResourceSlice must be an object")
    obj = as_v1(obj, "ResourceSlice", SliceError)  # v1beta1 devices keep their fields under basic
    name = parse_meta(obj, "ResourceSlice", SliceError, namespaced=False).name
    where = f"ResourceSlice {name}: spec"
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        raise SliceError(f"{where} is required")
    driver = dns_subdomain(spec.get("driver"), f"{where}.driver", SliceError, max_length=63)
    pool = spec.get("pool")
    if not isinstance(pool, dict):
        raise SliceError(f"{where}.pool is required")
    pool_name = validation.pool_name(pool.get("name"), f"{where}.pool.name", SliceError)
    generation = integer(pool.get("generation", 0), f"{where}.pool.generation", SliceError)
    count = integer(pool.get("resourceSliceCount"), f"{where}.pool.resourceSliceCount", SliceError, minimum=1)
    node_name = _node_scope(spec, where)
    raw_devices = as_list(spec.get("devices"), f"{where}.devices", SliceError)
    if raw_devices and spec.get("sharedCounters") is not None:
        raise SliceError(f"{where}: only one of sharedCounters or devices is allowed")
    counter_sets = _counter_sets(spec.get("sharedCounters"), f"{where}.sharedCounters")
    per_device = spec.get("perDeviceNodeSelection") is True
    devices = []
    seen: set[str] = set()
    for index, raw in enumerate(raw_devices):
        at = f"{where}.devices[{index}]"
        if not isinstance(raw, dict):
            raise SliceError(f"{at} must be an object")
        device = _device(raw, driver, pool_name, node_name, at, per_device)
        if device.key.device in seen:
            raise SliceError(f"{at}.name: duplicate device name {device.key.device!r} in the slice")
        seen.add(device.key.device)
        devices.append(device)
    if len(devices) > validation.MAX_SLICE_DEVICES_ADVANCED:
        _check_device_count(devices, where)
    return ParsedSlice(name, driver, pool_name, generation, count, tuple(devices), counter_sets)


def _node_scope(spec: Mapping[str, Any], where: str) -> str | None:
    """Exactly one of nodeName / nodeSelector / allNodes / perDeviceNodeSelection (validation.go)."""
    node_name = spec.get("nodeName")
    set_fields = [f for f in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection") if spec.get(f) is not None]
    if len(set_fields) != 1:
        raise SliceError(f"{where}: exactly one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection is required")
    for flag in ("allNodes", "perDeviceNodeSelection"):
        if flag in set_fields and spec[flag] is not True:
            raise SliceError(f"{where}.{flag} must be either unset or set to true")
    if node_name is None:
        return None
    return dns_subdomain(node_name, f"{where}.nodeName", SliceError)


def _check_device_count(devices: list[Device], where: str) -> None:
    # ResourceSliceMaxDevicesWithAdvancedFeatures applies once any device uses taints,
    # counters or list attributes (validateResourceSliceSpec).
    advanced = any(
        d.taints or d.consumes_counters or any(isinstance(v, tuple) for a in d.attributes.values() for v in a.values())
        for d in devices
    )
    limit = validation.MAX_SLICE_DEVICES_ADVANCED if advanced else validation.MAX_SLICE_DEVICES
    if len(devices) > limit:
        raise SliceError(f"{where}.devices: must have at most {limit} items, got {len(devices)}")


def _device(
    raw: Mapping[str, Any], driver: str, pool: str, slice_node: str | None, where: str, per_device: bool
) -> Device:
    dev_name = raw.get("name")
    if type(dev_name) is not str or _DEVICE_NAME.fullmatch(dev_name) is None:
        dev_name = dns_label(dev_name, f"{where}.name", SliceError)  # raises, naming what is wrong
    where = f"{where} ({dev_name})"
    attributes, capacity = raw.get("attributes") or {}, raw.get("capacity") or {}
    if type(attributes) is dict and type(capacity) is dict and len(attributes) + len(capacity) > validation.MAX_ATTRIBUTES_AND_CAPACITIES:
        raise SliceError(
            f"{where}: the total number of attributes and capacities must not exceed "
            f"{validation.MAX_ATTRIBUTES_AND_CAPACITIES}"
        )
    shared = raw.get("allowMultipleAllocations")
    if shared is not None and type(shared) is not bool:
        raise SliceError(f"{where}.allowMultipleAllocations must be a boolean, got {show(shared)}")
    node = slice_node
    if per_device:
        # perDeviceNodeSelection: the device names its own node, or none (pool-wide).
        own = raw.get("nodeName")
        node = None if own is None else dns_subdomain(own, f"{where}.nodeName", SliceError)
    elif any(raw.get(f) is not None for f in ("nodeName", "nodeSelector", "allNodes")):
        raise SliceError(f"{where}: nodeName, nodeSelector and allNodes can only be set with perDeviceNodeSelection")
    scope = f"node/{node}" if node is not None else f"pool/{driver}/{pool}"
    return Device(
        key=DeviceKey(driver, pool, dev_name),
        attributes=_attributes(attributes, driver, where),
        capacity=_capacities(capacity, driver, where, shared=shared is True),
        allow_multiple_allocations=shared is True,
        node_name=node,
        scope=scope,
        taints=_taints(raw.get("taints"), where) if raw.get("taints") is not None else (),
        consumes_counters=tuple(
            _consumption(c, where)
            for c in at_most(as_list(raw.get("consumesCounters"), f"{where}.consumesCounters", SliceError),
                             validation.MAX_COUNTER_CONSUMPTIONS, f"{where}.consumesCounters", SliceError)
        ),
        binds_to_node=raw.get("bindsToNode") is True,
    )


_TAINT_EFFECTS = ("None", "NoSchedule", "NoExecute")


def _taints(raw: Any, where: str) -> tuple[Taint, ...]:
    where = f"{where}.taints"
    taints = []
    for i, item in enumerate(at_most(as_list(raw, where, SliceError), validation.MAX_TAINTS, where, SliceError)):
        if not isinstance(item, dict):
            raise SliceError(f"{where}[{i}] must be an object")
        effect = item.get("effect")
        if effect not in _TAINT_EFFECTS:
            raise SliceError(f"{where}[{i}].effect: unsupported value {show(effect)}: supported values: None, NoExecute, NoSchedule")
        key = string(item.get("key"), f"{where}[{i}].key", SliceError, max_length=316)
        value = optional_string(item.get("value"), f"{where}[{i}].value", SliceError, max_length=63)
        taints.append(Taint(key, value, str(effect)))
    return tuple(taints)


def _attributes(raw: Any, driver: str, where: str) -> dict[str, dict[str, AttributeValue]]:
    if not isinstance(raw, dict):
        raise SliceError(f"{where}.attributes must be a map, got {show(raw)}")
    own: dict[str, AttributeValue] = {}
    out: dict[str, dict[str, AttributeValue]] = {driver: own}
    values = 0
    for qualified, value in raw.items():
        # Hot loop (tens of thousands of devices): error context is built only on error.
        if (parts := _VALID_NAMES.get(qualified)) is None:
            parts = _check_name(qualified, f"{where}.attributes")
        if type(value) is dict and len(value) == 1 and type(text := value.get("string")) is str and \
                len(text) <= validation.MAX_ATTRIBUTE_LENGTH:
            parsed: AttributeValue = _strings(text)  # `_scalar`'s first case, inline: most values are strings
        else:
            try:
                parsed = _attribute(value)
            except SliceError as err:
                raise SliceError(f"{where}.attributes[{qualified!r}]: {err}") from None
        values += len(parsed) if type(parsed) is tuple else 1
        domain, ident = parts
        if domain:
            out.setdefault(domain, {})[ident] = parsed
        else:
            own[ident] = parsed
    if values > validation.MAX_ATTRIBUTE_VALUES:
        raise SliceError(f"{where}: the total number of attribute values must not exceed {validation.MAX_ATTRIBUTE_VALUES}")
    if not own:
        del out[driver]
    return out


# Attribute and capacity names already checked, each with its domain ("" for none) and
# identifier, shared by every device naming them: drivers repeat a few dozen names over
# tens of thousands of devices. Bounded so hostile unique names cannot grow it forever.
_VALID_NAMES: dict[Any, tuple[str, str]] = {}
_VALID_NAMES_LIMIT = 65536


def _check_name(name: Any, where: str) -> tuple[str, str]:
    qualified_name(name, f"{where}: key", SliceError)
    domain, sep, ident = name.partition("/")
    parts = (_strings(domain), _strings(ident)) if sep else ("", _strings(name))
    if len(_VALID_NAMES) < _VALID_NAMES_LIMIT:
        _VALID_NAMES[name] = parts
    return parts


def _attribute(value: Any) -> AttributeValue:
    # Fast path first: an API object has exactly one key per attribute.
    if type(value) is dict and len(value) == 1:
        ((kind, item),) = value.items()
        if kind in _SCALAR_KINDS:
            return _scalar(kind, item)
    if not isinstance(value, dict):
        raise SliceError("must be an object with one of int, bool, string, version")
    kinds = [k for k in (*_SCALAR_KINDS, *_LIST_KINDS) if k in value]
    if len(kinds) != 1:
        raise SliceError("exactly one of int, bool, string, version (or a list form) must be set")
    kind = kinds[0]
    if kind in _LIST_KINDS:
        items = value[kind]
        if not isinstance(items, list) or not items:
            raise SliceError(f"{kind} must be a non-empty list")
        return tuple(_scalar(_LIST_KINDS[kind], item) for item in items)  # type: ignore[return-value]
    return _scalar(kind, value[kind])


def _scalar(kind: str, value: Any) -> int | bool | str | Version:
    kind_of_value = type(value)
    if kind == "string" and kind_of_value is str and len(value) <= validation.MAX_ATTRIBUTE_LENGTH:
        return _strings(value)
    if kind == "int" and kind_of_value is int and _MIN_INT64 <= value <= validation.MAX_INT64:
        return value  # type: ignore[no-any-return]
    if kind == "bool" and kind_of_value is bool:
        return value  # type: ignore[no-any-return]
    if kind == "version" and kind_of_value is str:
        if (version := _versions.get(value)) is not None:
            return version
        if len(value) > validation.MAX_ATTRIBUTE_LENGTH or _SEMVER.fullmatch(value) is None:
            raise SliceError(f"version {show(value)} is not a semantic version 2.0.0 string of at most 64 characters")
        version = Version(value)
        if len(_versions) < _VERSIONS_KEPT:
            _versions[value] = version
        return version
    if kind == "string" and kind_of_value is str:
        raise SliceError(f"string must be at most {validation.MAX_ATTRIBUTE_LENGTH} characters, got {len(value)}")
    if kind == "int" and kind_of_value is int:
        raise SliceError(f"int {show(value)} is out of the int64 range")
    raise SliceError(f"{kind} value {show(value)} has the wrong type")


def _capacities(raw: Any, driver: str, where: str, *, shared: bool) -> dict[str, dict[str, Capacity]]:
    if not isinstance(raw, dict):
        raise SliceError(f"{where}.capacity must be a map, got {show(raw)}")
    out: dict[str, dict[str, Capacity]] = {}
    for qualified, value in raw.items():
        if (parts := _VALID_NAMES.get(qualified)) is None:
            parts = _check_name(qualified, f"{where}.capacity")
        if type(value) is dict and len(value) == 1 and type(text := value.get("value")) is str and \
                (plain := _PLAIN_CAPACITIES.get(text)) is not None:
            # A value alone, parsed before: the one Capacity of that text (hot loop, as above).
            out.setdefault(parts[0] or driver, {})[parts[1]] = plain
            continue
        at = f"{where}.capacity[{qualified!r}]"
        if not isinstance(value, dict) or "value" not in value:
            raise SliceError(f"{at}: must be an object with a value")
        domain, ident = parts[0] or driver, parts[1]
        amount = _quantity(value["value"], f"{at}.value")
        raw_policy = value.get("requestPolicy")
        policy = None
        if raw_policy is not None:
            if not shared:
                # validateSingleAllocatableDeviceCapacity: consumable capacity needs sharing.
                raise SliceError(f"{at}.requestPolicy: allowMultipleAllocations must be true")
            policy = _policy(raw_policy, amount, f"{at}.requestPolicy")
        capacity = _intern(Capacity(amount, policy))
        if policy is None and len(value) == 1 and type(text := value["value"]) is str and \
                len(_PLAIN_CAPACITIES) < _CACHE_LIMIT:
            _PLAIN_CAPACITIES[text] = capacity
        out.setdefault(domain, {})[ident] = capacity
    return _shared_capacities(out)


# A capacity of a value alone by the value's text (`_capacities`): what `_quantity` and
# `_intern` would make of it, without hashing its Fraction again for each device.
_PLAIN_CAPACITIES: dict[str, Capacity] = {}


# Equal capacities share one object: tens of thousands of GPUs publish a handful of
# distinct capacities, and `quota.devices.selectors` groups devices by capacity identity.
_intern: Interned[Capacity] = Interned(65536)
# So do attribute and capacity names and string attribute values, and versions, each
# decoded apart: 58,000 GPUs publish 624,000 string values, 62,000 distinct (a uuid each,
# the rest their models' few), and 174,000 versions of a handful (bench/startup_local.py).
# Held while fewer than the limit (a gone device's uuid may stay, never more than that).
_strings: Interned[str] = Interned(65536)
# Versions by their text, checked once (a semver match each was a tenth of a slice's parse).
_VERSIONS_KEPT = 4096
_versions: dict[str, Version] = {}
# And a device's whole capacity map (never mutated: `Device.capacity` is read only), keyed
# by its capacities' identities (hashing their Fractions is slow): a kept map holds its
# capacities, so no other object can take their ids while it is kept.
_CAPACITY_MAPS_KEPT = 4096
_capacity_maps: dict[tuple[tuple[str, tuple[tuple[str, int], ...]], ...], dict[str, dict[str, Capacity]]] = {}


def _shared_capacities(out: dict[str, dict[str, Capacity]]) -> dict[str, dict[str, Capacity]]:
    key = tuple((domain, tuple((ident, id(c)) for ident, c in inner.items())) for domain, inner in out.items())
    if (found := _capacity_maps.get(key)) is not None:
        return found
    if len(_capacity_maps) < _CAPACITY_MAPS_KEPT:
        _capacity_maps[key] = out
    return out


def _counter_sets(raw: Any, where: str) -> tuple[tuple[str, Mapping[str, Fraction]], ...]:
    """`sharedCounters`: what partitions of one physical device draw on together."""
    if raw is None:
        return ()
    out = []
    for i, item in enumerate(at_most(as_list(raw, where, SliceError), validation.MAX_COUNTER_SETS, where, SliceError)):
        if not isinstance(item, dict):
            raise SliceError(f"{where}[{i}] must be an object")
        name = dns_label(item.get("name"), f"{where}[{i}].name", SliceError)
        out.append((name, _counters(item.get("counters"), f"{where}[{i}]")))
    return tuple(out)


def _counters(raw: Any, where: str) -> dict[str, Fraction]:
    counters = raw or {}
    if not isinstance(counters, dict):
        raise SliceError(f"{where}.counters must be a map")
    return {
        dns_label(k, f"{where}.counters: key", SliceError): _quantity(
            v.get("value") if isinstance(v, dict) else v, f"{where}.counters[{k!r}]"
        )
        for k, v in counters.items()
    }


def _consumption(raw: Any, where: str) -> CounterConsumption:
    if not isinstance(raw, dict):
        raise SliceError(f"{where}.consumesCounters entries must be objects")
    return CounterConsumption(
        counter_set=dns_label(raw.get("counterSet"), f"{where}.consumesCounters.counterSet", SliceError),
        counters=_counters(raw.get("counters"), f"{where}.consumesCounters"),
    )


# Checked results for the few distinct capacity strings and policies an inventory
# repeats tens of thousands of times (Fraction comparisons dominated load time).
# Bounded, like the other caches here, against hostile unique values.
_AMOUNTS: dict[str, Fraction] = {}
_POLICIES: dict[tuple[Any, ...], RequestPolicy] = {}
_CACHE_LIMIT = 4096


def _quantity(value: Any, where: str) -> Fraction:
    """A non-negative quantity: a negative capacity would lower charges."""
    if type(value) is str and (found := _AMOUNTS.get(value)) is not None:
        return found
    amount = non_negative_amount(value, where, SliceError)
    if type(value) is str and len(_AMOUNTS) < _CACHE_LIMIT:
        _AMOUNTS[value] = amount
    return amount


def _policy(raw: Any, capacity: Fraction, where: str) -> RequestPolicy:
    key = _policy_key(raw, capacity)
    found = _POLICIES.get(key) if key is not None else None
    if found is None:
        found = parse_policy(raw, capacity, where, SliceError)
        if key is not None and len(_POLICIES) < _CACHE_LIMIT:
            _POLICIES[key] = found
    return found


def _policy_key(raw: Any, capacity: Fraction) -> tuple[Any, ...] | None:
    """The fields a policy is read from, when all are plain strings (else: no caching)."""
    if type(raw) is not dict:
        return None
    rng = raw.get("validRange")
    rng = {} if rng is None else rng
    values = raw.get("validValues") or []
    if type(rng) is not dict or type(values) is not list:
        return None
    fields = (raw.get("default"), rng.get("min"), rng.get("max"), rng.get("step"))
    if not all(type(f) is str or f is None for f in fields) or not all(type(v) is str for v in values):
        return None
    return (capacity, raw.get("validRange") is not None, *fields, *values)
