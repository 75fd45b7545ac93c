"""quota.devices.selectors: grouping, stage order, and incremental per-pool caching.

The matcher keeps per-pool partitions and verdicts across inventory changes; the
property test holds it to the only acceptable behaviour: after any sequence of slice
events it answers exactly what a fresh matcher over the same inventory answers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from unittest.mock import patch

import pytest
from greenlet import greenlet
from hypothesis import given, settings
from hypothesis import strategies as st

from quota.cel import CompiledSelector
from quota.devices import partitions
from quota.devices.inventory import Inventory
from quota.devices.selectors import PATIENCE, SelectorMatcher
from quota.values.model import DeviceKey
from quota.values.work import CLAIM_COST_BUDGET, Budget, BudgetExceeded, pausing

from ...builders import make_device, make_slice

D = "gpu.example.com"
GPU = (f"device.attributes['{D}'].type == 'gpu'",)
BIG = (f"device.capacity['{D}'].memory.compareTo(quantity('50Gi')) >= 0",)
MODEL = (f"device.attributes['{D}'].model == 'h100'",)
DYNAMIC = (f"size(device.attributes['{D}']) >= 2",)  # reads a whole map: no grouping
CHAINS = [(GPU,), (GPU, BIG), (GPU, MODEL), (GPU, DYNAMIC), ((), BIG)]


def node_slice(node: int, models: list[str], generation: int = 1) -> dict:  # type: ignore[type-arg]
    devices = [
        make_device(f"gpu-{i}", memory="80Gi" if m == "h100" else "40Gi", attrs={"type": "gpu", "model": m})
        for i, m in enumerate(models)
    ]
    return make_slice(f"s{node}", devices, driver=D, node=f"node-{node}", generation=generation)


def keys(matcher: SelectorMatcher, chain: tuple[tuple[str, ...], ...]) -> set[DeviceKey]:
    match = matcher.match(chain)
    assert match.error is None
    return {d.key for d in match.devices()}


def test_one_slice_update_recomputes_one_pool_per_partition() -> None:
    inv = Inventory()
    inv.replace_all([node_slice(n, ["h100", "a100"]) for n in range(50)])
    matcher = SelectorMatcher(inv)
    assert len(keys(matcher, (GPU, BIG))) == 50
    before = matcher.pools_computed
    inv.add_or_update_slice(node_slice(7, ["h100", "h100"], generation=2))
    assert len(keys(matcher, (GPU, BIG))) == 51
    # base partition, class paths, request paths: one pool each.
    assert matcher.pools_computed - before == 3


@contextlib.contextmanager
def counting_rebuilds(calls: list[str]) -> Iterator[None]:
    """`calls` gets "rebuild" as each partition rebuild begins, "split" for each class of
    pools a rebuild splits."""
    by_shape, buckets = partitions._by_shape, partitions._buckets

    def first(*args: Any) -> Any:
        calls.append("rebuild")
        return by_shape(*args)

    def split(*args: Any) -> Any:
        calls.append("split")
        return buckets(*args)

    with patch("quota.devices.partitions._by_shape", first), patch("quota.devices.partitions._buckets", split):
        yield


def test_a_rebuild_stops_once_another_match_installed_the_same_partition() -> None:
    """After a relist of the slices every review rebuilds the partitions it needs until one
    is installed; one that paused meanwhile takes the installed one at its next pause
    instead of finishing its own (with 50 reviews a second, the slow lane's queue of such
    rebuilds outgrew their deadlines)."""
    inv = Inventory()
    inv.replace_all([node_slice(n, ["h100", "a100"]) for n in range(20)])
    calls: list[str] = []
    with counting_rebuilds(calls):
        expected = keys(SelectorMatcher(inv), (GPU, BIG))
        alone = calls.count("split")
        calls.clear()
        matcher = SelectorMatcher(inv)
        nested: list[set[DeviceKey]] = []

        def pause() -> None:  # in a rebuild: another review's match runs whole meanwhile
            if calls and not nested:
                nested.append(set())
                nested[0] = keys(matcher, (GPU, BIG))

        with pausing(pause):
            assert keys(matcher, (GPU, BIG)) == expected
    assert nested == [expected]
    assert calls.count("split") == alone, "the paused rebuild went on after another one was installed"


def test_a_match_waits_for_the_rebuild_another_has_under_way_instead_of_building_its_own() -> None:
    """A review arriving while another one rebuilds the level it needs gives the loop back
    (`quota.values.work.wait_point`) until that one is installed, and takes it: its first slice
    spent rebuilding too starved the rebuild that would finish."""
    inv = Inventory()
    inv.replace_all([node_slice(n, ["h100", "a100"]) for n in range(20)])
    calls: list[str] = []
    with counting_rebuilds(calls):
        expected = keys(SelectorMatcher(inv), (GPU, BIG))
        alone = calls.count("rebuild"), calls.count("split")
        calls.clear()
        matcher = SelectorMatcher(inv)
        main = greenlet.getcurrent()

        def builder() -> set[DeviceKey]:  # another review, paused in its rebuild
            with pausing(lambda: main.switch() if calls else None):
                return keys(matcher, (GPU, BIG))

        other = greenlet(builder)
        other.switch()
        assert calls == ["rebuild"] and not other.dead
        waits: list[bool] = []

        def wait() -> None:
            waits.append(True)
            other.switch()

        with pausing(lambda: None, wait):
            assert keys(matcher, (GPU, BIG)) == expected
    assert waits and other.dead
    assert (calls.count("rebuild"), calls.count("split")) == alone, "it built a level the other was building"


def test_a_match_stops_waiting_for_a_rebuild_that_does_not_move() -> None:
    """The call rebuilding may be queued for the slow lane the waiting call holds: after
    `PATIENCE` turns in which it did not move, the waiting call builds its own (else both
    waited until the reviews' deadline: every review of a bench/stalls.py window failed)."""
    inv = Inventory()
    inv.replace_all([node_slice(n, ["h100", "a100"]) for n in range(20)])
    expected = keys(SelectorMatcher(inv), (GPU, BIG))
    calls: list[str] = []
    with counting_rebuilds(calls):
        matcher = SelectorMatcher(inv)
        main = greenlet.getcurrent()

        def stuck() -> None:  # paused in its rebuild, never resumed
            with pausing(lambda: main.switch() if calls else None):
                keys(matcher, (GPU, BIG))

        builder = greenlet(stuck)  # kept: a greenlet let go is unwound (its rebuild given up)
        builder.switch()
        waits: list[bool] = []
        with pausing(lambda: None, lambda: waits.append(True)):
            assert keys(matcher, (GPU, BIG)) == expected
    assert len(waits) == PATIENCE and calls.count("rebuild") > 1 and not builder.dead


def test_deleted_pool_disappears_and_relist_rescans() -> None:
    inv = Inventory()
    inv.replace_all([node_slice(n, ["h100"]) for n in range(3)])
    matcher = SelectorMatcher(inv)
    assert len(keys(matcher, (GPU,))) == 3
    inv.delete_slice("s1")
    assert {k.pool for k in keys(matcher, (GPU,))} == {"node-0", "node-2"}
    inv.replace_all([node_slice(9, ["a100"])])
    assert {k.pool for k in keys(matcher, (GPU,))} == {"node-9"}


def test_a_new_literal_reuses_the_partition_of_its_fields() -> None:
    inv = Inventory()
    inv.replace_all([node_slice(n, ["h100", "a100"]) for n in range(20)])
    matcher = SelectorMatcher(inv)
    keys(matcher, (GPU, MODEL))
    before = matcher.pools_computed
    assert len(keys(matcher, (GPU, (f"device.attributes['{D}'].model == 'a100'",)))) == 20
    assert matcher.pools_computed == before


def test_runtime_errors_only_where_the_previous_stage_kept_devices() -> None:
    inv = Inventory()
    inv.add_or_update_slice(make_slice("s", [
        make_device("gpu-0", attrs={"type": "gpu", "model": "h100"}),
        make_device("nic-0", attrs={"type": "nic"}),
    ], driver=D))
    matcher = SelectorMatcher(inv)
    assert keys(matcher, (GPU, MODEL)) == {DeviceKey(D, "node-1", "gpu-0")}
    failed = matcher.match(((), MODEL))
    assert failed.error is not None and failed.error.stage == 1 and "model" in failed.error.message


def test_bool_and_int_attributes_never_share_a_group() -> None:
    # Python has 1 == True with equal hashes; CEL does not: true == 1 is false.
    inv = Inventory()
    inv.add_or_update_slice(make_slice("s", [
        make_device("one", attrs={"x": 1}), make_device("true", attrs={"x": True}),
        make_device("ones", attrs={"x": 2}),
    ], driver=D))
    inv.add_or_update_slice(make_slice("l", [
        {"name": "ints", "attributes": {"xs": {"ints": [1, 0]}}},
        {"name": "bools", "attributes": {"xs": {"bools": [True, False]}}},
    ], driver=D, node="node-2"))
    matcher = SelectorMatcher(inv)
    x = f"has(device.attributes['{D}'].x) && device.attributes['{D}'].x"
    assert {k.device for k in keys(matcher, ((f"{x} == 1",),))} == {"one"}
    assert {k.device for k in keys(matcher, ((f"{x} == true",),))} == {"true"}
    assert {k.device for k in keys(matcher, ((f"has(device.attributes['{D}'].xs) && device.attributes['{D}'].xs == [1, 0]",),))} == {"ints"}


def test_a_match_has_one_cost_budget_across_devices() -> None:
    # Reads the whole attribute map (no grouping), so every device is evaluated; each
    # evaluation stays under the per-evaluation limit, the sum does not.
    inv = Inventory()
    inv.replace_all([node_slice(n, ["h100", "a100", "h100"]) for n in range(60)])
    heavy = (f"size(device.attributes['{D}']) > 0 && "
             "lists.range(300).all(x, lists.range(100).all(y, x + y >= 0))",)
    with pytest.raises(BudgetExceeded, match=f"exceeded the per-claim budget of {CLAIM_COST_BUDGET:,} CEL cost units"):
        SelectorMatcher(inv).match((heavy,))
    cheap = (f"size(device.attributes['{D}']) > 0",)
    assert SelectorMatcher(inv).match((cheap,)).count == 180


def test_a_cached_match_costs_a_claim_what_it_cost_to_compute_once_per_claim() -> None:
    """The same claim gets the same verdict whatever earlier claims left in the caches."""
    inv = Inventory()
    inv.replace_all([node_slice(n, ["h100", "a100", "h100"]) for n in range(20)])
    matcher = SelectorMatcher(inv)
    loop = (f"size(device.attributes['{D}']) > 0 && lists.range(50).all(x, x >= 0)",)
    cold, warm, again = Budget.claim(), Budget.claim(), Budget.claim()
    first = matcher.match((loop,), (), cold)
    assert first.cost == cold.spent > 60 * 50
    assert matcher.match((loop,), (), warm) is first and warm.spent == cold.spent
    matcher.match((loop,), (), again)
    matcher.match((loop,), (), again)
    assert again.spent == cold.spent  # once per claim
    # A new matcher (another replica) whose verdict cache is warm from another chain.
    other = SelectorMatcher(inv)
    other.match((loop, ("true",)), (), Budget.claim())
    fresh = Budget.claim()
    other.match((loop,), (), fresh)
    assert fresh.spent == cold.spent


def test_a_per_device_selector_does_not_evict_the_verdicts_of_others() -> None:
    inv = Inventory()
    inv.replace_all([node_slice(n, ["h100", "a100"]) for n in range(10)])
    evaluations = []
    evaluate = CompiledSelector.evaluate_with_cost

    def counted(self: CompiledSelector, *args: Any, **kwargs: Any) -> tuple[bool, int]:
        evaluations.append(self.expression)
        return evaluate(self, *args, **kwargs)

    with patch("quota.devices.verdicts.PER_STAGE", 2), patch.object(CompiledSelector, "evaluate_with_cost", counted):
        matcher = SelectorMatcher(inv, verdict_cache_size=8)
        inv.add_or_update_slice(make_slice("names", [make_device(f"n-{i}", attrs={"name": f"n{i}", "type": "nic"})
                                                     for i in range(20)], driver=D, node="names"))
        assert len(keys(matcher, (GPU, MODEL))) == 10
        # 20 devices, 20 names: CEL runs per device, and only 3 of its verdicts are kept.
        per_device = ((f"!has(device.attributes['{D}'].name) || device.attributes['{D}'].name != 'x'",),)
        assert len(keys(matcher, per_device)) == 40
        evaluations.clear()
        inv.add_or_update_slice(node_slice(3, ["h100", "a100"], generation=2))
        assert len(keys(matcher, (GPU, MODEL))) == 10
    assert evaluations == []  # every verdict came from the cache


events = st.lists(
    st.tuples(
        st.sampled_from(["update", "delete", "relist"]),
        st.integers(0, 4),
        st.lists(st.sampled_from(["h100", "a100"]), min_size=0, max_size=3),
    ),
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(events)
def test_incremental_answers_equal_a_fresh_matcher(ops: list[tuple[str, int, list[str]]]) -> None:
    inv = Inventory()
    inv.replace_all([node_slice(n, ["h100", "a100"]) for n in range(3)])
    matcher = SelectorMatcher(inv)
    generation = {n: 1 for n in range(5)}
    for chain in CHAINS:
        keys(matcher, chain)
    for op, node, models in ops:
        if op == "update":
            generation[node] += 1
            inv.add_or_update_slice(node_slice(node, models, generation[node]))
        elif op == "delete":
            inv.delete_slice(f"s{node}")
        else:
            inv.replace_all([node_slice(n, models or ["a100"], generation[n]) for n in range(node + 1)])
        fresh = SelectorMatcher(inv)
        for chain in CHAINS:
            assert keys(matcher, chain) == keys(fresh, chain), (op, node, models, chain)
