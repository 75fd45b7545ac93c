"""A priced claim: its charge per request and alternative, and what each quota scope sees.

Neighbours: `quota.pricing.pricer.Pricer` builds these values; `quota.accounting.ledger` asks
`Pricing.charge_for` per quota and counts the answer; `quota.quotas.scope` says what a quota's
scope is. Immutable: a ledger entry's charges never change after it is counted (the
ledger keeps usage incrementally, so a charge that moved between an add and its removal
would leave usage wrong for ever).

How a quota scope applies (docs/charging.md, "Scoping a quota by class or by device"):
- none: the quota governs accelerators, the devices with a memory (`Device.is_accelerator`):
  each alternative costs its `charge`, priced over only those of its candidates, and a
  request none of whose candidates is one (an RDMA NIC) costs nothing and is not counted;
- by class (`Scope.classes`): an alternative whose class is out of scope costs 0, one in
  scope its `whole` charge, over every candidate (a device without a memory at 0 memory);
- by device (`Scope.devices`, a `DeviceSelection`): each alternative costs its `Share`
  for that selection, priced over only its candidates the selection selects (for an
  allocated claim: its selected devices). A pricing carries a share only for the
  selections it was priced for (`Pricing.selections`, the namespace's quotas' when it
  was priced); for any other selection an alternative costs what it costs unscoped,
  never less than the truth, until the claim is priced again
  (`Admitter.add_or_update_quota`).
Alternatives then combine as firstAvailable does (`combine`), and requests add up.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import reduce

from quota.quotas.scope import DeviceSelection, Scope
from quota.values.model import ZERO, Charge, DeviceClassName, DeviceKey, Mode, RecordKey

__all__ = ["HeldDevice", "PricedRequest", "Pricing", "Share", "at_least_recorded", "combine"]


def combine(charges: Iterable[Charge], mode: Mode) -> Charge:
    """firstAvailable: per dimension the largest (conservative) or smallest (optimistic)."""
    pick = Charge.max if mode == "conservative" else Charge.min
    return reduce(pick, charges)


@dataclass(frozen=True, slots=True)
class Share:
    """What one alternative of a request costs a quota that selects devices."""

    charge: Charge
    # Some candidate (or allocated device) is selected: such a quota counts the claim.
    touches: bool
    # (alternative, class) when no selected device it could get publishes a memory
    # capacity: charged 0 memory, which `quota.admission.admitter` must not let through a memory limit.
    unpriced: tuple[str, DeviceClassName] | None = None
    # (alternative, class, drivers) when selected devices it could get have no memory
    # (`PricedRequest.unmetered`): charged 0 memory, with a warning.
    unmetered: tuple[str, DeviceClassName, tuple[str, ...]] | None = None

    def times(self, count: int) -> Share:
        return replace(self, charge=self.charge.times(count))


@dataclass(frozen=True, slots=True)
class HeldDevice:
    """One device of an allocation as the exact pricing charged it (0 for adminAccess):
    what pricing the allocation for another selection needs, without the claim."""

    request: str  # the top-level request
    device_class: DeviceClassName
    key: DeviceKey
    charge: Charge
    # A quota with no scope governs it (`Device.is_accelerator`; a device gone from the
    # inventory: its driver is a known accelerator driver, or it was charged memory).
    accelerator: bool = True


@dataclass(frozen=True, slots=True)
class PricedRequest:
    """One request of a claim: its candidates now and its charge (unscoped: over the
    accelerators among its candidates)."""

    name: str
    candidates: int
    charge: Charge
    # (class, charge) per alternative: one for `exactly`, one per firstAvailable subrequest.
    alternatives: tuple[tuple[DeviceClassName, Charge], ...]
    mode: Mode = "conservative"
    # (alternative name, class) of alternatives whose memory no known device tells:
    # charged 0 memory, which `quota.admission.admitter` must not let through a memory limit.
    unpriced: tuple[tuple[str, DeviceClassName], ...] = ()
    # Per selection priced for, each alternative's share (in `alternatives`' order).
    shares: tuple[tuple[DeviceSelection, tuple[Share, ...]], ...] = ()
    # Per alternative, its charge over every candidate, those without a memory included
    # (what a quota scoped by class counts); empty: the same as `alternatives`.
    whole: tuple[Charge, ...] = ()
    # (alternative, class, drivers) of alternatives that could get devices without a
    # memory (an RDMA NIC): a quota whose scope names them charges them 0 memory, warning.
    unmetered: tuple[tuple[str, DeviceClassName, tuple[str, ...]], ...] = ()
    # Some alternative could get an accelerator: a quota with no scope counts the claim.
    governed: bool = True

    def shares_for(self, selection: DeviceSelection) -> tuple[Share, ...] | None:
        """Each alternative's share for `selection`; None when not priced for it."""
        if selection.everything:
            return None
        return next((shares for priced, shares in self.shares if priced == selection), None)

    def scoped(self, scope: Scope) -> Charge:
        """The charge a quota of `scope` (not everything) sees: alternatives of other
        classes cost 0, the others their share (their whole charge where no share was
        priced)."""
        shares = self.shares_for(scope.devices)
        whole = self.whole or tuple(c for _, c in self.alternatives)
        return combine((ZERO if not scope.admits_class(cls) else whole[i] if shares is None else shares[i].charge
                        for i, (cls, _) in enumerate(self.alternatives)), self.mode)

    def touches(self, scope: Scope) -> bool:
        """Whether a quota of `scope` counts the claim among its `claims`."""
        shares = self.shares_for(scope.devices)
        return any(scope.admits_class(cls) and (shares is None or shares[i].touches)
                   for i, (cls, _) in enumerate(self.alternatives))

    def unpriced_in(self, scope: Scope) -> tuple[tuple[str, DeviceClassName], ...]:
        """The alternatives a quota of `scope` would charge 0 memory for want of a price."""
        shares = self.shares_for(scope.devices)
        found = self.unpriced if shares is None else tuple(s.unpriced for s in shares if s.unpriced is not None)
        return tuple(u for u in found if scope.admits_class(u[1]))

    def unmetered_in(self, scope: Scope) -> tuple[tuple[str, DeviceClassName, tuple[str, ...]], ...]:
        """The alternatives a quota of `scope` counts devices without a memory for (0
        memory each): none for a quota with no scope, which does not govern them."""
        if scope.everything:
            return ()
        shares = self.shares_for(scope.devices)
        if shares is None:
            return tuple(u for u in self.unmetered if scope.admits_class(u[1]))
        return tuple(s.unmetered for s in shares if s.unmetered is not None and scope.admits_class(s.unmetered[1]))

    def times(self, count: int) -> PricedRequest:
        """`count` copies of this request as one (a Workload's Pods each stamping the claim).

        Exact for every quota scope: `scoped` combines the alternatives per dimension by
        max or min, which commutes with multiplying every alternative by the same count.
        """
        return replace(self, charge=self.charge.times(count),
                       alternatives=tuple((cls, c.times(count)) for cls, c in self.alternatives),
                       shares=tuple((sel, tuple(s.times(count) for s in shares)) for sel, shares in self.shares),
                       whole=tuple(c.times(count) for c in self.whole))


@dataclass(frozen=True, slots=True)
class Pricing:
    requests: tuple[PricedRequest, ...]
    exact: bool = False
    warnings: tuple[str, ...] = ()
    # Reasons the claim cannot be priced or allocated as written (unknown class, CEL errors).
    errors: tuple[str, ...] = ()
    # Pricing stopped at a budget (`quota.values.work`): `errors` holds its message, nothing else.
    over_budget: bool = False
    # Exact pricings: what `draquota.io/allocated-charge` should say (`Pricer.allocation_record`),
    # found in the same pass over the allocation, so an allocation event prices its devices once.
    record: tuple[tuple[RecordKey, int], ...] = ()
    # The selections its requests were priced for (`PricedRequest.shares`).
    selections: frozenset[DeviceSelection] = frozenset()
    # Exact pricings: each allocated device's charge (`Pricer.rescoped` reprices from it).
    held: tuple[HeldDevice, ...] = ()
    # Read from a deallocated claim's allocation record (`Pricer.recorded`), not priced from
    # an allocation this process saw: the record may be rewritten (`quota.admission.annotating`).
    from_record: bool = False

    @property
    def total(self) -> Charge:
        requests = self.requests
        if len(requests) == 1:  # most claims: asked per quota per claim on every relist
            return requests[0].charge
        return sum((r.charge for r in requests), ZERO)

    def charge_for(self, scope: Scope) -> Charge:
        """The charge a quota of `scope` sees."""
        if scope.everything:
            return self.total
        return sum((r.scoped(scope) for r in self.requests), ZERO)

    def in_scope(self, scope: Scope) -> bool:
        """Whether a quota of `scope` counts this claim among its `claims`: with no scope,
        some request could get an accelerator (a claim for NICs alone is not counted);
        else some alternative of some request is of its classes and, for a quota
        selecting devices, has a selected candidate (or device)."""
        if scope.everything:
            return not self.requests or any(r.governed for r in self.requests)
        return any(r.touches(scope) for r in self.requests)

    def priced_for(self, selection: DeviceSelection) -> bool:
        return selection.everything or selection in self.selections


def at_least_recorded(pricing: Pricing, recorded: Charge | None) -> Pricing:
    """An unallocated claim's estimate, raised to the charge recorded at its admission.

    The estimate follows the inventory: the largest candidate gone, a replica that
    prices the claim again (it started after the admission) would reserve less than the
    replicas that admitted it still do, and `reserved` would depend on whether the
    leader restarted. The recorded charge (`draquota.io/charge`, written by the leader
    once the claim exists, refused to anyone else) is what was reserved. Never below the
    estimate, so an annotation we never wrote (a claim from before the install) cannot
    lower a claim's charge. Only for claims of one device class: the
    annotation is a total, with no split between classes for quotas scoped to some.
    Raised, a claim loses its shares: a quota selecting devices sees the raised total too.
    """
    classes = {cls for r in pricing.requests for cls, _ in r.alternatives}
    if recorded is None or len(classes) != 1 or not pricing.requests:
        return pricing
    charge = pricing.total.max(recorded)
    if charge == pricing.total:
        return pricing
    (cls,) = classes
    names = ",".join(r.name for r in pricing.requests)
    unpriced = tuple(u for r in pricing.requests for u in r.unpriced)
    whole = sum((r.scoped(Scope(frozenset({cls}))) for r in pricing.requests), ZERO).max(recorded)
    raised = PricedRequest(names, sum(r.candidates for r in pricing.requests), charge, ((cls, charge),),
                           pricing.requests[0].mode, unpriced, whole=(whole,),
                           unmetered=tuple(u for r in pricing.requests for u in r.unmetered),
                           governed=any(r.governed for r in pricing.requests))
    return replace(pricing, requests=(raised,))
