"""Partitionable devices: our charge against what the real kube-scheduler allocates.

One fake node publishes what dra-example-driver publishes with `--gpu-partitions 4` on 2
GPUs (tests/unit/drivers.py): a counter set per GPU, 4 partitions and the whole GPU drawing
on it. The real DynamicResources plugin then allocates, or refuses, claims over them:
- `All` over the partitions fits the counters: allocated whole, at exactly our charge;
- `count: 3` gets 3 devices that fit together: within our optimistic and conservative
  estimates, the conservative one being the most any 3 of them can take (a GPU and two
  partitions of the other), not 3 x the largest;
- `All` over every device cannot fit (a GPU and its partitions exclude each other): the
  scheduler refuses it ("cannot allocate all claims"), and we charge no more than the
  node's counters allow together (its 160Gi, 8 partitions), not the 320Gi and 10 devices
  it publishes.
And `All` over two nodes, 2 whole GPUs on one and 4 partitions on the other: the scheduler
may choose either, and the one it gets (pinned here to the partitioned node) charges no
more than our estimate in either dimension (before, the node with the most memory set both:
2 devices, under the 4 allocated).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from quota.devices.inventory import Inventory
from quota.objects.claims import parse_claim, parse_device_class
from quota.objects.claimspec import parse_claim_spec
from quota.pricing.pricer import Pricer
from quota.values.model import Charge
from tests.unit.drivers import EXAMPLE, example_partitionable

from .driver import (
    FLEET_LABEL, RESOURCE_V1, Gpu, GpuFleet, claim_spec, create_claim_template, create_node, create_pod, exact_request,
    free_pod, wait_pod_allocated,
)
from .kube import Kube, poll

pytestmark = pytest.mark.e2e

Gi = 2**30
PARTITIONS_ONLY = f'!has(device.attributes["{EXAMPLE}"].full)'


async def partitioned_node(kube: Kube, fleet: GpuFleet) -> tuple[Pricer, str]:
    """The node, its slices, a DeviceClass for the driver; our pricer over them, read back."""
    node = f"{fleet.prefix}-node"
    await create_node(kube, node, labels={FLEET_LABEL: fleet.prefix})
    fleet.nodes.append(node)
    inventory = Inventory()
    for obj in example_partitionable(node, gpus=2):
        created = await kube.create(RESOURCE_V1, "resourceslices", obj)
        fleet.slices.append(created["metadata"]["name"])
        inventory.add_or_update_slice(await kube.get(RESOURCE_V1, "resourceslices", created["metadata"]["name"]))
    cls = f"{fleet.prefix}-example"
    await kube.create(RESOURCE_V1, "deviceclasses", {"kind": "DeviceClass", "metadata": {"name": cls}, "spec": {
        "selectors": [{"cel": {"expression": f'device.driver == "{EXAMPLE}"'}}]}})
    parsed = parse_device_class(await kube.get(RESOURCE_V1, "deviceclasses", cls))
    return Pricer(inventory, {parsed.name: parsed}), cls


async def scheduling_failure(kube: Kube, namespace: str, pod: str, text: str) -> str:
    async def found() -> str | None:
        events = await kube.list("v1", "events", namespace=namespace,
                                 field_selector=f"involvedObject.name={pod},reason=FailedScheduling")
        return next((e["message"] for e in events if text in e["message"]), None)

    message: str = await poll(found, timeout=90, what=f"FailedScheduling of pod {pod} saying {text!r}")
    return message


CASES: list[tuple[str, Callable[[str], dict[str, Any]], tuple[int, int] | None]] = [
    # (name, request(class), exact charge (GiB, devices) when the scheduler allocates; None: it cannot)
    ("partitions-all", lambda c: exact_request("gpu", c, allocation_mode="All", selectors=[PARTITIONS_ONLY]), (160, 8)),
    ("count-3", lambda c: exact_request("gpu", c, count=3), None),
    ("everything-all", lambda c: exact_request("gpu", c, allocation_mode="All"), None),
]


@pytest.mark.parametrize(("case", "request_of", "expected"), CASES, ids=[c[0] for c in CASES])
async def test_partitions_priced_within_what_the_scheduler_can_allocate(
    kube: Kube,
    make_fleet: Callable[..., Awaitable[GpuFleet]],
    namespace: str,
    case: str,
    request_of: Callable[[str], dict[str, Any]],
    expected: tuple[int, int] | None,
) -> None:
    fleet = await make_fleet("parts")
    pricer, cls = await partitioned_node(kube, fleet)
    try:
        spec = claim_spec(request_of(cls))
        ours = parse_claim_spec(spec)
        conservative, optimistic = pricer.estimate(ours), pricer.estimate(ours, mode="optimistic")
        assert conservative.errors == optimistic.errors == ()
        await create_claim_template(kube, namespace, case, spec)
        await create_pod(kube, namespace, case, template=case, node_selector=fleet.node_selector)

        if case == "everything-all":
            await scheduling_failure(kube, namespace, case, "cannot allocate all claims")
            assert conservative.total == Charge(160 * Gi, 8), conservative
            assert any("no node can allocate all the devices" in w for w in conservative.warnings)
            return

        _, claim = await wait_pod_allocated(kube, namespace, case, timeout=90)
        exact = pricer.exact(parse_claim(claim)).total
        assert optimistic.total.memory <= exact.memory <= conservative.total.memory
        assert optimistic.total.devices <= exact.devices <= conservative.total.devices
        if expected is not None:
            assert exact == conservative.total == Charge(expected[0] * Gi, expected[1])
        else:
            assert conservative.total == Charge((80 + 2 * 20) * Gi, 3)
        await free_pod(kube, namespace, case)
    finally:
        await kube.delete(RESOURCE_V1, "deviceclasses", cls)


async def test_all_is_charged_each_dimension_from_the_node_with_the_most(
    kube: Kube, make_fleet: Callable[..., Awaitable[GpuFleet]], namespace: str,
) -> None:
    fleet = await make_fleet("all-dims")
    await fleet.add_node("whole", [Gpu("AMD Instinct MI300X", "192Gi")] * 2)
    cpx = await fleet.add_node("cpx", [Gpu("AMD Instinct MI300X", "24Gi")] * 4)
    inventory = Inventory()
    for name in fleet.slices:
        inventory.add_or_update_slice(await kube.get(RESOURCE_V1, "resourceslices", name))
    parsed = parse_device_class(await kube.get(RESOURCE_V1, "deviceclasses", fleet.device_class))
    pricer = Pricer(inventory, {parsed.name: parsed})
    spec = claim_spec(exact_request("gpu", fleet.device_class, allocation_mode="All"))
    conservative = pricer.estimate(parse_claim_spec(spec)).total
    assert conservative == Charge(2 * 192 * Gi, 4)

    await create_claim_template(kube, namespace, "all", spec)
    await create_pod(kube, namespace, "all", template="all", node_selector={"kubernetes.io/hostname": cpx})
    _, claim = await wait_pod_allocated(kube, namespace, "all", timeout=90)
    exact = pricer.exact(parse_claim(claim)).total
    assert exact == Charge(4 * 24 * Gi, 4)
    assert exact.memory <= conservative.memory and exact.devices <= conservative.devices
    await free_pod(kube, namespace, "all")
