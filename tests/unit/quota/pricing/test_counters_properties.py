"""The charge of a request over partitionable devices, against a brute-force allocator.

Small inventories with shared counters (a few nodes, a few devices each, random counter
consumption) and random ExactCount / All requests. The brute force enumerates every
allocation the scheduler could make: every set of devices of one node that serves the
request and fits the node's counters together (ExactCount: `count` of its candidates;
All: all of them). Then, the real `Pricer` on a real `Inventory`:
- never under-reserves: per dimension, the Conservative charge is at least what any
  such allocation charges;
- never charges past the counters: per dimension, at most the largest such allocation
  (so exactly it), or, when no allocation is possible now, at most what one node's
  counters let be allocated together (All) and `count` x the largest candidate
  (ExactCount, which asks for that many). An ExactCount request none of whose
  candidates is in a pool with partitionable devices keeps `count` x the largest;
- Optimistic <= Conservative.
Candidates are chosen without CEL: a class with no selectors, a request's
`capacity.requests.memory` (a device serves it when its memory is at least that).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from quota.devices.inventory import Inventory
from quota.objects.claims import parse_claim, parse_device_class
from quota.pricing.pricer import Pricer
from quota.values.model import Charge

from ...builders import GiB, exactly, make_class, make_claim, make_counter_slice, make_device, make_slice, request

D = "gpu.example.com"
CLASSES = {c.name: c for c in map(parse_device_class, [make_class("any")])}


@dataclass(frozen=True)
class Dev:
    node: str
    name: str
    memory: int  # GiB
    # ((counter set, counter), amount) it consumes
    uses: tuple[tuple[tuple[str, str], int], ...]


@dataclass(frozen=True)
class Fleet:
    devices: tuple[Dev, ...]
    # per node, ((counter set, counter), limit)
    limits: dict[str, dict[tuple[str, str], int]]


@st.composite
def fleets(draw: st.DrawFn) -> Fleet:
    devices: list[Dev] = []
    limits: dict[str, dict[tuple[str, str], int]] = {}
    for n in range(draw(st.integers(1, 3))):
        node = f"node-{n}"
        sets = {f"set-{s}": {c: draw(st.integers(0, 4)) for c in draw(st.sampled_from([("a",), ("a", "b")]))}
                for s in range(draw(st.integers(0, 2)))}
        limits[node] = {(s, c): v for s, counters in sets.items() for c, v in counters.items()}
        for i in range(draw(st.integers(1, 5))):
            uses: list[tuple[tuple[str, str], int]] = []
            for s in draw(st.lists(st.sampled_from(sorted(sets)), unique=True, max_size=2)) if sets else []:
                for c in sets[s]:
                    amount = draw(st.integers(0, 3))
                    if amount or draw(st.booleans()):
                        uses.append(((s, c), amount))
            devices.append(Dev(node, f"d{i}", draw(st.sampled_from([1, 2, 3, 5, 8])), tuple(uses)))
    return Fleet(tuple(devices), limits)


def inventory(fleet: Fleet) -> Inventory:
    inv = Inventory()
    for node, limits in fleet.limits.items():
        devices = []
        for dev in (d for d in fleet.devices if d.node == node):
            raw = make_device(dev.name, memory=f"{dev.memory}Gi", attrs={"kind": "gpu"})
            by_set: dict[str, dict[str, Any]] = {}
            for (s, c), amount in dev.uses:
                by_set.setdefault(s, {})[c] = {"value": str(amount)}
            if by_set:
                raw["consumesCounters"] = [{"counterSet": s, "counters": cs} for s, cs in by_set.items()]
            devices.append(raw)
        sets: dict[str, dict[str, str]] = {}
        for (s, c), v in limits.items():
            sets.setdefault(s, {})[c] = str(v)
        inv.add_or_update_slice(make_slice(f"{node}-devices", devices, driver=D, node=node, count=2 if sets else 1))
        if sets:
            inv.add_or_update_slice(make_counter_slice(f"{node}-counters", sets, driver=D, node=node))
    assert not inv.unusable_pools()
    return inv


def fits(devices: tuple[Dev, ...], limits: dict[tuple[str, str], int]) -> bool:
    used: dict[tuple[str, str], int] = {}
    for dev in devices:
        for key, amount in dev.uses:
            used[key] = used.get(key, 0) + amount
    return all(amount <= limits[key] for key, amount in used.items())


def feasible_sets(fleet: Fleet, minimum: int) -> dict[str, list[tuple[Dev, ...]]]:
    """Per node, every set of its candidates that fits its counters together."""
    out = {}
    for node, limits in fleet.limits.items():
        candidates = [d for d in fleet.devices if d.node == node and d.memory >= minimum]
        out[node] = [s for k in range(len(candidates) + 1) for s in combinations(candidates, k) if fits(s, limits)]
    return out


def charge(devices: tuple[Dev, ...]) -> Charge:
    return Charge(sum(d.memory for d in devices) * GiB, len(devices))


def allocations(fleet: Fleet, minimum: int, count: int | None) -> list[tuple[Dev, ...]]:
    """Every allocation the scheduler could make (count None: All)."""
    out: list[tuple[Dev, ...]] = []
    for node, sets in feasible_sets(fleet, minimum).items():
        candidates = tuple(d for d in fleet.devices if d.node == node and d.memory >= minimum)
        if count is None:
            out.extend(s for s in sets if s and s == candidates)
        else:
            out.extend(s for s in sets if len(s) == count)
    return out


@settings(max_examples=400, deadline=None)
@given(fleets(), st.sampled_from([1, 2, 3, 4, None]), st.sampled_from([0, 2, 4]))
def test_the_charge_covers_every_allocation_and_stays_within_the_counters(
        fleet: Fleet, count: int | None, minimum: int) -> None:
    pricer = Pricer(inventory(fleet), CLASSES)
    capacity = {"memory": f"{minimum}Gi"} if minimum else None
    spec = parse_claim(make_claim("c", request("r", exactly("any", count=count, mode=None if count else "All",
                                                                 capacity=capacity)))).spec
    conservative = pricer.estimate(spec).total
    optimistic = pricer.estimate(spec, mode="optimistic").total
    assert optimistic.memory <= conservative.memory and optimistic.devices <= conservative.devices

    candidates = [d for d in fleet.devices if d.memory >= minimum]
    if not candidates:
        return  # the no-candidate rule: not about counters
    made = allocations(fleet, minimum, count)
    for allocation in made:
        got = charge(allocation)
        assert conservative.memory >= got.memory and conservative.devices >= got.devices, (allocation, conservative)
    # A candidate's pool holds partitionable devices (some device of it consumes counters).
    partitionable = any(d.uses for c in candidates for d in fleet.devices if d.node == c.node)
    if count is not None and not partitionable:
        # No counters involved: `count` x the largest, as ever (at least every allocation, above).
        assert conservative == Charge(count * max(d.memory for d in candidates) * GiB, count)
    elif made:
        assert conservative.memory == max(charge(a).memory for a in made)
        assert conservative.devices == max(charge(a).devices for a in made)
    elif count is None:
        together = [charge(s) for sets in feasible_sets(fleet, minimum).values() for s in sets]
        assert conservative.memory <= max(c.memory for c in together)
        assert conservative.devices <= max(c.devices for c in together)
    else:
        assert conservative == Charge(count * max(d.memory for d in candidates) * GiB, count)
