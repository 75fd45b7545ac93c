"""What a quota counts: devices of some classes, and devices that are what it names.

Neighbours: `quota.quotas.devicequota` parses a DeviceQuota's `spec.deviceClassNames` and
`spec.devices` into a `Scope` with `parse_scope` (a cluster-wide quota reads the same
fields the same way); `quota.pricing.pricer` prices a claim per `DeviceSelection` (the devices
part), `Pricing.charge_for` applies a whole `Scope`; `quota.status.quotastatus` reports the
selectors that do not compile (`selection_problems`).

Why two parts. `deviceClassNames` names how a claim *asks*: another DeviceClass whose
selectors match the same GPUs (any cluster admin may create one; a driver often ships
several) asks for the same devices under another name, and a quota scoped by class
never sees it. `spec.devices` names what the devices *are*: their driver, and CEL
selectors in the DeviceClass selector environment (`device.driver`,
`device.attributes`, `device.capacity`, `device.allowMultipleAllocations`), so a quota
holds whichever class a claim names. Both set, a device counts only when its request's
class is listed and the device is selected.

A `DeviceSelection` is a small frozen value: equal selections share their prices and
their verdict caches, whichever quota carries them.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from quota.cel import CelCompileError, compile_selector
from quota.values.model import DeviceClassName
from quota.values.raw import as_list, show
from quota.values.validation import MAX_CEL_LENGTH, at_most, dns_subdomain, string

__all__ = ["EVERY_DEVICE", "MAX_CLASS_NAMES", "MAX_SCOPE_DRIVERS", "MAX_SCOPE_SELECTORS", "DeviceSelection", "Scope",
           "parse_scope", "selection_problems"]

MAX_CLASS_NAMES = 64  # the CRD's maxItems for deviceClassNames
MAX_SCOPE_DRIVERS = 32  # the CRD's maxItems for devices.drivers
# The CRD's maxItems for devices.selectors: each one is evaluated on every candidate of
# every claim in the namespace (`quota.pricing.pricer`), so a handful, as a DeviceClass needs.
MAX_SCOPE_SELECTORS = 8
_MAX_DRIVER = 63  # DriverNameMaxLength
_MAX_PROBLEM = 1024  # characters of one compile error in a condition message


@dataclass(frozen=True, slots=True)
class DeviceSelection:
    """`spec.devices`: a device is selected when its driver is one of `drivers` (any driver
    when empty) and then every selector of `expressions`, in order, is true for it. Both
    empty: every device. A selector that cannot say (it does not compile, or fails on a
    device) selects the device: a quota never stops counting a device because its own
    selector broke."""

    drivers: frozenset[str] = frozenset()
    expressions: tuple[str, ...] = ()

    @property
    def everything(self) -> bool:
        return not self.drivers and not self.expressions

    def admits_driver(self, driver: str) -> bool:
        return not self.drivers or driver in self.drivers

    @property
    def stage(self) -> tuple[str, ...]:
        """The selectors as one CEL stage (`quota.pricing.pricer`), behind a guard on the drivers
        when both are set: a selector only ever sees devices of the listed drivers, so it
        may read their domain unguarded. The guard's verdict is cached per driver."""
        if not self.drivers or not self.expressions:
            return self.expressions
        names = ", ".join(f'"{driver}"' for driver in sorted(self.drivers))  # DNS subdomains: no quoting needed
        return (f"device.driver in [{names}]", *self.expressions)

    def sort_key(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return tuple(sorted(self.drivers)), self.expressions


EVERY_DEVICE = DeviceSelection()


@dataclass(frozen=True, slots=True)
class Scope:
    """The requests and devices a quota charges: requests for `classes` (every class when
    empty), and of those only the devices `devices` selects."""

    classes: frozenset[DeviceClassName] = frozenset()
    devices: DeviceSelection = EVERY_DEVICE

    @property
    def everything(self) -> bool:
        return not self.classes and self.devices.everything

    def admits_class(self, device_class: DeviceClassName) -> bool:
        return not self.classes or device_class in self.classes


def parse_scope(spec: Mapping[str, Any], where: str, error: type[Exception]) -> Scope:
    """`spec.deviceClassNames` and `spec.devices`, checked as the CRD checks them."""
    classes = as_list(spec.get("deviceClassNames"), f"{where}: spec.deviceClassNames", error)
    at_most(classes, MAX_CLASS_NAMES, f"{where}: spec.deviceClassNames", error)
    for i, cls in enumerate(classes):
        dns_subdomain(cls, f"{where}: spec.deviceClassNames[{i}]", error)
    return Scope(frozenset(DeviceClassName(c) for c in classes), _selection(spec.get("devices"), where, error))


def _selection(raw: Any, where: str, error: type[Exception]) -> DeviceSelection:
    if raw is None:
        return EVERY_DEVICE
    if not isinstance(raw, dict):
        raise error(f"{where}: spec.devices must be a map, got {show(raw)}")
    if not raw:
        raise error(f"{where}: spec.devices must name drivers or selectors (absent: every device)")
    drivers = as_list(raw.get("drivers"), f"{where}: spec.devices.drivers", error)
    at_most(drivers, MAX_SCOPE_DRIVERS, f"{where}: spec.devices.drivers", error)
    for i, driver in enumerate(drivers):
        dns_subdomain(driver, f"{where}: spec.devices.drivers[{i}]", error, max_length=_MAX_DRIVER)
        if driver in drivers[:i]:  # a set in the CRD: the API server refuses the same
            raise error(f"{where}: spec.devices.drivers[{i}]: duplicate driver {show(driver)}")
    selectors = as_list(raw.get("selectors"), f"{where}: spec.devices.selectors", error)
    at_most(selectors, MAX_SCOPE_SELECTORS, f"{where}: spec.devices.selectors", error)
    expressions = []
    for i, selector in enumerate(selectors):
        at = f"{where}: spec.devices.selectors[{i}]"
        cel = selector.get("cel") if isinstance(selector, dict) else None
        if not isinstance(cel, dict):
            raise error(f"{at}.cel is required (a map with an expression)")
        expressions.append(string(cel.get("expression"), f"{at}.cel.expression", error, max_length=MAX_CEL_LENGTH))
    # In the order written: like a DeviceClass's, a later selector only sees the devices
    # the earlier ones kept, so a guard (`has(...)`) first keeps the next from failing.
    return DeviceSelection(frozenset(drivers), tuple(expressions))


@functools.lru_cache(maxsize=256)
def selection_problems(expressions: tuple[str, ...]) -> tuple[str, ...]:
    """Why selectors do not compile, one message each (none: empty): what the quota's
    status says (`quota.status.quotastatus`). Cached: the controller asks on every write, and
    compiling a 10 KiB expression takes up to ~0.2 s (`quota.cel` caches successes only)."""
    problems = []
    for i, expression in enumerate(expressions):
        try:
            compile_selector(expression)
        except CelCompileError as err:
            # Bounded: the message quotes the expression, and a condition holds 32 KiB at most.
            message = str(err)
            message = message if len(message) <= _MAX_PROBLEM else message[:_MAX_PROBLEM - 3] + "..."
            problems.append(f"spec.devices.selectors[{i}].cel.expression: {message}")
    return tuple(problems)
