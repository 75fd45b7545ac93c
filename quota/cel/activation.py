"""`quota.values.model.Device` -> the CEL `device` variable, built once per device.

Mirrors DeviceMatches in k/k dynamic-resource-allocation/cel/compile.go: attributes and
capacity grouped by domain (the model already splits qualified names), version
attributes parsed as semver (a version that does not parse fails every selector on
that device, as there), capacities as Kubernetes quantities, `allowMultipleAllocations`
false when unset, and unknown domains reading as empty maps (`DomainMap`). Also the
minimal `device` for a selector whose references are known (`projected_activation`,
the other half of `quota.cel.references`; `quota.devices.columns` does the grouping): built per
evaluation from those paths alone, so a selector that must run once per device (a
`uuid`) costs ~1 µs a device to present instead of converting every attribute.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from fractions import Fraction
from typing import Any

from quota.cel.ops import DeviceActivation, DomainMap
from quota.cel.references import DevicePath
from quota.cel.values import EvalError, Quantity, Semver, parse_semver
from quota.values.model import AttributeValue, Device, Version

__all__ = ["DeviceActivation", "device_activation", "activation_error", "version_error", "cel_attribute",
           "projected_activation", "Projection", "projection_of"]


class _Broken(Exception):
    pass


def device_activation(device: Device) -> DeviceActivation:
    """Convert one inventory device; cheap enough to run once per slice update."""
    error: str | None = None
    attributes = DomainMap()
    for domain, values in device.attributes.items():
        converted: dict[str, Any] = {}
        for ident, value in values.items():
            try:
                converted[ident] = _attribute(value)
            except _Broken as exc:
                error = error or f"attribute {domain}/{ident}: parse semantic version: {exc}"
        attributes[domain] = converted
    capacity = DomainMap()
    for domain, caps in device.capacity.items():
        capacity[domain] = {ident: _quantity(cap.value) for ident, cap in caps.items()}
    return DeviceActivation(device.driver, attributes, capacity, bool(device.allow_multiple_allocations), error)


def activation_error(device: Device) -> str | None:
    """The `error` `device_activation(device)` would carry, without building the rest."""
    for domain, values in device.attributes.items():
        for ident, value in values.items():
            if type(value) is Version or type(value) is tuple:
                try:
                    _attribute(value)
                except _Broken as exc:
                    return f"attribute {domain}/{ident}: parse semantic version: {exc}"
    return None


# Per (is-attribute, domain): the ids a selector reads there.
Projection = tuple[tuple[bool, str, tuple[str, ...]], ...]


def projection_of(paths: Iterable[DevicePath]) -> Projection:
    """What `projected_activation` reads, from a selector's `references`."""
    by_domain: dict[tuple[bool, str], list[str]] = {}
    for path in paths:
        if path[0] in ("attributes", "capacity"):
            by_domain.setdefault((path[0] == "attributes", path[1]), []).append(path[2])
    return tuple((is_attribute, domain, tuple(ids)) for (is_attribute, domain), ids in by_domain.items())


def projected_activation(device: Device, projection: Projection, error: str | None) -> DeviceActivation:
    """`device_activation(device)` restricted to the paths of `projection`.

    An expression whose `references` those paths cover cannot tell the two apart: it
    reads ids by literal name only (`quota.cel.references`), so a domain the device
    lacks stays an unknown domain (empty map), an id it lacks stays absent ("no such
    key"), and a present one holds the same converted value. `error` must be
    `activation_error(device)`: a broken version anywhere fails every selector."""
    attributes = capacity = _NO_DOMAINS
    for is_attribute, domain, ids in projection:
        if is_attribute:
            values = device.attributes.get(domain)
            if values is not None:
                if attributes is _NO_DOMAINS:
                    attributes = DomainMap()
                attributes[domain] = {i: cel_attribute(values[i]) for i in ids if i in values}
        else:
            caps = device.capacity.get(domain)
            if caps is not None:
                if capacity is _NO_DOMAINS:
                    capacity = DomainMap()
                capacity[domain] = {i: _quantity(caps[i].value) for i in ids if i in caps}
    return DeviceActivation(device.driver, attributes, capacity, bool(device.allow_multiple_allocations), error)


# Shared by every projected device without a domain on that side: CEL never mutates it.
_NO_DOMAINS = DomainMap()


def cel_attribute(value: AttributeValue) -> Any:
    """What CEL sees of an attribute value (None for a version it cannot parse)."""
    kind = type(value)
    if kind is str or kind is int or kind is bool:
        return value
    try:
        return _attribute(value)
    except _Broken:
        return None  # never read: the activation's error fails the evaluation first


def _attribute(value: AttributeValue) -> Any:
    if isinstance(value, tuple):
        return tuple(_attribute(v) for v in value)
    if isinstance(value, Version):
        semver = _semver(value.text)
        if isinstance(semver, str):
            raise _Broken(semver)
        return semver
    return value


# Thousands of devices share a handful of driver versions and memory sizes; the values
# are immutable, so one object per distinct text or amount serves them all.
@functools.lru_cache(maxsize=4096)
def _semver(text: str) -> Semver | str:
    try:
        return parse_semver(text)
    except EvalError as exc:
        return str(exc)


def version_error(text: str) -> str | None:
    """Why CEL cannot parse a version attribute (the API server's regex lets through
    numbers past uint64, which blang/semver refuses), or None."""
    semver = _semver(text)
    return semver if isinstance(semver, str) else None


@functools.lru_cache(maxsize=4096)
def _quantity(value: Fraction) -> Quantity:
    return Quantity(value)
