"""The device inventory, built incrementally from resource.k8s.io/v1 ResourceSlices.

Neighbours: `quota.objects.slices` parses one slice into devices; `quota.devices.selectors` matches
selectors against `Inventory.usable()`; `quota.pricing.pricer` looks allocated devices up with
`Inventory.lookup`. Pure and synchronous: the controller feeds it watch events. Each
usable pool is indexed by field (`quota.devices.columns`) when it is rebuilt, so that no selector
ever has to read a field on every device.

Pool rules follow the scheduler (k8s.io/dynamic-resource-allocation/structured, pools.go):
only the highest `pool.generation` of a pool counts, and a pool is usable for
allocation only once all `resourceSliceCount` slices of that generation are present.
Adding, changing or deleting a slice rebuilds only that slice's pool.

A relist (`replace_all`) builds the new inventory aside, pausing at
`quota.values.work.pause_point` after each slice parsed and each pool indexed (`serve` runs it
in slices, `kube.rebuilds`), and swaps it in with a few assignments at the end: a
reader between two slices sees the old inventory whole, never part of the new one.
Nothing else mutates the inventory meanwhile (the slice reflector awaits its relist
before it applies any event), so nothing is lost by the swap.
"""

from __future__ import annotations

import gc
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Set
from contextlib import contextmanager
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from quota.devices.columns import ColumnTable, Field, PoolIndex
from quota.devices.memorysources import NO_SOURCES, MemorySources
from quota.objects.slices import ParsedSlice, parse_slice
from quota.values.model import Device, DeviceKey
from quota.values.work import drop, pause_point, pauses

__all__ = ["Inventory", "PoolKey", "InventoryChange", "gc_paused"]

PoolKey = tuple[str, str]  # (driver, pool name)
_JOURNAL_LENGTH = 1024


@dataclass(frozen=True, slots=True)
class InventoryChange:
    """What one slice event changed: the pools rebuilt and the generation after it."""

    pools: tuple[PoolKey, ...]
    generation: int


@dataclass(slots=True)
class _Pool:
    slices: dict[str, ParsedSlice] = field(default_factory=dict)
    # Devices of the highest generation, complete or not (for allocated-claim lookups).
    known: dict[str, Device] = field(default_factory=dict)
    # The counter sets of the highest generation (`sharedCounters`), by name.
    counters: dict[str, Mapping[str, Fraction]] = field(default_factory=dict)
    usable: bool = False
    unusable_reason: str = ""


class Inventory:
    """All devices the drivers publish, keyed by (driver, pool, device).

    `generation` increases on every change so callers can key caches on it.
    `memory_sources` gives devices whose driver publishes no `memory` theirs
    (`quota.devices.memorysources`), as each slice is read.
    """

    def __init__(self, memory_sources: MemorySources = NO_SOURCES) -> None:
        self.memory_sources = memory_sources
        self._slice_pool: dict[str, PoolKey] = {}
        self._pools: dict[PoolKey, _Pool] = {}
        self._usable: dict[DeviceKey, Device] = {}
        # Per usable pool, its devices and their columns; a pool's index is replaced only
        # when that pool is rebuilt.
        self._usable_pools: dict[PoolKey, PoolIndex] = {}
        self._columns = ColumnTable()
        # Per field, how many usable pools have it: a field no pool has needs no lookup.
        self._field_pools: dict[Field, int] = {}
        # Usable pools where some device draws on shared counters (partitionable devices):
        # pricing reads counters only for candidates of these.
        self._counter_pools: set[PoolKey] = set()
        # (generation, pools it rebuilt) for recent changes: caches catch up per pool.
        self._journal: deque[tuple[int, tuple[PoolKey, ...]]] = deque(maxlen=_JOURNAL_LENGTH)
        self.generation = 0

    # -- mutations (synchronous: atomic on the event loop) -------------------------

    def add_or_update_slice(self, obj: Mapping[str, Any]) -> InventoryChange:
        """Insert or replace one ResourceSlice (raises SliceError on malformed input)."""
        parsed = self.memory_sources.apply(parse_slice(obj))
        affected: list[PoolKey] = []
        previous = self._slice_pool.get(parsed.name)
        if previous is not None and previous != parsed.pool_key:
            # Driver and pool are immutable in the API; handle a replaced object anyway.
            self._pools[previous].slices.pop(parsed.name, None)
            affected.append(previous)
        self._slice_pool[parsed.name] = parsed.pool_key
        self._pools.setdefault(parsed.pool_key, _Pool()).slices[parsed.name] = parsed
        affected.append(parsed.pool_key)
        return self._rebuild(affected)

    def delete_slice(self, name: str) -> InventoryChange:
        pool_key = self._slice_pool.pop(name, None)
        if pool_key is None:
            return InventoryChange((), self.generation)
        self._pools[pool_key].slices.pop(name, None)
        return self._rebuild([pool_key])

    def replace_all(self, objs: Iterable[Mapping[str, Any]]) -> InventoryChange:
        """Swap in a fresh list (after a relist): pools absent from it disappear (module doc:
        built aside, swapped in one step; a malformed slice raises before anything changed)."""
        return self.replace_parsed(self.parsed(obj) for obj in objs)

    def parsed(self, obj: Mapping[str, Any]) -> ParsedSlice:
        """A ResourceSlice as this inventory holds it (`replace_parsed` takes these): a list
        that arrives a piece at a time is parsed as it comes (`kube.caches.SliceStore`)."""
        return self.memory_sources.apply(parse_slice(obj))

    def replace_parsed(self, items: Iterable[ParsedSlice]) -> InventoryChange:
        """`replace_all` of slices already `parsed`."""
        fresh = Inventory(self.memory_sources)
        fresh._columns = self._columns  # interning only: columns equal to old ones are shared
        with gc_paused():
            for item in items:
                fresh._slice_pool[item.name] = item.pool_key
                fresh._pools.setdefault(item.pool_key, _Pool()).slices[item.name] = item
                pause_point()
            for pool_key in list(fresh._pools):
                fresh._index_pool(pool_key)
                pause_point()
        gone = set(self._pools)
        # Freed in pieces: only what no query handed out. `usable`, `usable_pools` and
        # `field_pools` may be in a paused reader's hands (a partition built in slices,
        # `quota.devices.selectors`): emptied under it, its iteration would fail or see devices
        # missing. They go by reference counting once their last reader is done.
        old: list[Any] = [self._slice_pool, self._pools]
        # The swap: no pause point until it is done.
        self._slice_pool, self._pools, self._usable = fresh._slice_pool, fresh._pools, fresh._usable
        self._usable_pools, self._field_pools = fresh._usable_pools, fresh._field_pools
        self._counter_pools = fresh._counter_pools
        self.generation += 1
        # A relist may drop pools no journal entry names: caches must rescan everything.
        self._journal.clear()
        change = InventoryChange(tuple(sorted(gone | set(self._pools))), self.generation)
        for table in old:  # no one reads these any more: freed in pieces
            drop(table)
        return change

    # -- queries ----------------------------------------------------------------

    def usable(self) -> Mapping[DeviceKey, Device]:
        """Devices of complete pools at their highest generation: allocation candidates."""
        return self._usable

    def usable_pools(self) -> Mapping[PoolKey, PoolIndex]:
        """The usable devices by pool, indexed by field; the same object until it changes."""
        return self._usable_pools

    def field_pools(self) -> Mapping[Field, int]:
        """How many usable pools have each field (absent: none has it)."""
        return self._field_pools

    def changed_since(self, generation: int) -> set[PoolKey] | None:
        """Pools rebuilt after `generation`, or None when that is too long ago to tell."""
        if generation == self.generation:
            return set()
        if not self._journal or self._journal[0][0] > generation + 1:
            return None
        return {pool for gen, pools in self._journal if gen > generation for pool in pools}

    def counter_pools(self) -> Set[PoolKey]:
        """Usable pools with a device that consumes counters (empty: no partitionable devices)."""
        return self._counter_pools

    def counters(self, pool_key: PoolKey) -> Mapping[str, Mapping[str, Fraction]]:
        """A usable pool's counter sets by name, each its counters' amounts (empty: none)."""
        pool = self._pools.get(pool_key)
        return pool.counters if pool is not None and pool.usable else {}

    def lookup(self, key: DeviceKey) -> Device | None:
        """A device of the pool's highest generation, usable or not (allocated claims)."""
        pool = self._pools.get((key.driver, key.pool))
        return pool.known.get(key.device) if pool is not None else None

    def unusable_pools(self) -> dict[PoolKey, str]:
        return {key: pool.unusable_reason for key, pool in self._pools.items() if not pool.usable}

    # -- internals ----------------------------------------------------------------

    def _rebuild(self, pool_keys: Iterable[PoolKey]) -> InventoryChange:
        rebuilt = [key for key in dict.fromkeys(pool_keys) if self._index_pool(key)]
        self.generation += 1
        self._journal.append((self.generation, tuple(rebuilt)))
        return InventoryChange(tuple(rebuilt), self.generation)

    def _index_pool(self, pool_key: PoolKey) -> bool:
        """Bring one pool's usable devices and index up to its slices; False: no such pool."""
        pool = self._pools.get(pool_key)
        if pool is None:
            return False
        if pool.usable:
            for name in pool.known:
                self._usable.pop(DeviceKey(pool_key[0], pool_key[1], name), None)
        self._count_fields(self._usable_pools.pop(pool_key, None), -1)
        self._counter_pools.discard(pool_key)
        if not pool.slices:
            del self._pools[pool_key]
            return True
        self._refresh_pool(pool)
        if pool.usable:
            for device in pool.known.values():
                self._usable[device.key] = device
            index = self._columns.index(tuple(pool.known.values()))
            self._usable_pools[pool_key] = index
            self._count_fields(index, 1)
            if any(device.consumes_counters for device in pool.known.values()):
                self._counter_pools.add(pool_key)
        return True

    def _count_fields(self, index: PoolIndex | None, delta: int) -> None:
        if index is None:
            return
        counts = self._field_pools
        for name in index.columns:
            left = counts.get(name, 0) + delta
            if left:
                counts[name] = left
            else:
                del counts[name]

    @staticmethod
    def _refresh_pool(pool: _Pool) -> None:
        top = max(s.pool_generation for s in pool.slices.values())
        current = sorted((s for s in pool.slices.values() if s.pool_generation == top), key=lambda s: s.name)
        expected = max(s.slice_count for s in current)
        known: dict[str, Device] = {}
        owner: dict[str, str] = {}
        duplicate = ""
        for item in current:
            for device in item.devices:
                name = device.key.device
                if name in known:
                    # The scheduler marks such a pool invalid and allocates nothing from it
                    # (k8s.io/dynamic-resource-allocation/structured pools.go): so do we.
                    duplicate = duplicate or (
                        f"generation {top}: device {name!r} is published by slices {owner[name]!r} and {item.name!r}"
                    )
                    continue
                known[name] = device
                owner[name] = item.name
        counters: dict[str, Mapping[str, Fraction]] = {}
        for item in current:
            for name, amounts in item.counter_sets:
                if name in counters:
                    duplicate = duplicate or f"generation {top}: duplicate counter set name {name!r}"
                counters[name] = amounts
        duplicate = duplicate or _missing_counters(known.values(), counters, top)
        pool.known = known
        pool.counters = counters
        pool.usable = len(current) >= expected and not duplicate
        if duplicate:
            pool.unusable_reason = f"invalid, {duplicate}"
        elif not pool.usable:
            pool.unusable_reason = f"incomplete, generation {top}: {len(current)} of {expected} slices published"
        else:
            pool.unusable_reason = ""


def _missing_counters(devices: Iterable[Device], counters: Mapping[str, Mapping[str, Fraction]], top: int) -> str:
    """Why the pool's counters cannot be checked: the scheduler then marks the pool invalid
    (structured pools.go, validateDeviceCounterConsumption), so do we ("" when they can)."""
    for device in devices:
        for consumption in device.consumes_counters:
            found = counters.get(consumption.counter_set)
            if found is None:
                return (f"generation {top}: device {device.key.device!r} consumes counter set "
                        f"{consumption.counter_set!r}, which no slice of the pool publishes")
            for name in consumption.counters:
                if name not in found:
                    return (f"generation {top}: device {device.key.device!r} consumes counter {name!r}, "
                            f"not in counter set {consumption.counter_set!r}")
    return ""


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic collector while building tens of thousands of acyclic objects.

    Each allocation burst otherwise triggers generation scans over everything already
    built: measured, it doubled the load time of a 58,000-device inventory (and half
    the run time of bench/inventory.py's generator, which uses it too).

    Not when the build pauses (`quota.values.work.pauses`: run in slices on `serve`'s event
    loop): other work runs between its slices and its garbage must still be collected;
    there the runner keeps only full collections off (`kube.rebuilds`).
    """
    if pauses() is not None:
        yield
        return
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
