"""quota.values.work: a claim's budget inside its review's; the message names the one that ran out."""

from __future__ import annotations

import pytest

from quota.values.work import CLAIM_COST_BUDGET, REVIEW_COST_BUDGET, Budget, BudgetExceeded, drop, paced, pausing


def test_a_claim_is_stopped_by_its_own_budget() -> None:
    review = Budget.review()
    claim = Budget.claim(review)
    claim.spend(CLAIM_COST_BUDGET)
    with pytest.raises(BudgetExceeded, match=f"per-claim budget of {CLAIM_COST_BUDGET:,} CEL cost units"):
        claim.spend(1)
    assert review.spent == CLAIM_COST_BUDGET + 1


def test_claims_of_one_review_share_its_budget() -> None:
    """A Workload's templates: each within a claim's budget, together past the review's."""
    review = Budget.review()
    for _ in range(REVIEW_COST_BUDGET // CLAIM_COST_BUDGET):
        Budget.claim(review).spend(CLAIM_COST_BUDGET)
    with pytest.raises(BudgetExceeded, match=f"per-review budget of {REVIEW_COST_BUDGET:,} CEL cost units") as err:
        Budget.claim(review).spend(1)
    assert "for a Kueue Workload, all its ResourceClaimTemplates" in str(err.value)


def test_work_shared_inside_a_claim_is_charged_once() -> None:
    claim = Budget.claim()
    claim.once("match", 1000)
    claim.once("match", 1000)
    claim.mark("live")
    claim.once("live", 1000)
    assert claim.spent == 1000


@pytest.mark.parametrize("items", [{i: str(i) for i in range(5)}, list(range(5)), set(range(5))])
def test_drop_empties_a_table_an_element_at_a_time(items: dict[int, str] | list[int] | set[int]) -> None:
    """The old caches of a relist are freed in pieces, a pause point between two."""
    sizes: list[int] = []
    with pausing(lambda: sizes.append(len(items))):
        drop(items)
    assert sizes == [4, 3, 2, 1, 0] and not items


def test_paced_pauses_after_every_so_many_items() -> None:
    """A loop over every device (58,000) gives the loop back every `every` items."""
    seen: list[int] = []
    pauses: list[int] = []
    with pausing(lambda: pauses.append(len(seen))):
        for item in paced(range(10), every=4):
            seen.append(item)
    assert seen == list(range(10)) and pauses == [4, 8]
