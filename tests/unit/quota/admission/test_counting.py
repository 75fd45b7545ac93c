"""quota.admission.counting: the estimate memo (`Counting._estimate`) is exact: what it answers is
what pricing again would, after the inventory, a DeviceClass or the namespace's quotas
changed, and a review's budget is charged as if it had priced."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from quota.accounting.ledger import Ledger
from quota.accounting.ledgerentry import ClaimRef, Entry
from quota.admission.admitter import Admission, Admitter
from quota.admission.counting import MEMO_SIZE
from quota.devices.inventory import Inventory
from quota.objects.claims import Claim, parse_claim, parse_device_class
from quota.pricing.priced import at_least_recorded
from quota.pricing.pricer import Pricer
from quota.quotas.devicequota import parse_device_quota
from quota.values.model import Charge, DeviceClassName
from quota.values.work import Budget

from ...builders import GiB, exactly, make_class, make_claim, make_device, make_quota, make_slice, request

D = "gpu.example.com"
H100 = f"device.attributes['{D}'].model == 'h100'"
H200 = f"device.attributes['{D}'].model == 'h200'"


def inventory(h200_memory: str = "141Gi") -> Inventory:
    inv = Inventory()
    inv.add_or_update_slice(make_slice("n1", [make_device(f"h100-{i}", memory="80Gi", attrs={"model": "h100"})
                                              for i in range(2)], node="node-1"))
    inv.add_or_update_slice(h200s(h200_memory))
    return inv


def h200s(memory: str) -> dict[str, Any]:
    return make_slice("n2", [make_device(f"h200-{i}", memory=memory, attrs={"model": "h200"}) for i in range(2)],
                      node="node-2")


def gpu_class(*selectors: str) -> dict[DeviceClassName, Any]:
    cls = parse_device_class(make_class("gpu", f"device.driver == '{D}'", *selectors))
    return {cls.name: cls}


class CountingPricer(Pricer):
    """A Pricer counting the estimates it computes."""

    estimates = 0

    def estimate(self, *args: Any, **kwargs: Any) -> Any:
        self.estimates += 1
        return super().estimate(*args, **kwargs)


def claim(name: str = "c1", *selectors: str, count: int = 1) -> Claim:
    return parse_claim(make_claim(name, request("gpu", exactly("gpu", *selectors, count=count))))


def admitter(inv: Inventory | None = None, classes: dict[DeviceClassName, Any] | None = None) -> Admitter:
    adm = Admitter(CountingPricer(inv or inventory(), classes if classes is not None else gpu_class()), Ledger())
    adm.ledger.add_or_update_quota(parse_device_quota(make_quota("gpus", memory="10000Gi")))
    return adm


def estimates(adm: Admitter) -> int:
    assert isinstance(adm.pricer, CountingPricer)
    return adm.pricer.estimates


def charge(entry: Entry | Admission) -> Charge:
    assert isinstance(entry, Entry)
    return entry.pricing[entry_mode(entry)].total


def entry_mode(entry: Entry) -> Any:
    return next(iter(entry.pricing))


def test_claims_of_one_spec_are_priced_once_and_counted_as_pricing_again_would() -> None:
    adm = admitter()
    first = adm.existing_entry(claim("c1", H100))
    computed = estimates(adm)
    second = adm.existing_entry(claim("c2", H100))
    assert estimates(adm) == computed  # the memo answered
    assert second.pricing == first.pricing == admitter().existing_entry(claim("c2", H100)).pricing
    assert second.ref != first.ref and second.claim is not None and second.claim.name == "c2"
    assert adm.existing_entry_if_priced(claim("c3", H100)) == replace(second, ref=ClaimRef("team-a/c3"),
                                                                        claim=claim("c3", H100))


def test_a_claim_whose_pricing_would_run_cel_is_not_priced_on_its_event() -> None:
    adm = admitter()
    assert adm.existing_entry_if_priced(claim("c1", H100)) is None
    assert estimates(adm) == 0


def test_a_spec_that_differs_is_priced() -> None:
    adm = admitter()
    one = adm.existing_entry(claim("c1", H100))
    two = adm.existing_entry(claim("c2", H100, count=2))
    assert charge(two) == Charge(2 * 80 * GiB, 2) and charge(one) == Charge(80 * GiB, 1)


def test_an_inventory_change_is_priced_again() -> None:
    inv = inventory()
    adm = admitter(inv)
    assert charge(adm.existing_entry(claim("c1", H200))) == Charge(141 * GiB, 1)
    inv.add_or_update_slice(h200s("192Gi"))
    assert charge(adm.existing_entry(claim("c2", H200))) == Charge(192 * GiB, 1)


def test_a_device_class_change_is_priced_again() -> None:
    classes = gpu_class()
    adm = admitter(classes=classes)
    assert charge(adm.existing_entry(claim("c1"))) == Charge(141 * GiB, 1)  # conservative: the largest
    classes.update(gpu_class(H100))  # the class now selects only the H100s
    assert charge(adm.existing_entry(claim("c2"))) == Charge(80 * GiB, 1)
    classes.clear()  # gone: priced as an unknown class
    entry = adm.price_for_admission(claim("c3"), namespace_labels={})
    assert isinstance(entry, Admission) and "device class 'gpu' not found" in entry.reason


def test_a_class_changed_and_changed_back_while_pricing_paused_is_not_kept() -> None:
    # Pricing may pause in slices; an admin's class changed and changed back meanwhile
    # compares equal, but part of the estimate saw the other class: not memoised.
    classes = gpu_class()
    adm = admitter(classes=classes)
    pricer = adm.pricer
    assert isinstance(pricer, CountingPricer)
    original = Pricer.estimate

    def flapping(self: Pricer, *args: Any, **kwargs: Any) -> Any:
        classes.update(gpu_class(H100))
        try:
            return original(self, *args, **kwargs)
        finally:
            classes.update(gpu_class())  # back to a class equal to the first, a new object

    pricer.estimate = flapping.__get__(pricer)  # type: ignore[method-assign]
    assert charge(adm.existing_entry(claim("c1"))) == Charge(80 * GiB, 1)  # priced under the H100-only class
    del pricer.estimate
    assert charge(adm.existing_entry(claim("c2"))) == Charge(141 * GiB, 1)  # priced again, not remembered


def test_a_quota_that_selects_devices_prices_claims_for_it() -> None:
    adm = admitter()
    before = adm.existing_entry(claim("c1"))
    adm.ledger.add_or_update_quota(parse_device_quota(make_quota("h200", memory="1000Gi", selectors=[H200])))
    after = adm.existing_entry(claim("c2"))
    assert all(not p.selections for p in before.pricing.values())
    assert all(p.selections for p in after.pricing.values())
    mode = entry_mode(after)
    assert after.pricing[mode] == admitter_with_h200_quota().existing_entry(claim("c2")).pricing[mode]


def admitter_with_h200_quota() -> Admitter:
    adm = admitter()
    adm.ledger.add_or_update_quota(parse_device_quota(make_quota("h200", memory="1000Gi", selectors=[H200])))
    return adm


def test_a_hit_charges_the_review_budget_what_pricing_did() -> None:
    adm = admitter()
    cold, warm = Budget.review(), Budget.review()
    adm.price_for_admission(claim("c1", H100), namespace_labels={}, budget=cold)
    computed = estimates(adm)
    adm.price_for_admission(claim("c2", H100), namespace_labels={}, budget=warm)
    assert estimates(adm) == computed
    assert warm.spent == cold.spent > 0


@pytest.mark.parametrize("memoised", [False, True])
def test_a_review_without_the_room_is_denied_for_its_budget_memoised_or_not(memoised: bool) -> None:
    adm = admitter()
    spent = Budget.review()
    adm.price_for_admission(claim("c0", H100), namespace_labels={}, budget=spent)
    if not memoised:
        adm = admitter()
    review = Budget.review()
    review.spent = review.limit - spent.spent + 1  # one unit short of what the claim costs
    entry = adm.price_for_admission(claim("c1", H100), namespace_labels={}, budget=review)
    assert isinstance(entry, Admission) and not entry.allowed and "per-review budget" in entry.reason


def test_a_large_spec_is_priced_again_not_kept() -> None:
    # The memo's key holds the spec, so its memory is bounded by entries only where
    # specs are small. A mutating webhook sees a create before the API server validates it,
    # so a tenant's dry runs could each leave ~2.6 MiB here (32 requests of 8 subrequests,
    # one 10 KiB selector each, a class that does not exist: priced without evaluating CEL,
    # denied, and kept), 1,024 of them.
    big = f"device.attributes['{D}'].model == '{'x' * 9000}'"
    adm = admitter()
    adm.existing_entry(claim("c1", big, big))
    computed = estimates(adm)
    adm.existing_entry(claim("c2", big, big))
    assert estimates(adm) > computed
    small = admitter()
    small.existing_entry(claim("c1", H100))
    computed = estimates(small)
    small.existing_entry(claim("c2", H100))
    assert estimates(small) == computed


def unmemoised_bound(adm: Admitter, c: Claim) -> Entry:
    """`bound_entry` as it was computed before it was shared: from `upper_bound` each time."""
    bound = at_least_recorded(adm.pricer.upper_bound(c.spec), c.recorded_charge)
    return Entry(c.namespace, ClaimRef(c.uid or f"{c.namespace}/{c.name}"), dict.fromkeys(adm._modes(c.namespace), bound),
                 allocated=False, owner=c.owner, claim=c)


def test_stored_claims_of_one_spec_share_one_bound_equal_to_computing_it() -> None:
    adm = admitter()
    first, second = adm.bound_entry(claim("c1", H100)), adm.bound_entry(claim("c2", H100))
    assert second.pricing is first.pricing  # one mapping for both, not a copy each
    assert first == unmemoised_bound(adm, claim("c1", H100)) and second == unmemoised_bound(adm, claim("c2", H100))
    # Another count, a recorded charge above the bound, another pricing mode: another bound.
    assert adm.bound_entry(claim("c3", H100, count=2)).pricing[entry_mode(first)].total == Charge(2 * 141 * GiB, 2)
    recorded = replace(claim("c4", H100), recorded_charge=Charge(500 * GiB, 1))
    assert adm.bound_entry(recorded) == unmemoised_bound(adm, recorded)
    assert adm.bound_entry(recorded).pricing[entry_mode(first)].total == Charge(500 * GiB, 1)
    adm.ledger.add_or_update_quota(parse_device_quota(make_quota("opt", memory="1Ti", pricing="Optimistic")))
    both = adm.bound_entry(claim("c5", H100))
    assert set(both.pricing) == {"conservative", "optimistic"} and both == unmemoised_bound(adm, claim("c5", H100))


def test_a_bound_follows_the_inventory_and_the_classes() -> None:
    inv, classes = inventory(), gpu_class()
    adm = admitter(inv, classes)
    assert charge(adm.bound_entry(claim("c1"))) == Charge(141 * GiB, 1)
    inv.add_or_update_slice(h200s("192Gi"))
    assert charge(adm.bound_entry(claim("c2"))) == Charge(192 * GiB, 1)
    classes.update(gpu_class(H100))
    assert charge(adm.bound_entry(claim("c3"))) == Charge(80 * GiB, 1)


def test_the_shared_bounds_stay_bounded_whatever_specs_tenants_write() -> None:
    adm = admitter()
    for i in range(MEMO_SIZE + 50):
        adm.bound_entry(claim(f"c{i}", f"{H100} && {i} >= 0"))
    assert len(adm._bounds) == MEMO_SIZE
    big = f"device.attributes['{D}'].model == '{'x' * 9000}'"
    adm.bound_entry(claim("big", big, big))
    kept: list[Any] = [key[0] for key in adm._bounds]  # type: ignore[index]  # (spec, ...) tuples
    assert all(big not in alt.selectors for spec in kept for req in spec.requests for alt in req.alternatives)


def test_a_stored_claim_is_priced_once_its_requirement_is_cached_whatever_was_asked_before() -> None:
    """`known` is kept per memo key only until the pricer caches a requirement: a claim of
    one spec counted at its bound is priced by lookup once another spec's pricing (the
    same requirement under another request name) cached what it needs."""
    adm = admitter()
    assert adm.stored_entry(claim("c1", H100))[1] is True
    other = parse_claim(make_claim("o", request("other", exactly("gpu", H100))))
    adm.existing_entry(other)  # its requirement priced and cached; not the claims' memo key
    entry, bound = adm.stored_entry(claim("c2", H100))
    assert not bound and charge(entry) == charge(adm.existing_entry(claim("c3", H100)))


def test_stored_claims_priced_alike_share_one_mapping_and_it_stays_bounded() -> None:
    adm = admitter()
    first, second = adm.existing_entry(claim("c1", H100)), adm.existing_entry(claim("c2", H100))
    assert second.pricing is first.pricing and first.pricing == admitter().existing_entry(claim("c1", H100)).pricing
    raised = adm.existing_entry(replace(claim("c3", H100), recorded_charge=Charge(500 * GiB, 1)))
    assert raised.pricing is not first.pricing and charge(raised) == Charge(500 * GiB, 1)
    for i in range(MEMO_SIZE + 20):
        adm.existing_entry(claim(f"d{i}", f"{H100} && {i} >= 0"))
    assert len(adm._pricings) == MEMO_SIZE


def test_a_stored_claim_is_priced_when_that_is_a_lookup_else_counted_at_its_bound() -> None:
    adm = admitter()
    assert adm.stored_entry(claim("c1", H100)) == (adm.bound_entry(claim("c1", H100)), True)
    assert estimates(adm) == 0  # no CEL on a list
    priced = adm.existing_entry(claim("c2", H100))
    entry, bound = adm.stored_entry(claim("c3", H100))
    assert not bound and entry == adm.existing_entry_if_priced(claim("c3", H100)) and entry.pricing is priced.pricing
