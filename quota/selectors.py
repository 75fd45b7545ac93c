"""Which devices of the inventory match a chain of CEL selectors.

Neighbours: `quota.cel` compiles and evaluates one expression; `quota.inventory` holds
the devices; `quota.pricing` asks `SelectorMatcher.match` for the candidates of a
request (its class's selectors, then the request's own, as the scheduler evaluates
them: staging/src/k8s.io/dynamic-resource-allocation/structured/.../allocator.go).

Why it is fast: a CEL-python evaluation costs tens of microseconds, so evaluating a new
selector over 40,000 devices would take seconds. `CompiledSelector.references` names
the device fields an expression can read; devices that agree on those fields (and on
what pricing needs: driver, memory, sharing, taints) must get the same result, so each
stage partitions its input by those values and evaluates CEL once per partition. A
cluster has thousands of identical GPUs but a handful of distinct projections.
Partitions and stage results are cached per inventory generation.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

from quota.cel import (
    CelCompileError,
    CelRuntimeError,
    CompiledSelector,
    DeviceActivation,
    DevicePath,
    compile_selector,
    device_activation,
)
from quota.inventory import Inventory
from quota.model import MEMORY, Device

__all__ = ["SelectorError", "DeviceGroup", "Match", "SelectorMatcher"]

_MISSING = object()
_EMPTY: dict[str, object] = {}


@dataclass(frozen=True, slots=True)
class SelectorError:
    """A selector that failed to compile, or errored on a device (stage, index, message)."""

    stage: int
    index: int
    message: str
    compile_error: bool


@dataclass(frozen=True, slots=True)
class DeviceGroup:
    """Devices identical in everything the selectors and pricing look at."""

    devices: tuple[Device, ...]

    @property
    def representative(self) -> Device:
        return self.devices[0]


@dataclass(frozen=True, slots=True)
class Match:
    groups: tuple[DeviceGroup, ...]
    error: SelectorError | None = None

    @property
    def count(self) -> int:
        return sum(len(g.devices) for g in self.groups)

    def devices(self) -> Iterable[Device]:
        for group in self.groups:
            yield from group.devices


class _LRU(OrderedDict[Hashable, object]):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def lookup(self, key: Hashable) -> object | None:
        value = self.get(key)
        if value is not None:
            self.move_to_end(key)
        return value

    def store(self, key: Hashable, value: object) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)


class SelectorMatcher:
    """Matches selector chains against one inventory, caching per inventory generation."""

    def __init__(self, inventory: Inventory, *, cache_size: int = 2048) -> None:
        self._inventory = inventory
        self._stages = _LRU(cache_size)
        self._partitions = _LRU(cache_size)
        self._activations: weakref.WeakKeyDictionary[Device, DeviceActivation] = weakref.WeakKeyDictionary()

    def match(self, stages: Sequence[Sequence[str]], capacity_names: Sequence[str] = ()) -> Match:
        """Devices passing every selector of every stage, grouped.

        `capacity_names` are the capacities a request asks for: they join the partition
        key so every device of a group has the same capacity to check and charge.
        """
        generation = self._inventory.generation
        extra = tuple(sorted(set(capacity_names)))
        groups: tuple[DeviceGroup, ...] | None = None
        prefix: tuple[tuple[str, ...], ...] = ()
        for stage_index, stage in enumerate(stages):
            prefix = (*prefix, tuple(stage))
            key = (prefix, extra, generation)
            cached = self._stages.lookup(key)
            if isinstance(cached, Match):
                if cached.error is not None:
                    return cached
                groups = cached.groups
                continue
            result = self._run_stage(stage_index, tuple(stage), groups, extra, prefix, generation)
            self._stages.store(key, result)
            if result.error is not None:
                return result
            groups = result.groups
        if groups is None:
            groups = self._partition(None, None, extra, (), generation)
        return Match(groups)

    def _run_stage(
        self,
        stage_index: int,
        stage: tuple[str, ...],
        previous: tuple[DeviceGroup, ...] | None,
        extra: tuple[str, ...],
        prefix: tuple[tuple[str, ...], ...],
        generation: int,
    ) -> Match:
        compiled: list[CompiledSelector] = []
        for index, expression in enumerate(stage):
            try:
                compiled.append(compile_selector(expression))
            except CelCompileError as err:
                return Match((), SelectorError(stage_index, index, str(err), compile_error=True))
        paths: frozenset[DevicePath] | None = frozenset()
        for selector in compiled:
            if selector.references is None or paths is None:
                paths = None
            else:
                paths = paths | selector.references
        groups = self._partition(previous, paths, extra, prefix[:-1], generation)
        kept = []
        for group in groups:
            activation = self._activation(group.representative)
            for index, selector in enumerate(compiled):
                try:
                    matched = selector.evaluate(activation)
                except CelRuntimeError as err:
                    device = group.representative.key
                    return Match((), SelectorError(stage_index, index, f"{err} (device {device})", compile_error=False))
                if not matched:
                    break
            else:
                kept.append(group)
        return Match(tuple(kept))

    def _partition(
        self,
        previous: tuple[DeviceGroup, ...] | None,
        paths: frozenset[DevicePath] | None,
        extra: tuple[str, ...],
        prefix: tuple[tuple[str, ...], ...],
        generation: int,
    ) -> tuple[DeviceGroup, ...]:
        ordered = tuple(sorted(paths)) if paths is not None else None
        key = ("partition", prefix, ordered, extra, generation)
        cached = self._partitions.lookup(key)
        if isinstance(cached, tuple):
            return cached
        if ordered is None:
            devices = self._inventory.usable().values() if previous is None else (
                d for g in previous for d in g.devices)
            result = tuple(DeviceGroup((d,)) for d in devices)
        else:
            buckets: dict[tuple[object, ...], list[Device]] = {}
            if previous is None:
                for device in self._inventory.usable().values():
                    buckets.setdefault((*_base(device, extra), *_values(device, ordered)), []).append(device)
            else:
                # Refining: the previous group's index already stands for everything the
                # earlier stages and pricing look at, so only the new paths are read.
                for index, group in enumerate(previous):
                    for device in group.devices:
                        buckets.setdefault((index, *_values(device, ordered)), []).append(device)
            result = tuple(DeviceGroup(tuple(b)) for b in buckets.values())
        self._partitions.store(key, result)
        return result

    def _activation(self, device: Device) -> DeviceActivation:
        activation = self._activations.get(device)
        if activation is None:
            activation = device_activation(device)
            self._activations[device] = activation
        return activation


def _base(device: Device, extra: tuple[str, ...]) -> list[object]:
    """What pricing needs uniform within a group: driver, memory, sharing, taints.

    Capacities are compared by identity: `quota.slices` interns equal ones, and hashing
    their Fractions dominated partitioning time (a finer partition is still correct).
    """
    own = device.capacity.get(device.key.driver, _EMPTY)
    key: list[object] = [device.key.driver, id(own.get(MEMORY)), device.allow_multiple_allocations, device.taints]
    for name in extra:
        domain, _, ident = name.rpartition("/")
        key.append(id(device.capacity.get(domain or device.key.driver, _EMPTY).get(ident)))
    return key


def _values(device: Device, paths: tuple[DevicePath, ...]) -> list[object]:
    """The value (or absence) of every path a selector chain reads."""
    out: list[object] = []
    for path in paths:
        kind = path[0]
        if kind == "attributes":
            out.append(device.attributes.get(path[1], _EMPTY).get(path[2], _MISSING))
        elif kind == "capacity":
            out.append(id(device.capacity.get(path[1], _EMPTY).get(path[2])))
        elif kind == "driver":
            out.append(device.key.driver)
        else:
            out.append(device.allow_multiple_allocations)
    return out
