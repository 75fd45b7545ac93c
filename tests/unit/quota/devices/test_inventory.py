"""quota.devices.inventory and quota.objects.slices: pools, generations, scoping, incremental updates."""

import json
from fractions import Fraction
from typing import Any

import pytest

from quota.devices.inventory import Inventory
from quota.objects import slices
from quota.objects.slices import SliceError
from quota.values.interning import Interned
from quota.values.model import DeviceKey, Version

from ...builders import GiB, consumes, make_counter_slice, make_device, make_slice

D = "gpu.example.com"

KEY = DeviceKey("gpu.example.com", "node-1", "gpu-0")


def test_unqualified_names_belong_to_the_driver_domain() -> None:
    inv = Inventory()
    inv.add_or_update_slice(make_slice("s", [make_device("gpu-0", attrs={
        "type": "gpu", "cc": "v:9.0.0", "index": 3, "mig": False,
        "resource.kubernetes.io/pciBusID": "0000:3b:00.0"})]))
    dev = inv.usable()[KEY]
    assert dev.attributes == {
        "gpu.example.com": {"type": "gpu", "cc": Version("9.0.0"), "index": 3, "mig": False},
        "resource.kubernetes.io": {"pciBusID": "0000:3b:00.0"},
    }
    assert dev.memory == 80 * GiB
    assert dev.scope == "node/node-1" and dev.node_name == "node-1"


def test_only_the_highest_generation_counts() -> None:
    inv = Inventory()
    inv.add_or_update_slice(make_slice("old", [make_device("gpu-0", memory="40Gi")], generation=1))
    inv.add_or_update_slice(make_slice("new", [make_device("gpu-0", memory="80Gi")], generation=2))
    assert inv.usable()[KEY].memory == 80 * GiB
    inv.delete_slice("new")
    assert inv.usable()[KEY].memory == 40 * GiB


def test_a_pool_is_usable_only_when_all_its_slices_are_present() -> None:
    inv = Inventory()
    inv.add_or_update_slice(make_slice("a", [make_device("gpu-0")], count=2))
    assert not inv.usable()
    assert inv.lookup(KEY) is not None, "allocated claims may still look the device up"
    assert inv.unusable_pools() == {("gpu.example.com", "node-1"): "incomplete, generation 1: 1 of 2 slices published"}
    inv.add_or_update_slice(make_slice("b", [make_device("gpu-1")], count=2))
    assert sorted(k.device for k in inv.usable()) == ["gpu-0", "gpu-1"]


def test_updating_one_slice_leaves_other_pools_untouched() -> None:
    inv = Inventory()
    inv.add_or_update_slice(make_slice("n1", [make_device("gpu-0")], node="node-1"))
    inv.add_or_update_slice(make_slice("n2", [make_device("gpu-0")], node="node-2"))
    other = inv.usable()[DeviceKey("gpu.example.com", "node-2", "gpu-0")]
    change = inv.add_or_update_slice(make_slice("n1", [make_device("gpu-0", memory="40Gi")], node="node-1"))
    assert change.pools == (("gpu.example.com", "node-1"),)
    assert inv.usable()[DeviceKey("gpu.example.com", "node-2", "gpu-0")] is other
    assert inv.usable()[KEY].memory == 40 * GiB


def test_delete_and_replace_all() -> None:
    inv = Inventory()
    inv.add_or_update_slice(make_slice("n1", [make_device("gpu-0")], node="node-1"))
    inv.add_or_update_slice(make_slice("n2", [make_device("gpu-0")], node="node-2"))
    inv.delete_slice("n1")
    assert [k.pool for k in inv.usable()] == ["node-2"]
    assert inv.delete_slice("missing").pools == ()
    change = inv.replace_all([make_slice("n3", [make_device("gpu-0")], node="node-3")])
    assert [k.pool for k in inv.usable()] == ["node-3"]
    assert set(change.pools) == {("gpu.example.com", "node-2"), ("gpu.example.com", "node-3")}
    assert inv.lookup(DeviceKey("gpu.example.com", "node-2", "gpu-0")) is None


@pytest.mark.parametrize(
    ("kwargs", "scope", "node"),
    [
        ({"node": None, "pool": "rack-1", "all_nodes": True}, "pool/gpu.example.com/rack-1", None),
        ({"node": None, "pool": "rack-1", "per_device": True}, "node/n7", "n7"),
    ],
)
def test_scoping(kwargs: dict, scope: str, node: str | None) -> None:  # type: ignore[type-arg]
    inv = Inventory()
    inv.add_or_update_slice(make_slice("s", [make_device("gpu-0", node="n7" if kwargs.get("per_device") else None)], **kwargs))
    (dev,) = inv.usable().values()
    assert (dev.scope, dev.node_name) == (scope, node)


def test_shared_device_policy_and_taints_are_parsed() -> None:
    inv = Inventory()
    inv.add_or_update_slice(make_slice("s", [make_device(
        "gpu-0", shared=True, policy={"default": "80Gi", "validRange": {"min": "1Mi", "max": "80Gi", "step": "1Mi"}},
        taints=[{"key": "maintenance", "value": "true", "effect": "NoSchedule"}])]))
    dev = inv.usable()[KEY]
    cap = dev.own_capacity("memory")
    assert dev.allow_multiple_allocations
    assert cap is not None and cap.policy is not None and cap.policy.valid_range is not None
    assert cap.policy.valid_range.step == 2**20 and cap.policy.default == 80 * GiB
    assert dev.taints[0].effect == "NoSchedule"


def test_partitionable_devices_keep_their_counters() -> None:
    dev = make_device("gpu-0-mig-1g")
    dev["consumesCounters"] = consumes("gpu-0-counter-set", memory="5Gi")
    inv = Inventory()
    inv.add_or_update_slice(make_slice("s", [dev], count=2))
    inv.add_or_update_slice(make_counter_slice("c", {"gpu-0-counter-set": {"memory": "40Gi", "memory-slice-0": "1"}}))
    counters = inv.usable()[DeviceKey("gpu.example.com", "node-1", "gpu-0-mig-1g")].consumes_counters
    assert counters[0].counter_set == "gpu-0-counter-set"
    assert counters[0].counters == {"memory": Fraction(5 * GiB)}
    pool = ("gpu.example.com", "node-1")
    assert inv.counters(pool) == {"gpu-0-counter-set": {"memory": Fraction(40 * GiB), "memory-slice-0": 1}}
    assert inv.counter_pools() == {pool}
    inv.delete_slice("s")
    assert inv.counter_pools() == set(), "no device consumes the counters any more"


@pytest.mark.parametrize(("counter_sets", "reason"), [
    ({}, "device 'gpu-0-mig-1g' consumes counter set 'gpu-0-counter-set', which no slice of the pool publishes"),
    ({"gpu-0-counter-set": {"compute": "100"}}, "device 'gpu-0-mig-1g' consumes counter 'memory', not in counter set"),
])
def test_a_pool_whose_counters_cannot_be_checked_is_invalid_as_for_the_scheduler(
        counter_sets: dict[str, dict[str, str]], reason: str) -> None:
    """The allocator marks such a pool invalid (structured pools.go) and allocates nothing from it."""
    dev = make_device("gpu-0-mig-1g")
    dev["consumesCounters"] = consumes("gpu-0-counter-set", memory="5Gi")
    inv = Inventory()
    inv.add_or_update_slice(make_slice("s", [dev], count=2))
    inv.add_or_update_slice(make_counter_slice("c", counter_sets))
    assert not inv.usable() and not inv.counter_pools()
    assert reason in inv.unusable_pools()[("gpu.example.com", "node-1")]


def test_a_counter_set_published_twice_makes_the_pool_invalid() -> None:
    inv = Inventory()
    inv.add_or_update_slice(make_slice("s", [make_device("gpu-0")], count=3))
    inv.add_or_update_slice(make_counter_slice("c1", {"gpu-0-counter-set": {"memory": "40Gi"}}, count=3))
    inv.add_or_update_slice(make_counter_slice("c2", {"gpu-0-counter-set": {"memory": "40Gi"}}, count=3))
    assert inv.unusable_pools() == {("gpu.example.com", "node-1"):
                                    "invalid, generation 1: duplicate counter set name 'gpu-0-counter-set'"}


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda s: s["spec"].pop("driver"), "spec.driver is required"),
        (lambda s: s["spec"]["pool"].update(generation="x"), "generation must be an integer"),
        (lambda s: s["spec"]["devices"][0]["attributes"].update(bad={"int": 1, "string": "x"}), "exactly one of"),
        (lambda s: s["spec"]["devices"][0]["attributes"].update(bad={"int": "1"}), "wrong type"),
        (lambda s: s["spec"]["devices"][0]["capacity"].update(memory={"value": "lots"}), "quantity 'lots'"),
        (lambda s: s["metadata"].pop("name"), "metadata.name is required"),
        (lambda s: s["spec"]["devices"][0]["attributes"].update(driverVersion={"version": "580.95.05"}),
         "'580.95.05' is not a semantic version"),
    ],
)
def test_malformed_slices_are_reported_precisely(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    raw = make_slice("bad", [make_device("gpu-0")])
    mutate(raw)
    with pytest.raises(SliceError, match=message):
        Inventory().add_or_update_slice(raw)


def test_a_device_name_published_twice_in_one_pool_generation_makes_the_pool_unusable() -> None:
    inv = Inventory()
    inv.add_or_update_slice(make_slice("a", [make_device("gpu-0", memory="80Gi")], count=2))
    inv.add_or_update_slice(make_slice("b", [make_device("gpu-0", memory="1Gi")], count=2))
    assert not inv.usable(), "the scheduler allocates nothing from an invalid pool"
    assert inv.unusable_pools() == {
        ("gpu.example.com", "node-1"): "invalid, generation 1: device 'gpu-0' is published by slices 'a' and 'b'"
    }
    found = inv.lookup(KEY)
    assert found is not None and found.memory == 80 * GiB, "allocated claims still find the first one"
    inv.add_or_update_slice(make_slice("b", [make_device("gpu-1")], count=2))
    assert sorted(k.device for k in inv.usable()) == ["gpu-0", "gpu-1"]


def test_a_relist_in_pauses_is_built_aside_and_swapped_in_whole() -> None:
    """`serve` runs `replace_all` in slices (`kube.rebuilds`): a reader between two of
    them sees the old inventory whole, then the new one equal to a list taken at once."""
    from quota.values.work import pausing

    old = [make_slice(f"o{i}", [make_device("gpu-0"), make_device("gpu-1")], node=f"old-{i}") for i in range(3)]
    new = [make_slice(f"n{i}", [make_device("gpu-0")], node=f"new-{i}") for i in range(4)]
    inv = Inventory()
    inv.replace_all(old)
    seen = []

    def reader() -> None:
        seen.append((inv.generation, sorted(k.pool for k in inv.usable())))

    with pausing(reader):
        change = inv.replace_all(new)
    whole_old = (seen[0][0], sorted(f"old-{i}" for i in range(3) for _ in range(2)))
    whole_new = (inv.generation, sorted(f"new-{i}" for i in range(4)))
    # Old while it is built (a pause a slice and a pool at least), new while the old is freed.
    building = seen.index(whole_new) if whole_new in seen else len(seen)
    assert building >= 2 * len(new)
    assert seen == [whole_old] * building + [whole_new] * (len(seen) - building)
    at_once = Inventory()
    at_once.replace_all(new)
    assert {k: repr(d) for k, d in inv.usable().items()} == {k: repr(d) for k, d in at_once.usable().items()}
    assert set(change.pools) == {("gpu.example.com", f"{p}-{i}") for p, n in (("old", 3), ("new", 4)) for i in range(n)}
    assert change.generation == inv.generation > whole_old[0]


def test_a_malformed_slice_in_a_relist_changes_nothing() -> None:
    inv = Inventory()
    inv.replace_all([make_slice("o", [make_device("gpu-0")], node="old")])
    before = dict(inv.usable())
    bad = make_slice("bad", [make_device("gpu-0")], node="new")
    bad["spec"]["devices"] = "not a list"
    with pytest.raises(SliceError):
        inv.replace_all([make_slice("n", [make_device("gpu-0")], node="new"), bad])
    assert inv.usable() == before


def test_what_a_paused_reader_holds_is_not_emptied_under_it_by_a_relist() -> None:
    """A partition built in slices holds the usable pools and the field index it was
    handed while a relist swaps the inventory: their iteration goes on over the old ones."""
    inv = Inventory()
    for n in range(3):
        inv.add_or_update_slice(make_slice(f"n{n}", [make_device("gpu-0")], node=f"node-{n}"))
    pools, fields = inv.usable_pools(), inv.field_pools()
    reading = iter(pools)
    first = next(reading)
    inv.replace_all([make_slice("n9", [make_device("gpu-0")], node="node-9")])
    assert [first, *reading] == list(pools) and len(pools) == 3 and fields
    assert len(inv.usable_pools()) == 1


def test_devices_parsed_apart_share_their_names_values_and_capacity_maps() -> None:
    # 58,000 GPUs publish a handful of models: each device decoded its own copy of every
    # name and value (bench/startup_local.py). Shared as parsed, read the same.
    def gpu(node: str) -> dict[str, Any]:
        attrs = {"productName": "".join(["NVIDIA ", "H100"]), "uuid": f"GPU-{node}",
                 "driverVersion": "v:580.95.5", "example.com/numa": 0}
        return make_slice(node, [make_device("gpu-0", attrs=attrs, capacity={"cores": "132"})], node=node)

    inv = Inventory()
    for node in ("node-1", "node-2"):
        inv.add_or_update_slice(json.loads(json.dumps(gpu(node))))  # decoded apart, as from the API server
    one, two = (inv.lookup(DeviceKey(D, node, "gpu-0")) for node in ("node-1", "node-2"))
    assert one is not None and two is not None
    assert one.attributes[D]["productName"] is two.attributes[D]["productName"] == "NVIDIA H100"
    assert one.attributes[D]["driverVersion"] is two.attributes[D]["driverVersion"] == Version("580.95.5")
    assert one.attributes[D]["uuid"] == "GPU-node-1" and two.attributes[D]["uuid"] == "GPU-node-2"
    assert one.capacity is two.capacity and one.capacity[D]["memory"].value == 80 * GiB
    assert one.attributes["example.com"] == two.attributes["example.com"] == {"numa": 0}


def test_the_shared_slice_values_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    # A driver publishing new values per device (a uuid, odd capacities) must not grow the
    # tables without end: past their limit a value is simply not shared.
    monkeypatch.setattr(slices, "_strings", Interned(5))
    monkeypatch.setattr(slices, "_capacity_maps", {})
    monkeypatch.setattr(slices, "_CAPACITY_MAPS_KEPT", 5)
    inv = Inventory()
    inv.add_or_update_slice(make_slice("odd", [make_device(f"d{i}", attrs={"uuid": f"u-{i}"}, capacity={"cores": str(i)})
                                               for i in range(20)]))
    assert len(slices._strings) == 5 and len(slices._capacity_maps) == 5
    last = inv.lookup(DeviceKey(D, "node-1", "d19"))
    assert last is not None and last.attributes[D]["uuid"] == "u-19" and last.capacity[D]["cores"].value == 19
