"""Per-device rules: capacity requests, requestPolicy rounding, taints; and which candidate
groups can serve a request (`eligible`; their sums per node are `quota.pricing.counters`').

Neighbours: `quota.pricing.pricer` asks, for a candidate device and a request, whether the
device can serve it and what one allocation of it costs in memory; `quota.pricing.allocated`
what an allocation holds. Semantics follow
TYPES (CapacityRequirements, CapacityRequestPolicy) and the allocator's consumable
capacity code (k8s.io/dynamic-resource-allocation/structured, consumablecapacity.go):
- a capacity request filters like `capacity >= request` and is charged per device;
- on a shared device (`allowMultipleAllocations`) a request is rounded up by the
  policy (validValues: smallest valid value >= request; validRange: raised to min and
  rounded up to min + n*step; above the largest value the device cannot serve it);
- unrequested capacity on a shared device consumes the policy default, or the whole
  capacity without a policy; a device that is not shared is consumed whole.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from fractions import Fraction

from quota.devices.selectors import DeviceGroup
from quota.objects.claimspec import DeviceRequirement, Toleration
from quota.values.model import Capacity, Device, RequestPolicy, Taint, qualify
from quota.values.quantity import ceil_int

__all__ = ["round_request", "consumed", "memory_charge", "nominal_memory_charge", "tolerates_all", "eligible",
           "publishes_memory", "accelerators", "unpriced_accelerators", "memoryless_drivers"]


def round_request(request: Fraction, capacity: Capacity) -> Fraction | None:
    """The amount a shared device sets aside for `request`, or None if it cannot."""
    policy = capacity.policy
    amount = request
    if policy is not None:
        rounded = _by_policy(request, policy)
        if rounded is None:
            return None
        amount = rounded
    return amount if amount <= capacity.value else None


def _by_policy(request: Fraction, policy: RequestPolicy) -> Fraction | None:
    if policy.valid_values:
        return next((v for v in policy.valid_values if v >= request), None)
    rng = policy.valid_range
    if rng is None:
        return request
    amount = max(request, rng.min)
    if rng.step is not None and rng.step > 0:
        amount = rng.min + math.ceil((amount - rng.min) / rng.step) * rng.step
    if rng.max is not None and amount > rng.max:
        return None
    return amount


def consumed(device: Device, requirement: DeviceRequirement, domain: str, ident: str) -> Fraction | None:
    """What one allocation of `device` for `requirement` consumes of one capacity.

    None when the device cannot satisfy the requirement's request for it.
    """
    capacity = device.capacity.get(domain, {}).get(ident)
    requested = _requested(requirement, device.key.driver, domain, ident)
    if capacity is None:
        return None if requested is not None else Fraction(0)
    if not device.allow_multiple_allocations:
        if requested is not None and capacity.value < requested:
            return None
        return capacity.value
    if requested is not None:
        return round_request(requested, capacity)
    if capacity.policy is not None and capacity.policy.default is not None:
        return capacity.policy.default
    return capacity.value


def memory_charge(device: Device, requirement: DeviceRequirement) -> int | None:
    """Bytes of `memory` one allocation costs, or None if the device does not fit.

    Checks every capacity the requirement asks for, not only memory: a device that
    lacks or cannot round a requested capacity is no candidate.
    """
    for name, _ in requirement.capacity_requests:
        domain, ident = qualify(name, device.key.driver)
        if consumed(device, requirement, domain, ident) is None:
            return None
    amount = _memory_consumed(device, requirement)
    return ceil_int(amount) if amount is not None else None


def _memory_consumed(device: Device, requirement: DeviceRequirement) -> Fraction | None:
    """What one allocation consumes of the device's memory, wherever it comes from: the
    published capacity that holds it (`memory`, or the one a memory source names) by
    the capacity rules; an amount per model (`quota.devices.memorysources`) whole; none: 0."""
    name = device.memory_name
    if name is not None:
        return consumed(device, requirement, device.key.driver, name)
    return device.memory


def nominal_memory_charge(device: Device, requirement: DeviceRequirement) -> int:
    """Bytes of `memory` one allocation of `device` for `requirement` would cost, fit or not.

    The no-candidate rule prices a request on devices that cannot serve it now (docs/design.md,
    "The charge of a claim": "the charge this request would have on it"): a shared device costs what the request
    would consume of it, its policy default when it asks for no memory; where the request
    could not be rounded onto the device (above its capacity or policy), the whole device.
    """
    amount = _memory_consumed(device, requirement)
    return ceil_int(amount if amount is not None else device.memory)


def _requested(requirement: DeviceRequirement, driver: str, domain: str, ident: str) -> Fraction | None:
    """The request for one capacity; the largest when it is named with and without prefix.

    `memory` and `<driver>/memory` name the same capacity of that driver's devices.
    Kubernetes 1.37 matches the name exactly as published, 1.38 accepts both and fails
    scheduling when both are given: taking the first would let a tenant pair a tiny
    request with the one the scheduler honours and be charged the tiny one.
    """
    amounts = [amount for name, amount in requirement.capacity_requests if qualify(name, driver) == (domain, ident)]
    return max(amounts, default=None)


def tolerates_all(taints: tuple[Taint, ...], tolerations: tuple[Toleration, ...]) -> bool:
    """True unless a NoSchedule/NoExecute taint is left untolerated (scheduler semantics).

    Taints with effect None are informational and never block allocation
    (TYPES: DeviceTaint effect "None").
    """
    return all(
        taint.effect not in ("NoSchedule", "NoExecute") or any(_tolerates(t, taint) for t in tolerations)
        for taint in taints
    )


def _tolerates(toleration: Toleration, taint: Taint) -> bool:
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.operator == "Exists":
        return not toleration.key or toleration.key == taint.key
    return toleration.key == taint.key and toleration.value == taint.value


# -- over candidate groups ------------------------------------------------------------------------


def eligible(groups: Iterable[DeviceGroup], req: DeviceRequirement) -> list[tuple[int, int, DeviceGroup]]:
    """(per-device memory charge, devices, group) for groups that can serve `req`."""
    out = []
    for group in groups:
        rep = group.representative
        if not tolerates_all(rep.taints, req.tolerations):
            continue
        charge = memory_charge(rep, req)
        if charge is not None:
            out.append((charge, len(group.devices), group))
    return out


def publishes_memory(groups: Iterable[DeviceGroup]) -> bool:
    """Whether any of these devices has a memory (0 included): its `memory` capacity, or
    one a memory source gives it."""
    return any(g.representative.memory_capacity is not None for g in groups)


def accelerators(priced: list[tuple[int, int, DeviceGroup]]) -> list[tuple[int, int, DeviceGroup]]:
    """The priced groups a quota with no scope governs: devices with a memory, and those of
    a known accelerator driver that have none (unpriced, never outside)."""
    return [p for p in priced if p[2].representative.is_accelerator]


def unpriced_accelerators(groups: Iterable[DeviceGroup]) -> bool:
    """Some of these devices are accelerators and none has a memory: a price of 0 memory
    would make them free under a memory limit."""
    found = False
    for group in groups:
        rep = group.representative
        if rep.memory_capacity is not None:
            return False
        found = found or rep.is_accelerator
    return found


def memoryless_drivers(groups: Iterable[DeviceGroup]) -> tuple[str, ...]:
    """The drivers of these devices that have no memory and are no accelerators (an RDMA
    NIC): charged 0 memory where a quota's scope names them."""
    return tuple(sorted({g.representative.driver for g in groups if not g.representative.is_accelerator}))

