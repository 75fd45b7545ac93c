"""Parse one resource.k8s.io/v1 ResourceSlice into `Device` values.

Neighbours: `quota.inventory` (the only caller) owns pools and generations; this module
only reads JSON. Objects are the dicts `json.loads` or YAML give (plain `dict` checks: the ABC
`Mapping` check dominated load time). Names follow TYPES (staging/src/k8s.io/api/resource/v1/types.go):
attribute and capacity names without a domain belong to the driver's domain, exactly
one of nodeName / nodeSelector / allNodes / perDeviceNodeSelection scopes the slice.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from quota.model import (
    AttributeValue,
    Capacity,
    CounterConsumption,
    Device,
    DeviceKey,
    RequestPolicy,
    Taint,
    ValidRange,
    Version,
    qualify,
)
from quota.quantity import QuantityError, parse_quantity
from quota.raw import as_list, dig

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

    @property
    def pool_key(self) -> tuple[str, str]:
        return (self.driver, self.pool)


_SCALAR_KINDS = ("int", "bool", "string", "version")
# Semantic Versioning 2.0.0 (semver.org's own regex): the API server rejects slices whose
# version attributes do not parse (pkg/apis/resource/validation), so we do too.
_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)
_LIST_KINDS = {"ints": "int", "bools": "bool", "strings": "string", "versions": "version"}


def parse_slice(obj: Mapping[str, Any]) -> ParsedSlice:
    if not isinstance(obj, dict):
        raise SliceError("a ResourceSlice must be an object")
    name = str(dig(obj, "metadata", "name") or "")
    if not name:
        raise SliceError("ResourceSlice without metadata.name")
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        raise SliceError(f"ResourceSlice {name!r}: spec is missing")
    driver = spec.get("driver")
    pool = spec.get("pool")
    if not isinstance(driver, str) or not driver:
        raise SliceError(f"ResourceSlice {name!r}: spec.driver is required")
    if not isinstance(pool, dict) or not isinstance(pool.get("name"), str):
        raise SliceError(f"ResourceSlice {name!r}: spec.pool.name is required")
    pool_name = str(pool["name"])
    generation = _int(pool.get("generation", 0), f"ResourceSlice {name!r}: spec.pool.generation")
    count = _int(pool.get("resourceSliceCount", 1), f"ResourceSlice {name!r}: spec.pool.resourceSliceCount")
    node_name = spec.get("nodeName") if isinstance(spec.get("nodeName"), str) else None
    devices = []
    for index, raw in enumerate(as_list(spec.get("devices"), f"ResourceSlice {name!r}: spec.devices", SliceError)):
        where = f"ResourceSlice {name!r}: spec.devices[{index}]"
        if not isinstance(raw, dict):
            raise SliceError(f"{where}: must be an object")
        devices.append(_device(raw, driver, pool_name, node_name, where))
    return ParsedSlice(name, driver, pool_name, generation, max(count, 1), tuple(devices))


def _device(raw: Mapping[str, Any], driver: str, pool: str, slice_node: str | None, where: str) -> Device:
    dev_name = raw.get("name")
    if not isinstance(dev_name, str) or not dev_name:
        raise SliceError(f"{where}: name is required")
    where = f"{where} ({dev_name})"
    # perDeviceNodeSelection: the device names its own node, or none (pool-wide).
    node = slice_node if slice_node is not None else raw.get("nodeName")
    node = node if isinstance(node, str) and node else None
    scope = f"node/{node}" if node is not None else f"pool/{driver}/{pool}"
    return Device(
        key=DeviceKey(driver, pool, dev_name),
        attributes=_attributes(raw.get("attributes") or {}, driver, where),
        capacity=_capacities(raw.get("capacity") or {}, driver, where),
        allow_multiple_allocations=raw.get("allowMultipleAllocations") is True,
        node_name=node,
        scope=scope,
        taints=tuple(
            Taint(str(t.get("key", "")), str(t.get("value", "")), str(t.get("effect", "")))
            for t in as_list(raw.get("taints"), f"{where}: taints", SliceError)
            if isinstance(t, dict)
        ),
        consumes_counters=tuple(_consumption(c, where) for c in as_list(raw.get("consumesCounters"), f"{where}: consumesCounters", SliceError)),
        binds_to_node=raw.get("bindsToNode") is True,
    )


def _attributes(raw: Any, driver: str, where: str) -> dict[str, dict[str, AttributeValue]]:
    if not isinstance(raw, dict):
        raise SliceError(f"{where}: attributes must be a map")
    own: dict[str, AttributeValue] = {}
    out: dict[str, dict[str, AttributeValue]] = {driver: own}
    for qualified, value in raw.items():
        # Hot loop (tens of thousands of devices): error context is built only on error.
        try:
            parsed = _attribute(value)
        except SliceError as err:
            raise SliceError(f"{where}: attribute {qualified!r}: {err}") from None
        if "/" in qualified:
            domain, _, ident = qualified.partition("/")
            out.setdefault(domain, {})[ident] = parsed
        else:
            own[qualified] = parsed
    if not own:
        del out[driver]
    return out


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
        if not isinstance(items, list):
            raise SliceError(f"{kind} must be a list")
        return tuple(_scalar(_LIST_KINDS[kind], item) for item in items)  # type: ignore[return-value]
    return _scalar(kind, value[kind])


def _scalar(kind: str, value: Any) -> int | bool | str | Version:
    kind_of_value = type(value)
    if kind == "string" and kind_of_value is str:
        return value  # type: ignore[no-any-return]
    if kind == "int" and kind_of_value is int:
        return value  # type: ignore[no-any-return]
    if kind == "bool" and kind_of_value is bool:
        return value  # type: ignore[no-any-return]
    if kind == "version" and kind_of_value is str:
        if len(value) > 64 or _SEMVER.match(value) is None:
            raise SliceError(f"version {value!r} is not a semantic version 2.0.0 string of at most 64 characters")
        return Version(value)
    raise SliceError(f"{kind} value {value!r} has the wrong type")


def _capacities(raw: Any, driver: str, where: str) -> dict[str, dict[str, Capacity]]:
    if not isinstance(raw, dict):
        raise SliceError(f"{where}: capacity must be a map")
    out: dict[str, dict[str, Capacity]] = {}
    for qualified, value in raw.items():
        if not isinstance(value, dict) or "value" not in value:
            raise SliceError(f"{where}: capacity {qualified!r}: must be an object with a value")
        domain, ident = qualify(str(qualified), driver)
        policy = value.get("requestPolicy")
        try:
            amount = parse_quantity(value["value"])
        except QuantityError as err:
            raise SliceError(f"{where}: capacity {qualified!r}: {err}") from None
        parsed = Capacity(amount, _policy(policy, f"{where}: capacity {qualified!r}") if isinstance(policy, dict) else None)
        out.setdefault(domain, {})[ident] = _intern(parsed)
    return out


# Equal capacities share one object: tens of thousands of GPUs publish a handful of
# distinct capacities, and `quota.selectors` groups devices by capacity identity.
_INTERNED: dict[Capacity, Capacity] = {}
_INTERN_LIMIT = 65536


def _intern(capacity: Capacity) -> Capacity:
    found = _INTERNED.get(capacity)
    if found is not None:
        return found
    if len(_INTERNED) < _INTERN_LIMIT:
        _INTERNED[capacity] = capacity
    return capacity


def _policy(raw: Mapping[str, Any], where: str) -> RequestPolicy:
    default = _quantity(raw["default"], f"{where}.default") if raw.get("default") is not None else None
    values = tuple(sorted(_quantity(v, f"{where}.validValues") for v in as_list(raw.get("validValues"), f"{where}.validValues", SliceError)))
    rng = raw.get("validRange")
    valid_range = None
    if isinstance(rng, dict):
        valid_range = ValidRange(
            min=_quantity(rng.get("min", 0), f"{where}.validRange.min"),
            max=_quantity(rng["max"], f"{where}.validRange.max") if rng.get("max") is not None else None,
            step=_quantity(rng["step"], f"{where}.validRange.step") if rng.get("step") is not None else None,
        )
    return RequestPolicy(default=default, valid_values=values, valid_range=valid_range)


def _consumption(raw: Any, where: str) -> CounterConsumption:
    if not isinstance(raw, dict):
        raise SliceError(f"{where}: consumesCounters entries must be objects")
    counters = raw.get("counters") or {}
    if not isinstance(counters, dict):
        raise SliceError(f"{where}: consumesCounters counters must be a map")
    return CounterConsumption(
        counter_set=str(raw.get("counterSet", "")),
        counters={
            str(k): _quantity(v.get("value", 0) if isinstance(v, dict) else v, f"{where}: counter {k!r}")
            for k, v in counters.items()
        },
    )


def _quantity(value: Any, where: str) -> Fraction:
    try:
        return parse_quantity(value)
    except QuantityError as err:
        raise SliceError(f"{where}: {err}") from None


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SliceError(f"{where} must be an integer, got {value!r}")
    return value
