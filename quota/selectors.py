"""Which devices of the inventory match a chain of CEL selectors.

Neighbours: `quota.cel` compiles and evaluates one expression; `quota.inventory` holds
the devices; `quota.pricing` asks `SelectorMatcher.match` for the candidates of a
request: its class's selectors, then the request's own, in the order the scheduler
evaluates them (staging/src/k8s.io/dynamic-resource-allocation/structured/.../
allocator.go), each stage seeing only the devices the previous one kept.

Why it is fast:
- A CEL evaluation costs microseconds to tens of microseconds, and a cluster publishes
  tens of thousands of devices. `CompiledSelector.references` names the device fields
  an expression can read; devices that agree on those fields (and on what pricing
  needs: driver, memory, sharing, taints) get the same verdict, so each stage groups
  its input by those values and evaluates CEL once per distinct projection. Verdicts
  are cached by (expressions, projected values), across inventory changes.
- Stage results are kept per pool, keyed by the identity of their input (the pool's
  device tuple, or the previous stage's result for that pool). After a slice update
  only that pool is recomputed; the other pools are reused and merely merged.
"""

from __future__ import annotations

import itertools
import weakref
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from quota.cel import (
    COST_EXCEEDED,
    COST_LIMIT,
    CelCompileError,
    CelRuntimeError,
    CompiledSelector,
    DeviceActivation,
    DevicePath,
    compile_selector,
    device_activation,
)
from quota.inventory import Inventory, PoolKey
from quota.model import MEMORY, Device

__all__ = ["SelectorError", "DeviceGroup", "Match", "SelectorMatcher"]

_MISSING = object()
_EMPTY: dict[str, object] = {}

GroupKey = tuple[object, ...]


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

    def devices(self) -> Iterator[Device]:
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


@dataclass(slots=True)
class _PoolPart:
    """One pool's groups in a partition, computed from `source` (compared by identity)."""

    source: object
    groups: list[tuple[GroupKey, list[Device]]]


@dataclass(slots=True)
class _Partition:
    """The usable devices grouped by base fields and a chain of path sets, per pool.

    Depends only on which fields are read, not on the expressions: every selector that
    reads `productName` shares one partition, whatever literal it compares with.
    """

    parent: _Partition | None
    paths: tuple[DevicePath, ...] | None
    extra: tuple[str, ...]
    pools: dict[PoolKey, _PoolPart] = field(default_factory=dict)
    generation: int = -1
    # Per group key, the devices of each pool in it: patched per changed pool.
    by_key: dict[GroupKey, dict[PoolKey, list[Device]]] = field(default_factory=dict)
    # Per group key, all its devices; dropped when the key's pools change.
    groups: dict[GroupKey, tuple[Device, ...]] = field(default_factory=dict)

    def merged(self) -> Iterator[tuple[Device, ...]]:
        """One group per key across pools: pricing then works per distinct device shape."""
        for key, per_pool in self.by_key.items():
            devices = self.groups.get(key)
            if devices is None:
                # chain runs in C: a group can hold tens of thousands of devices.
                devices = tuple(itertools.chain.from_iterable(per_pool.values()))
                self.groups[key] = devices
            yield devices


@dataclass(frozen=True, slots=True)
class _Stage:
    index: int
    expressions: tuple[str, ...]
    selectors: tuple[CompiledSelector, ...]
    # Sorted paths the stage's selectors read; None when one reads `device` dynamically.
    paths: tuple[DevicePath, ...] | None


@dataclass(slots=True)
class _Budget:
    remaining: int


class _StageFailed(Exception):
    def __init__(self, error: SelectorError) -> None:
        super().__init__(error.message)
        self.error = error


class SelectorMatcher:
    """Matches selector chains against one inventory, incrementally per pool."""

    def __init__(
        self,
        inventory: Inventory,
        *,
        cache_size: int = 1024,
        partition_cache_size: int = 32,
        verdict_cache_size: int = 65536,
    ) -> None:
        self._inventory = inventory
        self._compiled = _LRU(cache_size)
        # A partition references every usable device (about 2 MB at 58,000 devices), and
        # clusters read a few dozen distinct field sets at most: keep few, recompute rest.
        self._partitions = _LRU(partition_cache_size)
        self._results = _LRU(cache_size)
        self._verdicts = _LRU(verdict_cache_size)
        self._activations: weakref.WeakKeyDictionary[Device, DeviceActivation] = weakref.WeakKeyDictionary()
        # Pools (re)partitioned so far: lets tests and benchmarks see incrementality.
        self.pools_computed = 0

    def match(self, stages: Sequence[Sequence[str]], capacity_names: Sequence[str] = ()) -> Match:
        """Devices passing every selector of every stage, grouped.

        `capacity_names` are the capacities a request asks for: they join the grouping
        key so every device of a group has the same capacity to check and charge.
        """
        generation = self._inventory.generation
        extra = tuple(sorted(set(capacity_names)))
        chain = tuple(tuple(stage) for stage in stages)
        result_key = (chain, extra, generation)
        cached = self._results.lookup(result_key)
        if isinstance(cached, Match):
            return cached
        compiled: list[_Stage] = []
        for index, expressions in enumerate(chain):
            stage = self._stage(index, expressions)
            if isinstance(stage, SelectorError):
                return Match((), stage)
            compiled.append(stage)
        partition = self._partition(tuple(s.paths for s in compiled), extra, generation)
        budget = _Budget(MATCH_COST_BUDGET)
        try:
            kept = [devices for devices in partition.merged() if self._passes(compiled, devices[0], budget)]
            result = Match(tuple(DeviceGroup(devices) for devices in kept))
        except _StageFailed as failed:
            result = Match((), failed.error)
        self._results.store(result_key, result)
        return result

    def _stage(self, index: int, expressions: tuple[str, ...]) -> _Stage | SelectorError:
        cached = self._compiled.lookup((index, expressions))
        if isinstance(cached, (_Stage, SelectorError)):
            return cached
        selectors: list[CompiledSelector] = []
        result: _Stage | SelectorError
        for position, expression in enumerate(expressions):
            try:
                selectors.append(compile_selector(expression))
            except CelCompileError as err:
                result = SelectorError(index, position, str(err), compile_error=True)
                break
        else:
            paths: set[DevicePath] | None = set()
            for selector in selectors:
                paths = None if paths is None or selector.references is None else paths | selector.references
            result = _Stage(index, expressions, tuple(selectors), tuple(sorted(paths)) if paths is not None else None)
        self._compiled.store((index, expressions), result)
        return result

    # -- partitions ------------------------------------------------------------------

    def _partition(
        self, chain: tuple[tuple[DevicePath, ...] | None, ...], extra: tuple[str, ...], generation: int
    ) -> _Partition:
        """The partition for a chain of path sets, refined from the one for its prefix."""
        key = (chain, extra)
        partition = self._partitions.lookup(key)
        if not isinstance(partition, _Partition):
            parent = self._partition(chain[:-1], extra, generation) if chain else None
            partition = _Partition(parent, chain[-1] if chain else None, extra)
            self._partitions.store(key, partition)
        if partition.generation != generation:
            if partition.parent is not None:
                self._partition(chain[:-1], extra, generation)
            self._refresh(partition)
            partition.generation = generation
        return partition

    def _refresh(self, partition: _Partition) -> None:
        """Recompute only the pools whose source changed, and patch the merged groups.

        The inventory's journal names the pools rebuilt since the partition's
        generation (a parent partition is refreshed first, so its changed pools are
        among them); when the journal cannot tell, every pool's source is compared.
        """
        sources: Mapping[PoolKey, object] = (
            self._inventory.usable_pools() if partition.parent is None else partition.parent.pools
        )
        changed = self._inventory.changed_since(partition.generation) if partition.generation >= 0 else None
        candidates: Iterable[PoolKey] = (set(sources) | set(partition.pools)) if changed is None else changed
        for pool_key in candidates:
            source = sources.get(pool_key)
            part = partition.pools.get(pool_key)
            if part is not None and part.source is source:
                continue
            if part is not None:
                self._unmerge(partition, pool_key, part)
            if source is None:
                continue
            if isinstance(source, _PoolPart):
                groups = _refine(source.groups, partition.paths)
            else:
                assert isinstance(source, tuple)
                groups = _by_base(source, partition.extra)
            part = _PoolPart(source, groups)
            partition.pools[pool_key] = part
            for key, devices in groups:
                partition.by_key.setdefault(key, {})[pool_key] = devices
                partition.groups.pop(key, None)
            self.pools_computed += 1

    @staticmethod
    def _unmerge(partition: _Partition, pool_key: PoolKey, part: _PoolPart) -> None:
        del partition.pools[pool_key]
        for key, _ in part.groups:
            per_pool = partition.by_key[key]
            del per_pool[pool_key]
            if not per_pool:
                del partition.by_key[key]
            partition.groups.pop(key, None)

    # -- verdicts --------------------------------------------------------------------

    def _passes(self, stages: list[_Stage], device: Device, budget: _Budget) -> bool:
        """Every stage in order, as the scheduler evaluates them: later stages only see
        devices the earlier ones kept, so their runtime errors cannot fire on others."""
        return all(self._verdict(stage, device, budget) for stage in stages)

    def _verdict(self, stage: _Stage, device: Device, budget: _Budget) -> bool:
        """One stage's selectors on one device, cached by the values they can read."""
        key: Hashable | None = None
        if stage.paths is not None:
            key = (stage.expressions, tuple(_values(device, stage.paths)))
            cached = self._verdicts.lookup(key)
            if isinstance(cached, bool):
                return cached
        activation = self._activation(device)
        verdict = True
        for position, selector in enumerate(stage.selectors):
            limit = min(COST_LIMIT, budget.remaining)
            try:
                matched, cost = selector.evaluate_with_cost(activation, cost_limit=limit)
            except CelRuntimeError as err:
                message = f"{err} (device {device.key})"
                if limit < COST_LIMIT and str(err) == COST_EXCEEDED:
                    message = (
                        f"evaluating the selectors over the inventory exceeded the budget of "
                        f"{MATCH_COST_BUDGET} CEL cost units; make the selector cheaper or read "
                        "attributes by name so devices can be grouped"
                    )
                raise _StageFailed(SelectorError(stage.index, position, message, compile_error=False)) from None
            budget.remaining -= cost
            if not matched:
                verdict = False
                break
        if key is not None:
            self._verdicts.store(key, verdict)
        return verdict

    def _activation(self, device: Device) -> DeviceActivation:
        activation = self._activations.get(device)
        if activation is None:
            activation = device_activation(device)
            self._activations[device] = activation
        return activation


def _by_base(devices: Iterable[Device], extra: tuple[str, ...]) -> list[tuple[GroupKey, list[Device]]]:
    """Group by what pricing needs uniform within a group: driver, memory, sharing, taints.

    Capacities are compared by identity: `quota.slices` interns equal ones, and hashing
    their Fractions dominated grouping time (a finer grouping is still correct).
    """
    buckets: dict[GroupKey, list[Device]] = {}
    for device in devices:
        own = device.capacity.get(device.key.driver, _EMPTY)
        key: GroupKey = (device.key.driver, id(own.get(MEMORY)), device.allow_multiple_allocations, device.taints)
        for name in extra:
            domain, _, ident = name.rpartition("/")
            key += (id(device.capacity.get(domain or device.key.driver, _EMPTY).get(ident)),)
        found = buckets.get(key)
        if found is None:
            buckets[key] = [device]
        else:
            found.append(device)
    return list(buckets.items())


def _refine(
    groups: Iterable[tuple[GroupKey, list[Device]]], paths: tuple[DevicePath, ...] | None
) -> list[tuple[GroupKey, list[Device]]]:
    """Split groups further by the values of `paths` (by device when paths is None)."""
    out: list[tuple[GroupKey, list[Device]]] = []
    for key, devices in groups:
        if paths is None:
            out.extend(((*key, id(d)), [d]) for d in devices)
            continue
        if not paths:
            out.append((key, devices))
            continue
        buckets: dict[GroupKey, list[Device]] = {}
        for device in devices:
            sub = (*key, *_values(device, paths))
            found = buckets.get(sub)
            if found is None:
                buckets[sub] = [device]
            else:
                found.append(device)
        out.extend(buckets.items())
    return out


_TRUE, _FALSE = object(), object()

# CEL cost one match may spend across all the devices it evaluates (the per-evaluation
# limit is the scheduler's 1,000,000). About 200 ns a unit: ~1 s at worst, inside the
# webhook's 5 s timeout; grouping keeps real selectors orders of magnitude below it.
MATCH_COST_BUDGET = 5_000_000


def _typed(value: object) -> object:
    """A key that keeps CEL's types apart: Python has `1 == True` (and equal hashes),
    CEL does not, so bools (also inside list attributes) get their own tokens."""
    if value is True:
        return _TRUE
    if value is False:
        return _FALSE
    if type(value) is tuple:
        return (tuple, tuple(_typed(item) for item in value))
    return value


def _values(device: Device, paths: tuple[DevicePath, ...]) -> list[object]:
    """The value (or absence) of every path; capacities by identity (see `_by_base`)."""
    out: list[object] = []
    for path in paths:
        kind = path[0]
        if kind == "attributes":
            out.append(_typed(device.attributes.get(path[1], _EMPTY).get(path[2], _MISSING)))
        elif kind == "capacity":
            out.append(id(device.capacity.get(path[1], _EMPTY).get(path[2])))
        elif kind == "driver":
            out.append(device.key.driver)
        else:
            out.append(device.allow_multiple_allocations)
    return out
