"""Memory sources: a device's memory where its driver does not publish `memory`.

Neighbours: `quota.devices.inventory` gives every device of a slice its sourced memory as it
parses the slice (`MemorySources.apply`), so pricing, the exact charge of allocations,
the allocation record and the inventory metrics read one `Device.memory` whatever its
source; `serve`, `check` and `top` load the same file (`load_memory_sources`): the
shipped defaults (`quota/manifests/memorysources.yaml`), then the files a flag names.

A driver lists its sources in order; a device of the driver that publishes no `memory`
takes the first that applies:
- `capacity: <name>`: a capacity of the driver's domain that holds the memory under
  another name (NVIDIA's VFIO passthrough GPUs publish `addressableMemory`); requests
  and `consumedCapacity` name it as the device publishes it;
- `selector` + `memory`: an amount for the devices a CEL selector (a DeviceClass's
  environment) is true for (a Gaudi3's 128Gi of HBM, chosen by its `model` attribute). A
  selector that fails on a device (a missing attribute) does not apply to it.
A listed driver is an accelerator driver: a device of it that no source gives a memory
is an accelerator whose memory nothing tells, unpriced (docs/charging.md, "Devices
without a memory"), never a device outside the quotas. Devices of other drivers with no
`memory` (an RDMA NIC) have no memory: quotas without a scope do not govern them.

The file (`kind: MemorySources`) replaces the shipped entry of each driver it names and
keeps the others. Admin configuration, never a tenant's: selectors run with the
scheduler's per-evaluation cost limit and are evaluated once per distinct value of the
fields they read. No I/O but reading the named files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib.resources import files
from typing import Any

import yaml

from quota.cel import CelCompileError, CelRuntimeError, compile_selector, device_activation
from quota.devices.columns import cel_value
from quota.objects.slices import ParsedSlice
from quota.values.model import MEMORY, Capacity, Device
from quota.values.quantity import format_quantity, non_negative_amount
from quota.values.raw import as_list, show
from quota.values.validation import MAX_CEL_LENGTH, dns_subdomain, optional_string, qualified_name, string

__all__ = ["KIND", "MemorySource", "MemorySources", "MemorySourcesError", "NO_SOURCES", "default_memory_sources",
           "load_memory_sources", "parse_memory_sources"]

KIND = "MemorySources"
_API_VERSION = "draquota.io/v1alpha1"
_MAX_DRIVERS = 256
_MAX_SOURCES = 64


class MemorySourcesError(ValueError):
    """A memory sources file this tool cannot read; the message names the file and field."""


@dataclass(frozen=True, slots=True)
class MemorySource:
    """One way to tell a device's memory: a capacity name, or an amount for the devices
    `selector` selects. `reference` says where the number comes from (shown by docs)."""

    capacity: str = ""
    selector: str = ""
    memory: Capacity | None = None  # one object per source: devices group by its identity
    reference: str = ""

    def describe(self) -> str:
        if self.capacity:
            return f"capacity {self.capacity}"
        return f"{format_quantity(self.memory.value if self.memory else 0)} where {self.selector}"


@dataclass(frozen=True, slots=True)
class MemorySources:
    """The memory sources of each listed driver (see the module doc)."""

    drivers: Mapping[str, tuple[MemorySource, ...]] = field(default_factory=dict)
    # Per (driver, source, values its selector reads): whether it applies. Admin selectors
    # over a few attribute values: bounded by the distinct devices of the fleet.
    _verdicts: dict[tuple[object, ...], bool] = field(default_factory=dict, compare=False, repr=False)

    def listed(self, driver: str) -> bool:
        return driver in self.drivers

    def merged(self, other: MemorySources) -> MemorySources:
        """These sources with `other`'s entries in place of the drivers it names."""
        return MemorySources({**self.drivers, **other.drivers})

    def apply(self, parsed: ParsedSlice) -> ParsedSlice:
        """`parsed` with each device of a listed driver that publishes no `memory` given
        its sourced memory (the same object when nothing changes: most slices)."""
        sources = self.drivers.get(parsed.driver)
        if sources is None:
            return parsed
        devices = tuple(self.sourced(d, sources) for d in parsed.devices)
        if all(new is old for new, old in zip(devices, parsed.devices, strict=True)):
            return parsed
        return replace(parsed, devices=devices)

    def sourced(self, device: Device, sources: tuple[MemorySource, ...]) -> Device:
        if device.own_capacity(MEMORY) is not None:
            return device  # a memory is an accelerator's mark already: no copy of 58,000 GPUs
        for index, source in enumerate(sources):
            if source.capacity:
                found = device.own_capacity(source.capacity)
                if found is not None:
                    return replace(device, sourced_memory=found, sourced_from=source.capacity,
                                   accelerator_driver=True)
            elif self._selects(device, index, source):
                return replace(device, sourced_memory=source.memory, accelerator_driver=True)
        return replace(device, accelerator_driver=True)

    def _selects(self, device: Device, index: int, source: MemorySource) -> bool:
        selector = compile_selector(source.selector)  # compiled when the file was read: cached
        paths = selector.references
        key = None if paths is None else (device.driver, index, *(cel_value(device, p) for p in sorted(paths)))
        if key is not None and key in self._verdicts:
            return self._verdicts[key]
        try:
            verdict = selector.evaluate(device_activation(device))
        except CelRuntimeError:
            verdict = False  # a device the selector cannot read is not the model it names
        if key is not None:
            self._verdicts[key] = verdict
        return verdict


NO_SOURCES = MemorySources()


def parse_memory_sources(doc: Any, where: str) -> MemorySources:
    """A `kind: MemorySources` document, checked; raises MemorySourcesError naming `where`."""
    if not isinstance(doc, dict):
        raise MemorySourcesError(f"{where}: a MemorySources document must be a map, got {show(doc)}")
    if doc.get("apiVersion") != _API_VERSION or doc.get("kind") != KIND:
        raise MemorySourcesError(f"{where}: expected apiVersion {_API_VERSION}, kind {KIND}; got "
                                 f"{show(doc.get('apiVersion'))}, {show(doc.get('kind'))}")
    drivers: dict[str, tuple[MemorySource, ...]] = {}
    entries = as_list(doc.get("drivers"), f"{where}: drivers", MemorySourcesError)
    if len(entries) > _MAX_DRIVERS:
        raise MemorySourcesError(f"{where}: drivers: at most {_MAX_DRIVERS}, got {len(entries)}")
    for i, entry in enumerate(entries):
        at = f"{where}: drivers[{i}]"
        if not isinstance(entry, dict):
            raise MemorySourcesError(f"{at} must be a map, got {show(entry)}")
        name = dns_subdomain(entry.get("name"), f"{at}.name", MemorySourcesError, max_length=63)
        if name in drivers:
            raise MemorySourcesError(f"{at}.name: driver {name} is listed twice")
        raw = as_list(entry.get("sources"), f"{at}.sources", MemorySourcesError)
        if len(raw) > _MAX_SOURCES:
            raise MemorySourcesError(f"{at}.sources: at most {_MAX_SOURCES}, got {len(raw)}")
        drivers[name] = tuple(_source(s, f"{at}.sources[{j}]") for j, s in enumerate(raw))
    return MemorySources(drivers)


def _source(raw: Any, at: str) -> MemorySource:
    if not isinstance(raw, dict):
        raise MemorySourcesError(f"{at} must be a map, got {show(raw)}")
    unknown = set(raw) - {"capacity", "selector", "memory", "reference"}
    if unknown:
        raise MemorySourcesError(f"{at}: unknown field(s) {', '.join(sorted(unknown))}")
    reference = optional_string(raw.get("reference"), f"{at}.reference", MemorySourcesError)
    if "capacity" in raw:
        if "selector" in raw or "memory" in raw:
            raise MemorySourcesError(f"{at}: a source is either a capacity, or a selector and a memory, not both")
        name = qualified_name(raw["capacity"], f"{at}.capacity", MemorySourcesError)
        if "/" in name:
            raise MemorySourcesError(f"{at}.capacity: name a capacity of the driver's own domain, without a prefix")
        return MemorySource(capacity=name, reference=reference)
    if "selector" not in raw or "memory" not in raw:
        raise MemorySourcesError(f"{at}: a source needs a capacity, or both a selector and a memory")
    expression = string(raw["selector"], f"{at}.selector", MemorySourcesError, max_length=MAX_CEL_LENGTH)
    try:
        compile_selector(expression)
    except CelCompileError as err:
        raise MemorySourcesError(f"{at}.selector: {err}") from None
    amount = non_negative_amount(raw["memory"], f"{at}.memory", MemorySourcesError)
    return MemorySource(selector=expression, memory=Capacity(amount), reference=reference)


def default_memory_sources() -> MemorySources:
    """The shipped defaults (`quota/manifests/memorysources.yaml`)."""
    resource = files("quota.manifests") / "memorysources.yaml"
    return parse_memory_sources(yaml.safe_load(resource.read_text(encoding="utf-8")), "the shipped memory sources")


def load_memory_sources(paths: Sequence[str] = (), *, defaults: bool = True) -> MemorySources:
    """The shipped defaults (unless `defaults` is False), then each file of `paths`, each
    replacing the entries of the drivers it names. Raises MemorySourcesError."""
    sources = default_memory_sources() if defaults else NO_SOURCES
    for path in paths:
        sources = sources.merged(_read(path))
    return sources


def _read(path: str) -> MemorySources:
    try:
        with open(path, encoding="utf-8") as handle:
            docs = [d for d in yaml.safe_load_all(handle) if d is not None]
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise MemorySourcesError(f"{path}: {err}") from None
    merged = NO_SOURCES
    for doc in docs:
        merged = merged.merged(parse_memory_sources(doc, path))
    return merged
