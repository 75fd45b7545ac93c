"""quota.status.appliedplan: which of a team's copies are written now, and why."""

from __future__ import annotations

from typing import Any

import pytest

from quota.status.appliedplan import Copy, Reason, copy_of, plan


def body(ns: str = "a", *, own: str = "0", reserved: str = "0", headroom: str = "100Gi", generation: int = 1,
         counted: bool = True, exceeded: bool = False, stamp: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:
    return {"metadata": {"name": "t", "namespace": ns, "ownerReferences": [{"uid": "u1"}]},
            "status": {"hard": {"memory": "100Gi"}, "reserved": {"memory": reserved},
                       "headroom": {"memory": headroom}, "exceeded": exceeded, "counted": counted,
                       "teamGeneration": generation, "teamObservedAt": stamp,
                       "namespace": {"name": ns, "reserved": {"memory": own}}}}


def decide(desired: dict[str, dict[str, Any]], have: dict[str, Copy], *, now: float = 10.0,
           flip_allowed: bool = False, max_refresh: int = 100) -> dict[str, Reason]:
    return plan(desired, have, now=now, refresh=60.0, flip_allowed=flip_allowed, max_refresh=max_refresh).writes


def there(**kwargs: Any) -> dict[str, Copy]:
    return {"a": copy_of(body(**kwargs), 0.0), "b": copy_of(body("b"), 0.0)}


def test_a_copy_differing_only_in_when_its_totals_were_read_is_current() -> None:
    assert decide({"a": body(stamp="2026-01-01T01:00:00Z"), "b": body("b")}, there()) == {}


@pytest.mark.parametrize(("change", "written"), [
    ({"own": "10Gi", "reserved": "10Gi", "headroom": "90Gi"}, {"a": "own"}),  # b's totals wait for the period
    ({"reserved": "10Gi", "headroom": "90Gi"}, {}),  # another member's claim: wait
    ({"generation": 2}, {"a": "spec"}),  # an admin's change: at once
    ({"counted": False}, {"a": "spec"}),
])
def test_what_moved_decides_the_reason(change: dict[str, Any], written: dict[str, Reason]) -> None:
    desired = {"a": body(**change), "b": body("b", **{k: v for k, v in change.items() if k != "own"})}
    expected = dict(written)
    if "generation" in change or "counted" in change:
        expected["b"] = "spec"
    assert decide(desired, there()) == expected


def test_a_member_joining_or_leaving_refreshes_every_copy_whose_totals_moved() -> None:
    desired = {"a": body(reserved="10Gi", headroom="90Gi"), "c": body("c", own="10Gi", reserved="10Gi",
                                                                          headroom="90Gi")}
    result = plan(desired, there(), now=10.0, refresh=60.0, flip_allowed=False, max_refresh=100)
    assert result.writes == {"a": "spec", "c": "spec"} and result.deletes == ("b",)


def test_a_flip_refreshes_at_once_only_when_allowed() -> None:
    desired = {"a": body(reserved="100Gi", headroom="0"), "b": body("b", reserved="100Gi", headroom="0")}
    assert decide(desired, there(), flip_allowed=True) == {"a": "refresh", "b": "refresh"}
    waiting = plan(desired, there(), now=10.0, refresh=60.0, flip_allowed=False, max_refresh=100)
    assert (waiting.writes, waiting.flipped, waiting.due) == ({}, False, 60.0)


def test_refreshes_past_the_batch_wait_for_the_next_round_the_longest_stale_first() -> None:
    desired = {ns: body(ns, reserved="10Gi", headroom="90Gi") for ns in "abc"}
    have = {ns: copy_of(body(ns), when) for ns, when in (("a", -5.0), ("b", -50.0), ("c", -20.0))}
    result = plan(desired, have, now=70.0, refresh=60.0, flip_allowed=False, max_refresh=2)
    assert result.writes == {"b": "refresh", "c": "refresh"} and result.due == 70.0
