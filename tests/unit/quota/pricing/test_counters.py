"""`All` and partitionable devices priced over what real drivers publish (quota.pricing.counters).

The slices are `tests/unit/drivers.py`'s: dra-example-driver with `--gpu-partitions`,
the AMD driver's MI300X in SPX and CPX, NVIDIA DynamicMIG on A100-80GB (sources there).
"""

from __future__ import annotations

import pytest

from quota.devices.inventory import Inventory
from quota.objects.claims import parse_claim, parse_device_class
from quota.pricing.pricer import Pricer
from quota.values.model import Charge, DeviceClassName, Mode

from ...builders import GiB, MiB, exactly, make_class, make_claim, make_slice, request
from ...drivers import AMD, EXAMPLE, NVIDIA, Obj, amd_mi300x, example_partitionable, nvidia_dynamic_mig


def publish(inv: Inventory, *node_slices: list[Obj]) -> Inventory:
    for slices in node_slices:
        for obj in slices:
            inv.add_or_update_slice(obj)
    return inv


CLASSES = {c.name: c for c in map(parse_device_class, [
    make_class(EXAMPLE, f"device.driver == '{EXAMPLE}'"),
    make_class(AMD, f"device.driver == '{AMD}'"),
    make_class("gpu.nvidia.com", f"device.driver == '{NVIDIA}' && device.attributes['{NVIDIA}'].type == 'gpu'"),
    make_class("mig.nvidia.com", f"device.driver == '{NVIDIA}' && device.attributes['{NVIDIA}'].type == 'mig'"),
])}


def price(inv: Inventory, cls: str, *selectors: str, count: int | None = None, all_mode: bool = False,
          mode: Mode = "conservative") -> tuple[Charge, tuple[str, ...]]:
    spec = parse_claim(make_claim("c", request("r", exactly(cls, *selectors, count=count,
                                                            mode="All" if all_mode else None)))).spec
    pricing = Pricer(inv, CLASSES).estimate(spec, mode=mode)
    assert pricing.errors == ()
    return pricing.total, pricing.warnings


def test_all_on_a_partitionable_node_is_charged_what_its_counters_allow_together() -> None:
    """dra-example-driver, 8 GPUs x (4 partitions + the full GPU): 40 devices publishing
    1,280Gi on a node with 640Gi. They cannot all be allocated together (a full GPU and
    its partitions draw on one counter set), so the scheduler cannot satisfy the request;
    it is charged the most the counters let be allocated at once, with a warning."""
    inv = publish(Inventory(), example_partitionable("node-1"))
    charge, warnings = price(inv, EXAMPLE, all_mode=True)
    assert charge == Charge(640 * GiB, 32)
    assert any("no node can allocate all the devices this request matches together (40 on the largest)" in w
               for w in warnings), warnings
    # All of the partitions only: they fit together, and that is what the scheduler allocates.
    partitions = f"!has(device.attributes['{EXAMPLE}'].full)"
    assert price(inv, EXAMPLE, partitions, all_mode=True) == (Charge(640 * GiB, 32), ())


def test_exact_count_over_partitions_is_capped_by_what_fits_together_on_one_node() -> None:
    """The example driver's demo claim (count 2, demo/examples/partitionable-devices) is two
    full GPUs; 9 devices cannot be 9 full GPUs on an 8-GPU node: at most 7 full GPUs and two
    partitions of the eighth."""
    inv = publish(Inventory(), example_partitionable("node-1"))
    assert price(inv, EXAMPLE, count=2) == (Charge(160 * GiB, 2), ())
    assert price(inv, EXAMPLE, count=9) == (Charge((7 * 80 + 2 * 20) * GiB, 9), ())
    assert price(inv, EXAMPLE, count=9, mode="optimistic")[0] == Charge(9 * 20 * GiB, 9)


def test_all_takes_each_dimension_from_the_node_with_the_most() -> None:
    """8 MI300X whole on one node, 2 split into 16 CPX partitions on another: the scheduler
    may put an All claim on either, so it is charged the first node's memory and the
    second node's device count (a devices: 12 quota refuses it); Optimistic the least of each."""
    inv = publish(Inventory(), amd_mi300x("spx-node", 8, cpx=False), amd_mi300x("cpx-node", 2, cpx=True))
    assert price(inv, AMD, all_mode=True) == (Charge(8 * 192 * GiB, 16), ())
    assert price(inv, AMD, all_mode=True, mode="optimistic") == (Charge(16 * 24 * GiB, 8), ())


def test_all_skips_a_node_that_cannot_host_it() -> None:
    """A node whose candidates do not fit their counters together cannot host the All claim:
    its sums do not count when another node can."""
    inv = publish(Inventory(), example_partitionable("partitioned", gpus=8))
    plain = make_slice("plain", [{"name": f"gpu-{i}", "capacity": {"memory": {"value": "80Gi"}}}
                                    for i in range(2)], driver=EXAMPLE, node="plain")
    inv.add_or_update_slice(plain)
    assert price(inv, EXAMPLE, all_mode=True) == (Charge(160 * GiB, 2), ())


def test_dynamic_mig_placements_are_charged_within_the_memory_slices() -> None:
    """NVIDIA DynamicMIG, two A100-80GB: every MIG placement of a GPU overlaps another, so an
    All over mig.nvidia.com fits nowhere: charged the largest layout per GPU (7g.80gb's
    memory; seven 1g.10gb devices). Three devices of the largest profile do not fit two
    GPUs: a 7g.80gb and two 3g.40gb beside it."""
    inv = publish(Inventory(), nvidia_dynamic_mig("node-1", gpus=2))
    charge, warnings = price(inv, "mig.nvidia.com", all_mode=True)
    assert charge == Charge(2 * 80896 * MiB, 14) and warnings
    assert price(inv, "gpu.nvidia.com", all_mode=True) == (Charge(2 * 80896 * MiB, 2), ())
    assert price(inv, "mig.nvidia.com", count=2) == (Charge(2 * 80896 * MiB, 2), ())
    assert price(inv, "mig.nvidia.com", count=3) == (Charge((80896 + 2 * 40192) * MiB, 3), ())
    one_g = f"device.attributes['{NVIDIA}'].profile == '1g.10gb'"
    assert price(inv, "mig.nvidia.com", one_g, count=8) == (Charge(8 * 9856 * MiB, 8), ())


def test_a_request_no_node_can_hold_keeps_what_it_asks() -> None:
    """ExactCount over partitions that no node can give `count` of at once: the claim waits
    for the inventory to change; it keeps `count` x the largest, with a warning."""
    inv = publish(Inventory(), example_partitionable("node-1", gpus=1))
    charge, warnings = price(inv, EXAMPLE, count=5)
    assert charge == Charge(5 * 80 * GiB, 5)
    assert "request r: no node can allocate 5 of the matching devices together within their shared counters now" \
        in warnings


@pytest.mark.parametrize("cls", [DeviceClassName(EXAMPLE), DeviceClassName("mig.nvidia.com")])
def test_the_stored_claims_bound_stays_above_the_estimate(cls: DeviceClassName) -> None:
    inv = publish(Inventory(), example_partitionable("node-1"), nvidia_dynamic_mig("node-2"))
    spec = parse_claim(make_claim("c", request("r", exactly(cls, mode="All")))).spec
    pricer = Pricer(inv, CLASSES)
    bound, estimate = pricer.upper_bound(spec).total, pricer.estimate(spec).total
    assert bound.memory >= estimate.memory and bound.devices >= estimate.devices
