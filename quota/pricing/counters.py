"""Candidates per node, and what a node's shared counters let be allocated together.

Neighbours: `quota.devices.inventory` keeps each pool's counter sets (`sharedCounters`) and which
pools hold devices that consume them; `quota.devices.selectors` gives the candidates as groups
of (pools, positions) pieces; `quota.pricing.capacity` gives each group's per-device charge;
`quota.pricing.pricer` asks here for the charge of an `All` request and for the most memory
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
- ExactCount with a candidate in a pool of partitionable devices: the most memory any
  `count` candidates that fit together on one node take (usually `count` x the largest:
  whole GPUs on distinct counter sets). When no node can take `count` of them together,
  the request cannot be allocated now and keeps `count` x the largest.

Why it is fast: a node's candidates are read per pool, not per device. A pool's devices
and counters reduce once, when first priced after the pool changed, to a `_Shape` (each
position's consumption, the counters' limits), interned so that identical nodes share
one; a pool's candidates are the positions of the group pieces it is in, the same
tuples for every pool of a piece. What a pool's candidates fit, and the most they take,
is then memoized by (shape, positions, charges): 5,000 identical nodes cost 5,000 dict
lookups and one computation. ExactCount first tries the largest candidates node by node
and stops at the first node holding `count` of them that fit together. The exact search
runs per physical device (the devices linked by the counter sets they consume), bounded
(`SEARCH_STEPS`): past the bound that device counts its largest candidates without
counters, never less than the truth.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import reduce

from quota.devices.columns import PoolIndex
from quota.devices.inventory import Inventory
from quota.devices.selectors import DeviceGroup
from quota.values.model import ZERO, Charge, Device, Mode
from quota.values.work import paced, pause_point

__all__ = ["SEARCH_STEPS", "ScopeSums", "all_mode", "count_memory", "per_scope"]

# Subsets tried per physical device before its search gives up (then: its largest
# candidates, counters aside). An A100's 15 DynamicMIG placements take ~1,000.
SEARCH_STEPS = 50_000

Priced = Sequence[tuple[int, int, DeviceGroup]]
# A device's consumption: (counter index in its pool's shape, amount scaled to an integer).
_Uses = tuple[tuple[int, int], ...]
# A pool's candidates: (positions, per-device charge) per group piece it is in.
_Picks = tuple[tuple[tuple[int, ...], int], ...]


@dataclass(frozen=True, slots=True, eq=False, weakref_slot=True)
class _Shape:
    """What a pool's counters say, by device position; equal pools share one (interned)."""

    uses: tuple[_Uses, ...]
    limits: tuple[int, ...]


_SHAPES: weakref.WeakValueDictionary[tuple[object, ...], _Shape] = weakref.WeakValueDictionary()
# Per pool index (replaced whenever its pool changes): its devices' one scope (None when
# they differ: perDeviceNodeSelection), its shape (None: no device consumes counters), and
# whether the shape was looked for (not without the inventory's counters).
_POOLS: weakref.WeakKeyDictionary[PoolIndex, tuple[str | None, _Shape | None, bool]] = weakref.WeakKeyDictionary()


def _pool(pool: PoolIndex, inventory: Inventory | None) -> tuple[str | None, _Shape | None]:
    found = _POOLS.get(pool)
    if found is not None and (found[2] or inventory is None):
        return found[0], found[1]
    devices = pool.devices
    scopes = {d.scope for d in paced(devices)}
    scope = next(iter(scopes)) if len(scopes) == 1 else None
    shape = None
    if inventory is not None and any(d.consumes_counters for d in devices):
        key = devices[0].key
        sets = inventory.counters((key.driver, key.pool))
        index: dict[tuple[str, str], int] = {}
        raw = [[(index.setdefault((c.counter_set, name), len(index)), amount)
                for c in d.consumes_counters for name, amount in c.counters.items()] for d in paced(devices)]
        # A counter no set publishes makes the pool invalid (`quota.devices.inventory`): never priced.
        limits = [sets.get(s, {}).get(name, Fraction(0)) for s, name in index]
        scale = math.lcm(*{a.denominator for uses in raw for _, a in uses}, *{v.denominator for v in limits})
        # Counters are integers but for odd quantities ("500m"): then scaled to integers.
        content = (tuple(tuple((i, a.numerator if scale == 1 else int(a * scale)) for i, a in uses) for uses in raw),
                   tuple(v.numerator if scale == 1 else int(v * scale) for v in limits))
        shape = _SHAPES.get(content)
        if shape is None:
            shape = _SHAPES[content] = _Shape(*content)
    _POOLS[pool] = (scope, shape, inventory is not None)
    return scope, shape


def _by_scope(priced: Priced, inventory: Inventory | None
              ) -> dict[str, list[tuple[_Shape | None, _Picks]]]:
    """Per node (or pool), its pools' shapes and candidates: one step per pool of a group
    piece, never per device (but for pools whose devices are on several nodes)."""
    picks: dict[PoolIndex, list[tuple[tuple[int, ...], int]]] = {}
    loose: list[tuple[int, Device]] = []
    for charge, _, group in priced:
        parts = group.parts() if isinstance(group, DeviceGroup) else ()
        if not parts:
            loose.extend((charge, d) for d in paced(group.devices))
        for pools, positions in parts:
            for pool in paced(pools):
                picks.setdefault(pool, []).append((positions, charge))
    out: dict[str, list[tuple[_Shape | None, _Picks]]] = {}
    for pool, chosen in paced(list(picks.items())):
        scope, shape = _pool(pool, inventory)
        if scope is not None:
            out.setdefault(scope, []).append((shape, tuple(chosen)))
            continue
        per: dict[str, list[tuple[tuple[int, ...], int]]] = {}
        for positions, charge in chosen:
            for p in positions:
                per.setdefault(pool.devices[p].scope, []).append(((p,), charge))
        for at, items in per.items():
            out.setdefault(at, []).append((shape, tuple(items)))
    for charge, device in loose:  # devices not from a match (callers' own sequences)
        out.setdefault(device.scope, []).append((None, (((0,), charge),)))
    return out


# -- All ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScopeSums:
    """The candidates' charges summed per node (or pool), and the scopes whose candidates
    do not fit their counters together."""

    charges: dict[str, Charge]
    crowded: frozenset[str] = frozenset()


def per_scope(priced: Priced, inventory: Inventory | None = None) -> ScopeSums:
    """Sums per node (or pool, for devices bound to none); with `inventory`, which of them
    exceed their counters. A step per pool (module doc), pausing (`quota.values.work.paced`)."""
    return _sums(_by_scope(priced, inventory))


def _sums(scopes: dict[str, list[tuple[_Shape | None, _Picks]]]) -> ScopeSums:
    charges: dict[str, Charge] = {}
    crowded = set()
    for scope, pools in scopes.items():
        memory = devices = 0
        for shape, picks in pools:
            for positions, charge in picks:
                memory += charge * len(positions)
                devices += len(positions)
            if shape is not None and not _fits(shape, picks):
                crowded.add(scope)
        charges[scope] = Charge(memory, devices)
    return ScopeSums(charges, frozenset(crowded))


@functools.lru_cache(maxsize=4096)
def _fits(shape: _Shape, picks: _Picks) -> bool:
    return _within(tuple(shape.uses[p] for positions, _ in picks for p in positions), shape.limits)


def all_mode(priced: Priced, inventory: Inventory | None = None,
             mode: Mode = "conservative") -> tuple[Charge, tuple[str, ...]]:
    """allocationMode All (module doc), and a warning when no node can host it now."""
    scopes = _by_scope(priced, inventory)
    sums = _sums(scopes)
    fitting = [charge for scope, charge in sums.charges.items() if scope not in sums.crowded]
    if fitting:
        return reduce(Charge.max if mode == "conservative" else Charge.min, fitting), ()
    if not sums.charges:
        return ZERO, ()
    most = ZERO
    for pools in scopes.values():
        most = most.max(reduce(Charge.__add__, (_most(shape, picks) for shape, picks in pools), ZERO))
    largest = max(c.devices for c in sums.charges.values())
    return most, (
        f"no node can allocate all the devices this request matches together ({largest} on the largest): "
        "they draw on the same shared counters (partitions of one physical device), so the scheduler "
        f"cannot allocate it now; charged the most one node's counters let be allocated together: "
        f"memory={most.memory}, devices={most.devices}",
    )


@functools.lru_cache(maxsize=4096)
def _most(shape: _Shape | None, picks: _Picks) -> Charge:
    """Per dimension, the most a set of one pool's candidates that fits its counters takes."""
    free, parts = _split(shape, picks)
    memory, devices = sum(free), len(free)
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
    best: int | None = None
    scopes = _by_scope(priced, inventory)
    # The scopes whose `count` largest could beat the best so far, largest first.
    bounds = sorted(((bound, scope) for scope, pools in scopes.items()
                     if (bound := _top_sum(pools, count)) is not None), reverse=True)
    for bound, scope in bounds:
        if best is not None and bound <= best:
            break
        found = _scope_best(tuple(scopes[scope]), count)
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
        for indexes, _ in group.parts():
            for index in indexes:
                key = index.devices[0].key
                if (key.driver, key.pool) in pools:
                    return True
    return False


def _largest_fit(priced: Priced, top: int, count: int, inventory: Inventory) -> bool:
    """Whether one group piece of one pool holds `count` devices of the largest charge that
    fit together, taken greedily (stops at the first such pool; a miss proves nothing: the
    exact search follows)."""
    for charge, _, group in priced:
        if charge != top:
            continue
        for pools, positions in group.parts():
            if len(positions) < count:
                continue
            for pool in paced(pools):
                scope, shape = _pool(pool, inventory)
                if scope is not None and _greedy(shape, positions) >= count:
                    return True
    return False


@functools.lru_cache(maxsize=4096)
def _greedy(shape: _Shape | None, positions: tuple[int, ...]) -> int:
    """How many of these positions fit together, taken in order while they fit."""
    if shape is None:
        return len(positions)
    left = list(shape.limits)
    taken = 0
    for p in positions:
        need = shape.uses[p]
        if all(left[k] >= a for k, a in need):
            for k, a in need:
                left[k] -= a
            taken += 1
    return taken


def _top_sum(pools: list[tuple[_Shape | None, _Picks]], count: int) -> int | None:
    """The sum of the scope's `count` largest candidate charges (None: fewer candidates)."""
    charges = sorted(((charge, len(positions)) for _, picks in pools for positions, charge in picks), reverse=True)
    total, left = 0, count
    for charge, n in charges:
        take = min(n, left)
        total += charge * take
        left -= take
        if not left:
            return total
    return None


@functools.lru_cache(maxsize=4096)
def _scope_best(pools: tuple[tuple[_Shape | None, _Picks], ...], count: int) -> int | None:
    """The most memory `count` of one node's candidates that fit together take (None: no such set)."""
    best: list[int | None] = [0] + [None] * count
    for shape, picks in pools:
        free, parts = _split(shape, picks)
        tables = [tuple(_prefix(sorted(free, reverse=True), count))] + [_table(p, min(count, len(p.charges)))
                                                                         for p in parts]
        for table in tables:
            best = _merge(best, table, count)
    return best[count]


def _prefix(charges: list[int], upto: int) -> list[int]:
    out = [0]
    for charge in charges[:upto]:
        out.append(out[-1] + charge)
    return out


def _merge(best: list[int | None], table: Sequence[int | None], count: int) -> list[int | None]:
    """best[j] over the pieces so far and `table`'s: the most memory j devices take."""
    merged = list(best)
    for j, have in enumerate(best):
        if have is None:
            continue
        for i in range(1, min(len(table), count - j + 1)):
            adds = table[i]
            if adds is not None:
                now = merged[j + i]
                if now is None or have + adds > now:
                    merged[j + i] = have + adds
    return merged


# -- the exact search, per physical device ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Part:
    """Candidates linked by the counters they consume: charges largest first, each one's
    consumption as (counter index, amount) pairs, and each counter's limit."""

    charges: tuple[int, ...]
    uses: tuple[_Uses, ...]
    limits: tuple[int, ...]


def _split(shape: _Shape | None, picks: _Picks) -> tuple[list[int], list[_Part]]:
    """A pool's candidates: the charges of those that consume no counter, and `_Part`s."""
    items = [(charge, p) for positions, charge in picks for p in positions]
    if shape is None:
        return [c for c, _ in items], []
    free = [c for c, p in items if not shape.uses[p]]
    bound = [(c, shape.uses[p]) for c, p in items if shape.uses[p]]
    parent = list(range(len(shape.limits)))

    def root(k: int) -> int:
        while parent[k] != k:
            k = parent[k]
        return k

    for _, uses in bound:
        for k, _ in uses[1:]:
            parent[root(k)] = root(uses[0][0])
    groups: dict[int, list[tuple[int, _Uses]]] = {}
    for charge, uses in bound:
        groups.setdefault(root(uses[0][0]), []).append((charge, uses))
    parts = []
    for members in groups.values():
        members.sort(key=lambda m: -m[0])  # stable: equal charges keep publish order
        local: dict[int, int] = {}
        uses_local = tuple(tuple((local.setdefault(k, len(local)), a) for k, a in uses) for _, uses in members)
        parts.append(_Part(tuple(c for c, _ in members), uses_local, tuple(shape.limits[k] for k in local)))
    return free, parts


@functools.lru_cache(maxsize=1024)
def _table(part: _Part, upto: int) -> tuple[int | None, ...]:
    """best[j], j = 0..upto: the most memory j devices of `part` that fit together take
    (None: no j of them fit). Exact within `SEARCH_STEPS`, else counters aside."""
    charges, uses, limits = part.charges, part.uses, part.limits
    n = len(charges)
    prefix = _prefix(list(charges), n)
    if _within(uses, limits):
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
        return tuple(prefix[: upto + 1])
    return tuple(best)


def _within(uses: tuple[_Uses, ...], limits: tuple[int, ...]) -> bool:
    total = [0] * len(limits)
    for need in uses:
        for k, a in need:
            total[k] += a
    return all(t <= v for t, v in zip(total, limits))
