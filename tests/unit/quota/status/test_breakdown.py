"""quota.status.breakdown: which namespaces a team exports a series of, and what "(other)" sums."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quota.quotas.devicequota import Usage
from quota.status.breakdown import OTHER, Breakdown, top_parts
from quota.values.model import ZERO, Charge

GiB = 1 << 30


def part(devices: int, memory_gib: int = 0, *, reserved: int = 0, pending: int = 0) -> Usage:
    return Usage(used=Charge(memory_gib * GiB, devices), reserved=Charge(0, reserved),
                 allocated_claims=devices, pending_claims=pending)


def kept(breakdown: Breakdown) -> list[str]:
    return [namespace for namespace, _ in breakdown.kept]


def test_a_team_within_the_cap_exports_every_namespace_and_no_other() -> None:
    parts = [("b", part(1)), ("a", part(0)), ("c", part(3))]
    assert top_parts(parts, 3) == Breakdown((("a", part(0)), ("b", part(1)), ("c", part(3))))


def test_past_the_cap_the_largest_are_kept_by_name_and_other_sums_the_rest() -> None:
    parts = [("a", part(1, 80)), ("b", part(4)), ("c", part(0, reserved=3, pending=3)), ("d", part(2, pending=1)),
             ("e", part(0))]
    breakdown = top_parts(parts, 2)
    assert kept(breakdown) == ["b", "c"]  # 4 used, 3 reserved: used + reserved ranks
    assert breakdown.other == Usage(used=Charge(80 * GiB, 3), reserved=ZERO, allocated_claims=3, pending_claims=1)
    assert breakdown.left_out == 3


@pytest.mark.parametrize(("parts", "expected"), [
    # Equal devices: the larger memory first.
    ([("a", part(1, 10)), ("b", part(1, 80)), ("c", part(1, 40))], ["b", "c"]),
    # Equal devices and memory: the name that sorts first, whatever the order they come in.
    ([("z", part(2)), ("m", part(2)), ("a", part(2))], ["a", "m"]),
    ([("a", part(2)), ("z", part(2)), ("m", part(2))], ["a", "m"]),
    # Nothing used anywhere: the first names.
    ([("c", part(0)), ("b", part(0)), ("a", part(0))], ["a", "b"]),
])
def test_ties(parts: list[tuple[str, Usage]], expected: list[str]) -> None:
    assert kept(top_parts(parts, 2)) == expected


def test_a_namespace_moves_in_and_out_of_the_top_as_its_usage_does() -> None:
    parts = {"a": part(3), "b": part(2), "c": part(1)}
    assert kept(top_parts(list(parts.items()), 2)) == ["a", "b"]
    parts["c"] = part(5)  # c grows past b: b goes into "(other)"
    breakdown = top_parts(list(parts.items()), 2)
    assert kept(breakdown) == ["a", "c"] and breakdown.other == part(2)
    parts["c"] = part(0)  # and shrinks back
    breakdown = top_parts(list(parts.items()), 2)
    assert kept(breakdown) == ["a", "b"] and breakdown.other == part(0)


def test_a_cap_of_zero_sums_every_namespace_into_other() -> None:
    breakdown = top_parts([("a", part(1)), ("b", part(2))], 0)
    assert breakdown.kept == () and breakdown.other == part(3) and breakdown.left_out == 2
    assert OTHER == "(other)"  # not a DNS-1123 label: no namespace can take it


@given(st.lists(st.tuples(st.integers(0, 8), st.integers(0, 640), st.integers(0, 4)), max_size=40),
       st.integers(0, 45))
def test_the_series_are_capped_and_sum_to_the_team(sizes: list[tuple[int, int, int]], limit: int) -> None:
    parts = [(f"ns-{i:02}", part(d, m, reserved=r)) for i, (d, m, r) in enumerate(sizes)]
    breakdown = top_parts(parts, limit)
    assert len(breakdown.kept) == min(limit, len(parts))
    shown = [p for _, p in breakdown.kept] + ([breakdown.other] if breakdown.other is not None else [])
    assert (breakdown.other is None) == (len(parts) <= limit)
    assert sum((p.used for p in shown), ZERO) == sum((p.used for _, p in parts), ZERO)
    assert sum((p.reserved for p in shown), ZERO) == sum((p.reserved for _, p in parts), ZERO)
    # No namespace left out is larger than one kept.
    names = set(kept(breakdown))
    smallest = min(((p.used + p.reserved).devices for n, p in parts if n in names), default=None)
    assert smallest is None or all((p.used + p.reserved).devices <= smallest for n, p in parts if n not in names)
