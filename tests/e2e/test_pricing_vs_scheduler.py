"""Our pricing and CEL matching against what the real kube-scheduler allocates.

For claims with selectors, firstAvailable and allocationMode All, the scheduler's
allocation (status.allocation, written by the real DynamicResources plugin) must pick
only devices our matcher calls candidates, and its exact charge must lie between our
optimistic and conservative estimates: the estimate never under-charges what the
scheduler can actually give the claim.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from quota.devices.inventory import Inventory
from quota.objects.claims import parse_claim, parse_device_class
from quota.objects.claimspec import parse_claim_spec
from quota.pricing.pricer import Pricer
from quota.values.model import Charge, DeviceClassName, DeviceKey

from .driver import (
    RESOURCE_V1, Gpu, GpuFleet, claim_spec, create_claim_template, create_pod, exact_request, free_pod,
    wait_pod_allocated,
)
from .kube import Kube

pytestmark = pytest.mark.e2e

Gi = 2**30
D = "gpu.nvidia.com"
BIG, SMALL = "NVIDIA A100-SXM4-80GB", "NVIDIA A100-SXM4-40GB"


async def pricer_for(kube: Kube, fleet: GpuFleet) -> Pricer:
    """Our view of the fleet, read back from the API server (as the controller will)."""
    inventory = Inventory()
    for name in fleet.slices:
        inventory.add_or_update_slice(await kube.get(RESOURCE_V1, "resourceslices", name))
    cls = parse_device_class(await kube.get(RESOURCE_V1, "deviceclasses", fleet.device_class))
    return Pricer(inventory, {cls.name: cls})


CASES: list[tuple[str, Callable[[str], list[dict[str, Any]]], tuple[int, int] | None]] = [
    # (name, requests(class) -> spec.devices.requests, exact charge (memory GiB, devices) if determined)
    ("any-one", lambda c: [exact_request("gpu", c)], None),
    ("two-small", lambda c: [exact_request("gpu", c, count=2, selectors=[f'device.attributes["{D}"].productName == "{SMALL}"'])], (80, 2)),
    ("by-memory", lambda c: [exact_request("gpu", c, selectors=[f'device.capacity["{D}"].memory.compareTo(quantity("50Gi")) >= 0'])], (80, 1)),
    ("all-big", lambda c: [exact_request("gpu", c, allocation_mode="All", selectors=[f'device.attributes["{D}"].productName == "{BIG}"'])], (160, 2)),
    ("first-available", lambda c: [{"name": "gpu", "firstAvailable": [
        {"name": "missing", "deviceClassName": c, "selectors": [{"cel": {"expression": f'device.attributes["{D}"].productName == "H999"'}}]},
        {"name": "small", "deviceClassName": c, "selectors": [{"cel": {"expression": f'device.attributes["{D}"].productName == "{SMALL}"'}}]},
    ]}], (40, 1)),
]


@pytest.mark.parametrize(("case", "requests", "expected"), CASES, ids=[c[0] for c in CASES])
async def test_scheduler_allocation_within_our_estimates(
    kube: Kube,
    make_fleet: Callable[..., Awaitable[GpuFleet]],
    namespace: str,
    case: str,
    requests: Callable[[str], list[dict[str, Any]]],
    expected: tuple[int, int] | None,
) -> None:
    fleet = await make_fleet("price")
    await fleet.add_node("big", [Gpu(BIG, "80Gi"), Gpu(BIG, "80Gi")])
    await fleet.add_node("small", [Gpu(SMALL, "40Gi"), Gpu(SMALL, "40Gi")])
    spec = claim_spec(*requests(fleet.device_class))
    pricer = await pricer_for(kube, fleet)
    ours = parse_claim_spec(spec)
    conservative, optimistic = pricer.estimate(ours), pricer.estimate(ours, mode="optimistic")
    assert conservative.errors == optimistic.errors == ()

    await create_claim_template(kube, namespace, case, spec)
    await create_pod(kube, namespace, case, template=case, node_selector=fleet.node_selector)
    _, claim = await wait_pod_allocated(kube, namespace, case, timeout=90)
    exact = pricer.exact(parse_claim(claim))

    # Every device the scheduler picked is one our matcher calls a candidate.
    cls = pricer.classes[DeviceClassName(fleet.device_class)]
    allowed: set[DeviceKey] = set()
    for request in ours.requests:
        for alt in request.alternatives:
            allowed |= {d.key for d in pricer.matcher.match((cls.selectors, alt.selectors)).devices()}
    picked = {DeviceKey(r["driver"], r["pool"], r["device"]) for r in claim["status"]["allocation"]["devices"]["results"]}
    assert picked and picked <= allowed, (picked, allowed)

    assert optimistic.total.memory <= exact.total.memory <= conservative.total.memory
    assert optimistic.total.devices <= exact.total.devices <= conservative.total.devices
    if expected is not None:
        assert exact.total == Charge(expected[0] * Gi, expected[1])
    await free_pod(kube, namespace, case)
