"""Builders for CEL tests: `quota.values.model.Device`s the way compile_test.go describes them.

Attribute and capacity names are QualifiedNames as in a ResourceSlice: a bare name
belongs to the driver's domain (k/k dynamic-resource-allocation/cel/compile.go
parseQualifiedName), `domain/id` to that domain. Strings prefixed "v:" are versions.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from quota.cel import DeviceActivation, device_activation
from quota.values.model import Capacity, Device, DeviceKey, Version, qualify
from quota.values.quantity import parse_quantity


def _value(value: Any) -> Any:
    if isinstance(value, str) and value.startswith("v:"):
        return Version(value[2:])
    if isinstance(value, (list, tuple)):
        return tuple(_value(v) for v in value)
    return value


def make_device(
    driver: str = "",
    *,
    attributes: Mapping[str, Any] | None = None,
    capacity: Mapping[str, str | int | Fraction] | None = None,
    allow_multiple_allocations: bool = False,
    name: str = "dev-0",
) -> Device:
    attrs: dict[str, dict[str, Any]] = {}
    for qualified, value in (attributes or {}).items():
        domain, ident = qualify(qualified, driver)
        attrs.setdefault(domain, {})[ident] = _value(value)
    caps: dict[str, dict[str, Capacity]] = {}
    for qualified, quantity in (capacity or {}).items():
        domain, ident = qualify(qualified, driver)
        caps.setdefault(domain, {})[ident] = Capacity(parse_quantity(quantity))
    return Device(
        key=DeviceKey(driver, "pool", name),
        attributes=attrs,
        capacity=caps,
        allow_multiple_allocations=allow_multiple_allocations,
    )


def activation(driver: str = "", **kwargs: Any) -> DeviceActivation:
    return device_activation(make_device(driver, **kwargs))
