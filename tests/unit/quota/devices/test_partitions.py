"""quota.devices.columns + quota.devices.partitions, through SelectorMatcher: grouping never changes an answer.

The matcher evaluates CEL once per group of devices it believes CEL cannot tell apart,
found through per-pool columns instead of the devices. The property test holds it to
brute force: every selector evaluated on every device, stage by stage, on random
inventories whose attributes collide across types (1 vs true, [1, 0] vs [true, false]),
whose fields are present on some devices only, with selectors over existing and
invented names, capacities, other domains and whole maps, presence tests, a value unique
per device, versions CEL cannot parse (they fail every selector on their device); then
again after random slice updates, on the same matcher, and with the per-match memo
given up at once (as for a uuid on a real inventory).
"""

from __future__ import annotations

from typing import Any
from unittest.mock import patch

from hypothesis import given, settings
from hypothesis import strategies as st

from quota.cel import CelRuntimeError, compile_selector, device_activation
from quota.devices.columns import presence
from quota.devices.inventory import Inventory
from quota.devices.partitions import Partition
from quota.devices.selectors import SelectorMatcher
from quota.values.model import DeviceKey

from ...builders import make_slice

D = "gpu.example.com"
OTHER = "other.example.com"
NAMES = ["a", "b"]  # few names: fields collide across devices and types

values = st.sampled_from([{"int": 0}, {"int": 1}, {"bool": True}, {"bool": False}, {"string": "1"},
                          {"version": "1.0.0"}, {"ints": [1, 0]}, {"bools": [True, False]},
                          {"version": "18446744073709551616.0.0"}])
attributes = st.dictionaries(st.sampled_from([*NAMES, f"{OTHER}/a"]), values, max_size=3)
capacities = st.dictionaries(st.sampled_from(["memory", "cores"]), st.sampled_from(["1", "2", "1Gi"]), max_size=2)
devices = st.tuples(attributes, capacities, st.booleans())

literals = ["0", "1", "true", "false", "'1'", "[1, 0]", "[true, false]"]
selectors = st.one_of(
    st.builds(lambda d, n, lit: f"has(device.attributes['{d}'].{n}) && device.attributes['{d}'].{n} == {lit}",
              st.sampled_from([D, OTHER]), st.sampled_from([*NAMES, "invented"]), st.sampled_from(literals)),
    st.builds(lambda n: f"!has(device.capacity['{D}'].{n}) || "
                        f"device.capacity['{D}'].{n}.compareTo(quantity('1')) > 0",
              st.sampled_from(["memory", "cores", "invented"])),
    st.builds(lambda n: f"device.attributes['{D}'].{n} == 1", st.sampled_from(NAMES)),  # errors when absent
    st.builds(lambda d, n: f"has(device.attributes['{d}'].{n})", st.sampled_from([D, OTHER]),
              st.sampled_from([*NAMES, "u", "invented"])),
    st.builds(lambda n: f"'{n}' in device.attributes['{D}'] && !has(device.capacity['{D}'].cores)",
              st.sampled_from([*NAMES, "u"])),
    st.sampled_from([f"size(device.attributes['{D}']) >= 2", "device.allowMultipleAllocations",
                     f"device.driver == '{D}'", "true", f"device.attributes['{D}'].u != '0-1'",
                     f"device.attributes['{D}'].u.startsWith('1')"]),
)
chains = st.lists(st.lists(selectors, max_size=2).map(tuple), min_size=1, max_size=3).map(tuple)
pools = st.lists(st.lists(devices, max_size=4), min_size=1, max_size=4)


def pool_slice(index: int, spec: list[tuple[dict[str, Any], dict[str, str], bool]], generation: int = 1) -> dict[str, Any]:
    raw = [
        # `u` is unique per device, like a GPU's uuid.
        {"name": f"d{i}", "attributes": {**attrs, "u": {"string": f"{index}-{i}"}},
         "capacity": {k: {"value": v} for k, v in caps.items()},
         **({"allowMultipleAllocations": True} if shared else {})}
        for i, (attrs, caps, shared) in enumerate(spec)
    ]
    return make_slice(f"s{index}", raw, driver=D, node=f"node-{index}", generation=generation)


def brute_force(inv: Inventory, chain: tuple[tuple[str, ...], ...]) -> set[DeviceKey] | None:
    """Every stage on every device the earlier stages kept; None if one errors."""
    compiled = [[compile_selector(e) for e in stage] for stage in chain]
    kept = set()
    for device in inv.usable().values():
        activation = device_activation(device)
        try:
            if all(s.evaluate(activation) for stage in compiled for s in stage):
                kept.add(device.key)
        except CelRuntimeError:
            return None
    return kept


def check(matcher: SelectorMatcher, inv: Inventory, chain: tuple[tuple[str, ...], ...]) -> None:
    match = matcher.match(chain, ["cores"])
    expected = brute_force(inv, chain)
    if expected is None:
        assert match.error is not None, chain
        return
    assert match.error is None, (chain, match.error)
    assert {d.key for d in match.devices()} == expected, chain
    for group in match.groups:
        listed = list(group.devices)
        assert len(listed) == len(group.devices) and listed[0] is group.representative
        # What pricing reads from the representative holds for the whole group.
        rep = group.representative
        for device in listed:
            assert device.own_capacity("memory") is rep.own_capacity("memory")
            assert device.own_capacity("cores") is rep.own_capacity("cores")
            assert (device.allow_multiple_allocations, device.taints) == (rep.allow_multiple_allocations, rep.taints)


@settings(max_examples=200, deadline=None)
@given(pools, st.lists(chains, min_size=1, max_size=4), st.lists(st.tuples(st.integers(0, 4), st.lists(devices, max_size=4)), max_size=3))
def test_grouped_matches_equal_brute_force(
    layout: list[list[Any]], chain_list: list[tuple[tuple[str, ...], ...]], updates: list[tuple[int, list[Any]]]
) -> None:
    inv = Inventory()
    inv.replace_all([pool_slice(i, spec) for i, spec in enumerate(layout)])
    matcher = SelectorMatcher(inv)
    for chain in chain_list:
        check(matcher, inv, chain)
    for generation, (index, spec) in enumerate(updates, start=2):
        inv.add_or_update_slice(pool_slice(index, spec, generation))
        for chain in chain_list:
            check(matcher, inv, chain)


@settings(max_examples=100, deadline=None)
@given(pools, st.lists(chains, min_size=1, max_size=4))
def test_stages_past_the_memo_limit_answer_the_same(layout: list[list[Any]],
                                                     chain_list: list[tuple[tuple[str, ...], ...]]) -> None:
    inv = Inventory()
    inv.replace_all([pool_slice(i, spec) for i, spec in enumerate(layout)])
    with patch("quota.devices.verdicts.PER_STAGE", 1):
        matcher = SelectorMatcher(inv)
        for chain in chain_list:
            check(matcher, inv, chain)


U, A = ("attributes", D, "u"), ("attributes", D, "a")


def test_presence_tests_split_by_presence_only() -> None:
    inv = Inventory()
    inv.replace_all([pool_slice(i, [({"a": {"int": i}}, {}, False), ({}, {}, False)]) for i in range(20)])
    found = SelectorMatcher(inv).match(((f"has(device.attributes['{D}'].u) && 'a' in device.attributes['{D}']",),))
    assert found.count == 20 and len(found.groups) == 1
    # Every pool has its own `u` and `a` columns, and the same presence columns.
    for fields, classes in (((U, A), 20), ((presence(U), presence(A)), 1)):
        partition = Partition(None, lambda pool, fields=fields: fields)  # type: ignore[misc]
        partition.rebuild(inv.usable_pools(), inv.field_pools())
        assert len(partition.classes) == classes


def test_a_field_no_pool_has_splits_nothing() -> None:
    inv = Inventory()
    inv.replace_all([pool_slice(i, [({"a": {"int": 1}}, {}, False)] * 3) for i in range(20)])
    matcher = SelectorMatcher(inv)
    found = matcher.match(((f"!has(device.attributes['{D}'].nowhere)",),))
    assert found.count == 60 and len(found.groups) == 1
    assert len(found.groups[0].devices) == 60
