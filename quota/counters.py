"""Partitionable devices: what a node's shared counters let be allocated together.

Neighbours: `quota.inventory` keeps each pool's counter sets (`sharedCounters`) and which
pools hold devices that consume them; `quota.capacity` gives each candidate's charge;
`quota.pricing` asks here for the charge of an `All` request and for the most memory
`count` devices can take together.

The allocator's rule (k8s.io/dynamic-resource-allocation/structured,
checkAvailableCounters): devices of one pool can be allocated together when, for every
counter of every counter set, what they consume adds up to at most the counter's value.
An `All` request gets every matching device of the node it is allocated on; when they do
not fit together the allocation fails on that node ("If we couldn't get all of them,
then there is no solution"), so such a node cannot host it at all.

The charges (docs/charging.md, "How a claim is charged"):
- `All`: per dimension, over the nodes (or pools, for devices bound to none) whose
  candidates fit together, the largest sum (Conservative) or the smallest (Optimistic).
  When no node's candidates fit together the request cannot be allocated now; it is
  charged, per dimension, the most one node's counters let be allocated together.
- ExactCount: `count` devices at the largest per-device charge, unless no node can take
  `count` of the largest together: then the most memory any `count` devices that fit
  together on one node take. When no node can take `count` of them together, the request
  cannot be allocated now and keeps `count` x the largest.

Cost: nothing at all while no pool publishes counters. Otherwise `All` reads every
candidate (as it always did) plus what each consumes; ExactCount first tries the
largest devices node by node and stops at the first node holding `count` of them that fit
together (the usual case: whole GPUs on distinct counter sets), and reads every candidate
only when none does. The exact search runs per physical device (the devices linked by
the counter sets they consume), its result memoized by the device's shape, and is bounded
(`SEARCH_STEPS`): past the bound that device counts its largest candidates without
counters, never less than the truth.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import reduce

from quota.inventory import Inventory
from quota.model import ZERO, Charge, Device, Mode
from quota.selectors import DeviceGroup
from quota.work import paced, pause_point

__all__ = ["SEARCH_STEPS", "ScopeSums", "all_mode", "count_memory", "per_scope"]

# Subsets tried per physical device before its search gives up (then: its largest
# candidates, counters aside). NVIDIA DynamicMIG's ~26 placements per GPU take ~5,000.
SEARCH_STEPS = 50_000

Priced = Sequence[tuple[int, int, DeviceGroup]]
_CounterSet = tuple[str, str, str]  # (driver, pool, counter set)


def _limits(inventory: Inventory, key: _CounterSet) -> dict[str, Fraction]:
    return dict(inventory.counters((key[0], key[1])).get(key[2], {}))


# -- All ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScopeSums:
    """The candidates' charges summed per node (or pool), and the scopes whose candidates
    do not fit their counters together."""

    charges: dict[str, Charge]
    crowded: frozenset[str] = frozenset()


def per_scope(priced: Priced, inventory: Inventory | None = None) -> ScopeSums:
    """Sums per node (or pool, for devices bound to none); with `inventory`, which of them
    exceed their counters.

    Reads every candidate: a class's bound over 58,000 devices (`Pricer.upper_bound`,
    once per class) took 68 ms in one piece (bench/stalls.py); now plain sums, pausing
    (`quota.work.paced`)."""
    memory: dict[str, int] = {}
    devices: dict[str, int] = {}
    counted = inventory is not None and bool(inventory.counter_pools())
    used: dict[str, dict[tuple[_CounterSet, str], Fraction]] = {}
    for charge, device in paced((charge, device) for charge, _, group in priced for device in group.devices):
        scope = device.scope
        memory[scope] = memory.get(scope, 0) + charge
        devices[scope] = devices.get(scope, 0) + 1
        if counted and device.consumes_counters:
            into = used.setdefault(scope, {})
            for key, amount in _uses(device):
                into[key] = into.get(key, 0) + amount
    crowded: frozenset[str] = frozenset()
    if used and inventory is not None:
        limits: dict[_CounterSet, dict[str, Fraction]] = {}
        crowded = frozenset(
            scope for scope, amounts in used.items()
            if any(amount > _limit(limits, inventory, key) for key, amount in amounts.items()))
    return ScopeSums({scope: Charge(total, devices[scope]) for scope, total in memory.items()}, crowded)


def _limit(cache: dict[_CounterSet, dict[str, Fraction]], inventory: Inventory,
           key: tuple[_CounterSet, str]) -> Fraction:
    found = cache.get(key[0])
    if found is None:
        found = cache[key[0]] = _limits(inventory, key[0])
    # A counter no set publishes makes the pool invalid (`quota.inventory`): never a candidate.
    return found.get(key[1], Fraction(0))


def _uses(device: Device) -> Iterable[tuple[tuple[_CounterSet, str], Fraction]]:
    driver, pool = device.key.driver, device.key.pool
    for consumption in device.consumes_counters:
        for name, amount in consumption.counters.items():
            yield ((driver, pool, consumption.counter_set), name), amount


def all_mode(priced: Priced, inventory: Inventory | None = None,
             mode: Mode = "conservative") -> tuple[Charge, tuple[str, ...]]:
    """allocationMode All (module doc), and a warning when no node can host it now."""
    sums = per_scope(priced, inventory)
    fitting = [charge for scope, charge in sums.charges.items() if scope not in sums.crowded]
    if fitting:
        return reduce(Charge.max if mode == "conservative" else Charge.min, fitting), ()
    if not sums.charges or inventory is None:
        return ZERO, ()
    by_scope: dict[str, list[tuple[int, Device]]] = {}
    for charge, device in paced((charge, device) for charge, _, group in priced for device in group.devices):
        by_scope.setdefault(device.scope, []).append((charge, device))
    most = reduce(Charge.max, (_most_together(items, inventory) for items in by_scope.values()), ZERO)
    largest = max(c.devices for c in sums.charges.values())
    return most, (
        f"no node can allocate all the devices this request matches together ({largest} on the largest): "
        "they draw on the same shared counters (partitions of one physical device), so the scheduler "
        f"cannot allocate it now; charged the most one node's counters let be allocated together: "
        f"memory={most.memory}, devices={most.devices}",
    )


def _most_together(items: list[tuple[int, Device]], inventory: Inventory) -> Charge:
    """Per dimension, the most a set of these devices (one node's) that fits its counters takes."""
    free, parts = _components(items, inventory)
    memory, devices = sum(c for c, _ in free), len(free)
    for part in parts:
        table = _table(part, len(part.charges))
        memory += max(m for m in table if m is not None)
        devices += max(j for j, m in enumerate(table) if m is not None)
    return Charge(memory, devices)


# -- ExactCount --------------------------------------------------------------------------------


def count_memory(priced: Priced, count: int, inventory: Inventory) -> tuple[int, tuple[str, ...]]:
    """The memory `count` devices of these candidates can take together on one node
    (Conservative ExactCount, module doc), and a warning when no node can take `count`."""
    top = max((c for c, _, _ in priced), default=0)
    if count <= 0 or not _partitionable(priced, inventory) or any(
            g.representative.allow_multiple_allocations for _, _, g in priced):
        # A shared device may serve several of one request's devices: counters aside, as before.
        return top * count, ()
    if _largest_fit(priced, top, count, inventory):
        return top * count, ()
    by_scope: dict[str, list[tuple[int, Device]]] = {}
    for charge, device in paced((charge, device) for charge, _, group in priced for device in group.devices):
        by_scope.setdefault(device.scope, []).append((charge, device))
    best: int | None = None
    # The scopes whose `count` largest could beat the best so far, largest first.
    bounds = sorted(((sum(sorted((c for c, _ in items), reverse=True)[:count]), scope)
                     for scope, items in by_scope.items() if len(items) >= count), reverse=True)
    for bound, scope in bounds:
        if best is not None and bound <= best:
            break
        found = _best_of_count(by_scope[scope], count, inventory)
        if found is not None and (best is None or found > best):
            best = found
    if best is None:
        return top * count, (f"no node can allocate {count} of the matching devices together within their "
                             "shared counters now",)
    return best, ()


def _partitionable(priced: Priced, inventory: Inventory) -> bool:
    """Whether a candidate is in a pool with devices that consume counters: one lookup per
    pool of the candidate groups, no device read (nothing at all without such pools)."""
    pools = inventory.counter_pools()
    if not pools:
        return False
    for _, _, group in priced:
        for index in group.pools():
            key = index.devices[0].key if index.devices else None
            if key is not None and (key.driver, key.pool) in pools:
                return True
    return False


def _largest_fit(priced: Priced, top: int, count: int, inventory: Inventory) -> bool:
    """Whether some node holds `count` devices of the largest charge that fit together,
    found greedily node by node (stops at the first such node)."""
    taken: dict[str, int] = {}
    used: dict[str, dict[tuple[_CounterSet, str], Fraction]] = {}
    limits: dict[_CounterSet, dict[str, Fraction]] = {}
    for device in paced(d for charge, _, group in priced if charge == top for d in group.devices):
        scope = device.scope
        if device.consumes_counters:
            into = used.setdefault(scope, {})
            uses = list(_uses(device))
            if any(into.get(key, 0) + amount > _limit(limits, inventory, key) for key, amount in uses):
                continue
            for key, amount in uses:
                into[key] = into.get(key, 0) + amount
        taken[scope] = taken.get(scope, 0) + 1
        if taken[scope] >= count:
            return True
    return False


def _best_of_count(items: list[tuple[int, Device]], count: int, inventory: Inventory) -> int | None:
    """The most memory `count` of one node's devices that fit together take (None: no such set)."""
    free, parts = _components(items, inventory)
    frees = sorted((c for c, _ in free), reverse=True)[:count]
    # best[j]: the most memory j devices take, over the pieces combined so far.
    best: list[int | None] = [None] * (count + 1)
    total = 0
    best[0] = 0
    for j, charge in enumerate(frees, 1):
        total += charge
        best[j] = total
    for part in parts:
        table = _table(part, min(count, len(part.charges)))
        merged = list(best)
        for j, have in enumerate(best):
            if have is None:
                continue
            for i, adds in enumerate(table[1:], 1):
                if adds is not None and j + i <= count:
                    now = merged[j + i]
                    if now is None or have + adds > now:
                        merged[j + i] = have + adds
        best = merged
    return best[count]


# -- the exact search, per physical device ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Part:
    """Devices linked by the counter sets they consume, in a form that compares by shape:
    charges largest first, each device's consumption as (counter index, amount) pairs,
    counter amounts scaled to integers, and each counter's limit."""

    charges: tuple[int, ...]
    uses: tuple[tuple[tuple[int, int], ...], ...]
    limits: tuple[int, ...]


def _components(items: list[tuple[int, Device]], inventory: Inventory
                ) -> tuple[list[tuple[int, Device]], list[_Part]]:
    """Devices that consume no counter, and the others split into `_Part`s."""
    free = [(c, d) for c, d in items if not d.consumes_counters]
    bound = [(c, d) for c, d in items if d.consumes_counters]
    parent: dict[_CounterSet, _CounterSet] = {}

    def root(key: _CounterSet) -> _CounterSet:
        while parent.setdefault(key, key) != key:
            key = parent[key]
        return key

    for _, device in bound:
        sets = [(device.key.driver, device.key.pool, c.counter_set) for c in device.consumes_counters]
        for other in sets[1:]:
            parent[root(other)] = root(sets[0])
    groups: dict[_CounterSet, list[tuple[int, Device]]] = {}
    for charge, device in bound:
        first = device.consumes_counters[0].counter_set
        groups.setdefault(root((device.key.driver, device.key.pool, first)), []).append((charge, device))
    return free, [_part(members, inventory) for members in groups.values()]


def _part(members: list[tuple[int, Device]], inventory: Inventory) -> _Part:
    members = sorted(members, key=lambda m: -m[0])  # stable: equal charges keep publish order
    index: dict[tuple[_CounterSet, str], int] = {}
    raw: list[list[tuple[int, Fraction]]] = []
    for _, device in members:
        raw.append([(index.setdefault(key, len(index)), amount) for key, amount in _uses(device)])
    limits_cache: dict[_CounterSet, dict[str, Fraction]] = {}
    limits = [_limit(limits_cache, inventory, key) for key in index]
    scale = math.lcm(*(a.denominator for uses in raw for _, a in uses), *(v.denominator for v in limits))
    return _Part(tuple(c for c, _ in members),
                 tuple(tuple((i, int(a * scale)) for i, a in uses) for uses in raw),
                 tuple(int(v * scale) for v in limits))


@functools.lru_cache(maxsize=1024)
def _table(part: _Part, upto: int) -> tuple[int | None, ...]:
    """best[j], j = 0..upto: the most memory j devices of `part` that fit together take
    (None: no j of them fit). Exact within `SEARCH_STEPS`, else counters aside."""
    charges, uses, limits = part.charges, part.uses, part.limits
    n = len(charges)
    prefix = [0]
    for c in charges:
        prefix.append(prefix[-1] + c)
    if _fits_all(uses, limits):
        return tuple(prefix[: upto + 1])
    best: list[int | None] = [None] * (upto + 1)
    left = list(limits)
    steps = 0

    def visit(start: int, chosen: int, memory: int) -> bool:
        nonlocal steps
        known = best[chosen]
        if known is None or memory > known:
            best[chosen] = memory
        if chosen == upto:
            return True
        # Nothing below can beat what is known for any size: prune.
        if all((known := best[chosen + r]) is not None and memory + prefix[min(start + r, n)] - prefix[start] <= known
               for r in range(1, upto - chosen + 1)):
            return True
        for i in range(start, n):
            steps += 1
            if steps > SEARCH_STEPS:
                return False
            if not steps % 1024:
                pause_point()
            need = uses[i]
            if all(left[k] >= a for k, a in need):
                for k, a in need:
                    left[k] -= a
                done = visit(i + 1, chosen + 1, memory + charges[i])
                for k, a in need:
                    left[k] += a
                if not done:
                    return False
        return True

    if not visit(0, 0, 0):
        return tuple(prefix[j] if j <= n else None for j in range(upto + 1))
    return tuple(best)


def _fits_all(uses: tuple[tuple[tuple[int, int], ...], ...], limits: tuple[int, ...]) -> bool:
    total = [0] * len(limits)
    for need in uses:
        for k, a in need:
            total[k] += a
    return all(t <= v for t, v in zip(total, limits))
