"""quota.devices.equality: a selector pinning a device by `attribute == literal` is answered from an
index with exactly the verdicts of evaluating every device.

The property test draws inventories where the attribute is missing on some devices,
holds other types (int, bool, version, a version that does not parse), and selectors
whose other terms, later selectors and class selectors can fail at run time; the index
path and the full path must then agree on the devices matched, and on whether the match
fails (which failing device a message names follows iteration order, as it does today).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest.mock import patch

from hypothesis import given, settings
from hypothesis import strategies as st

from quota.cel import compile_selector
from quota.devices.inventory import Inventory
from quota.devices.selectors import Match, SelectorMatcher

from ...builders import make_device, make_slice

D = "gpu.example.com"
# "v:...": a version attribute; the last one passes the API server's check but not CEL's
# (a number past uint64): every selector fails on that device.
VALUES = st.sampled_from(["GPU-1", "GPU-2", "gpu", 1, 2, True, False, "v:1.2.3", "v:1.2.99999999999999999999", None])
LITERALS = ['"GPU-1"', '"GPU-2"', "1", "2", "true", '"1.2.3"', '"absent"']
CLASSES = ["true", f"device.attributes['{D}'].kind == 'gpu'", f"device.attributes['{D}'].kind != 'nic'",
           f"device.attributes['{D}'].n > 0"]
# The last one exceeds the cost limit at once, an error `&&` does not absorb: the index
# must not be used for it.
OTHER_TERMS = ["", f" && device.attributes['{D}'].n > 0", f" && device.attributes['{D}'].kind.startsWith('g')",
               " && device.driver == 'gpu.example.com'", " && lists.range(100000000).size() > 0"]
LATER = [None, f"device.attributes['{D}'].n >= 0", "true"]


@st.composite
def inventories(draw: st.DrawFn) -> Inventory:
    inv = Inventory()
    for node in range(draw(st.integers(1, 4))):
        devices = []
        for i in range(draw(st.integers(1, 6))):
            attrs: dict[str, Any] = {"kind": draw(st.sampled_from(["gpu", "nic"]))}
            value = draw(VALUES)
            if value is not None:
                attrs["uuid"] = value
            if draw(st.booleans()):
                attrs["n"] = draw(st.sampled_from([0, 1, "one"]))
            devices.append(make_device(f"d{i}", attrs=attrs))
        inv.add_or_update_slice(make_slice(f"s{node}", devices, driver=D, node=f"node-{node}"))
    return inv


@st.composite
def chains(draw: st.DrawFn) -> tuple[tuple[str, ...], tuple[str, ...]]:
    literal = draw(st.sampled_from(LITERALS))
    attribute = draw(st.sampled_from([f"device.attributes['{D}'].uuid", f"device.attributes['{D}']['uuid']"]))
    term = f"{attribute} == {literal}" if draw(st.booleans()) else f"{literal} == {attribute}"
    other = draw(st.sampled_from(OTHER_TERMS))
    first = term + other if not other or draw(st.booleans()) else other[4:] + " && " + term
    later = draw(st.sampled_from(LATER))
    request = (first,) if later is None else (first, later)
    return (draw(st.sampled_from(CLASSES)),), request


@contextmanager
def always_indexed() -> Iterator[None]:
    """The index however common the value and the attribute's values are."""
    with patch("quota.devices.selectors.INDEX_SHARE", 0), patch("quota.devices.selectors.worth_indexing", lambda *_: True):
        yield


def outcome(match: Match) -> tuple[bool, list[list[str]]]:
    groups = sorted(sorted(str(d.key) for d in g.devices) for g in match.groups)
    return match.error is not None, groups


@settings(max_examples=300, deadline=None)
@given(inventories(), chains())
def test_the_index_answers_exactly_as_evaluating_every_device(
        inv: Inventory, chain: tuple[tuple[str, ...], tuple[str, ...]]) -> None:
    assert compile_selector(chain[1][0]).equalities, chain  # the index applies
    with always_indexed():
        indexed = SelectorMatcher(inv).match(chain)
    with patch("quota.devices.selectors.index_term", lambda stage: None):
        full = SelectorMatcher(inv).match(chain)
    assert outcome(indexed) == outcome(full), (chain, indexed.error, full.error)


def test_the_index_evaluates_only_the_pinned_device_and_follows_slice_updates() -> None:
    inv = Inventory()
    inv.replace_all([make_slice(f"s{n}", [make_device(f"g{i}", attrs={"kind": "gpu", "uuid": f"GPU-{n}-{i}"})
                                          for i in range(8)], driver=D, node=f"node-{n}") for n in range(20)])
    matcher = SelectorMatcher(inv)
    pinned = ((f"device.attributes['{D}'].kind == 'gpu'",), (f"device.attributes['{D}'].uuid == 'GPU-7-3'",))
    evaluations = []
    evaluate = type(compile_selector("true")).evaluate_with_cost

    def counted(self: Any, *args: Any, **kwargs: Any) -> tuple[bool, int]:
        evaluations.append(self.expression)
        return evaluate(self, *args, **kwargs)

    with patch.object(type(compile_selector("true")), "evaluate_with_cost", counted):
        match = matcher.match(pinned)
    assert [str(d.key) for d in match.devices()] == [f"{D}/node-7/g3"]
    assert evaluations.count(pinned[1][0]) == 1  # one device, not 160
    inv.add_or_update_slice(make_slice("s7", [make_device("g3", attrs={"kind": "gpu", "uuid": "GPU-new"})],
                                       driver=D, node="node-7", generation=2))
    assert matcher.match(pinned).count == 0
    moved = ((pinned[0]), (f"device.attributes['{D}'].uuid == 'GPU-new'",))
    assert [str(d.key) for d in matcher.match(moved).devices()] == [f"{D}/node-7/g3"]


def test_a_term_that_can_exceed_the_cost_limit_keeps_every_device_evaluated() -> None:
    """`&&` does not absorb a cost-limit error: pruning by the index would turn it into false."""
    inv = Inventory()
    inv.replace_all([make_slice("s", [make_device("g", attrs={"kind": "gpu", "uuid": "GPU-1"})], driver=D)])
    chain = (("true",), (f"lists.range(100000000).size() > 0 && device.attributes['{D}'].uuid == 'absent'",))
    with always_indexed():
        match = SelectorMatcher(inv).match(chain)
    assert match.error is not None and "actual cost limit exceeded" in match.error.message
