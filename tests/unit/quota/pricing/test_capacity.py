"""quota.pricing.capacity: requestPolicy rounding, capacity requests, taints."""

from fractions import Fraction
from types import SimpleNamespace
from typing import Any

import pytest

from quota.devices.inventory import Inventory
from quota.objects.claimspec import DeviceRequirement, Toleration
from quota.pricing.capacity import memory_charge, round_request, tolerates_all
from quota.pricing.counters import per_scope
from quota.values.model import Capacity, Charge, Device, DeviceClassName, RequestPolicy, Taint, ValidRange
from quota.values.work import PAUSE_ITEMS, pausing

from ...builders import GiB, MiB, make_device, make_slice

RANGE = RequestPolicy(default=Fraction(80 * GiB), valid_range=ValidRange(Fraction(MiB), Fraction(80 * GiB), Fraction(MiB)))
VALUES = RequestPolicy(default=Fraction(10 * GiB), valid_values=(Fraction(10 * GiB), Fraction(20 * GiB), Fraction(40 * GiB)))


@pytest.mark.parametrize(
    ("request_", "policy", "expected"),
    [
        (20 * GiB, RANGE, 20 * GiB),
        (20 * GiB + 1, RANGE, 20 * GiB + MiB),
        (1, RANGE, MiB),  # raised to min
        (81 * GiB, RANGE, None),  # above max
        (15 * GiB, VALUES, 20 * GiB),
        (40 * GiB, VALUES, 40 * GiB),
        (41 * GiB, VALUES, None),
        (30 * GiB, None, 30 * GiB),
        (90 * GiB, None, None),  # above the device's capacity
    ],
)
def test_round_request(request_: int, policy: RequestPolicy | None, expected: int | None) -> None:
    assert round_request(Fraction(request_), Capacity(Fraction(80 * GiB), policy)) == expected


def _device(**kwargs: Any) -> Device:
    inv = Inventory()
    inv.add_or_update_slice(make_slice("s", [make_device("d", **kwargs)]))
    return next(iter(inv.usable().values()))


def req(**capacity: str) -> DeviceRequirement:
    from quota.values.quantity import parse_quantity

    return DeviceRequirement("r", DeviceClassName("c"),
                             capacity_requests=tuple(sorted((k, parse_quantity(v)) for k, v in capacity.items())))


POLICY = {"default": "80Gi", "validRange": {"min": "1Mi", "max": "80Gi", "step": "1Mi"}}


@pytest.mark.parametrize(
    ("device", "requirement", "expected"),
    [
        ({}, req(), 80 * GiB),  # whole device
        ({}, req(memory="20Gi"), 80 * GiB),  # not shared: consumed whole
        ({}, req(memory="90Gi"), None),  # too small
        ({"shared": True, "policy": POLICY}, req(memory="20Gi"), 20 * GiB),
        ({"shared": True, "policy": POLICY}, req(**{"gpu.example.com/memory": "20Gi"}), 20 * GiB),
        ({"shared": True, "policy": POLICY}, req(memory="100Mi"), 100 * MiB),
        # One capacity named with and without the driver prefix: the larger, in either order.
        ({"shared": True, "policy": POLICY}, req(memory="20Gi", **{"gpu.example.com/memory": "1Mi"}), 20 * GiB),
        ({"shared": True, "policy": POLICY}, req(memory="1Mi", **{"gpu.example.com/memory": "20Gi"}), 20 * GiB),
        ({"shared": True, "policy": {"default": "8Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}}, req(), 8 * GiB),
        ({"shared": True}, req(), 80 * GiB),  # no policy: the whole capacity
        ({"shared": True, "policy": POLICY}, req(memory="81Gi"), None),
        ({}, req(cores="4"), None),  # requested capacity the device lacks
        ({"capacity": {"cores": "8"}}, req(cores="4"), 80 * GiB),
        ({"memory": None}, req(), 0),
    ],
)
def test_memory_charge(device: dict[str, Any], requirement: DeviceRequirement, expected: int | None) -> None:
    assert memory_charge(_device(**device), requirement) == expected


NO_SCHEDULE = Taint("maintenance", "true", "NoSchedule")


@pytest.mark.parametrize(
    ("taints", "tolerations", "ok"),
    [
        ((), (), True),
        ((NO_SCHEDULE,), (), False),
        ((Taint("info", "", "None"),), (), True),
        ((NO_SCHEDULE,), (Toleration("maintenance", "Equal", "true", "NoSchedule"),), True),
        ((NO_SCHEDULE,), (Toleration("maintenance", "Equal", "false", ""),), False),
        ((NO_SCHEDULE,), (Toleration("", "Exists", "", ""),), True),
        ((NO_SCHEDULE,), (Toleration("maintenance", "Exists", "", "NoExecute"),), False),
    ],
)
def test_taints(taints: tuple[Taint, ...], tolerations: tuple[Toleration, ...], ok: bool) -> None:
    assert tolerates_all(taints, tolerations) is ok


def test_per_scope_sums_per_node_and_pauses_on_the_way() -> None:
    """An All-mode bound reads every candidate (58,000 devices): it gives the loop back
    every `PAUSE_ITEMS` devices (`quota.values.work.paced`) instead of holding it 68 ms."""
    node = [SimpleNamespace(scope=f"node-{n % 3}") for n in range(3 * 700)]  # over 2 * PAUSE_ITEMS
    groups: Any = [(10, len(node), SimpleNamespace(devices=node)), (1, 1, SimpleNamespace(devices=node[:1]))]
    pauses: list[int] = []
    with pausing(lambda: pauses.append(1)):
        sums = per_scope(groups)
    assert len(pauses) == len(node) // PAUSE_ITEMS == 2
    assert sums.charges == {"node-0": Charge(7001, 701), "node-1": Charge(7000, 700), "node-2": Charge(7000, 700)}
