"""The charge of a claim: estimated before its allocation, exact from it.

Neighbours: `quota.devices.selectors` finds candidates, `quota.pricing.capacity` prices one device,
`quota.pricing.counters` sums candidates per node within their shared counters (All, and
ExactCount over partitionable devices), `quota.pricing.allocated` prices an allocated claim (`Pricer.exact`),
`quota.quotas.devicequota` compares charges with limits. The rules are docs/design.md's "The
charge of a claim"; like the in-tree evaluator (pkg/quota/v1/evaluator/core/
resource_claims.go) the result depends only on the claim, the inventory and the
classes: no clock, no I/O. `Pricer` only adds caches keyed on the inventory generation.

Every estimate spends a claim `Budget` (`quota.values.work`): its request selectors' compile
charge and the matches they need, cached ones at what they cost. Out of budget, the
claim is not priced: its `Pricing.errors` carry the budget's message, and admission
denies it with that message.

Quotas that select devices (`quota.quotas.scope.DeviceSelection`, a DeviceQuota's
`spec.devices`): the caller names the selections of the claim's namespace, and each
alternative is priced once more per selection, by the same rules over only the
candidates it selects (`_price_selected`): its selectors run as one more stage of the
same match, after the class's and the request's, so their verdicts are cached and
charged to the claim's budget like a class's. The values (`Share`, `Pricing`) and how a
quota reads them are `quota.pricing.priced`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import reduce
from typing import TypeVar

from quota.devices.inventory import Inventory
from quota.devices.selectors import DeviceGroup, Match, SelectorMatcher
from quota.objects.claims import Claim
from quota.objects.claimspec import ClaimSpec, DeviceRequirement, Request, unnamed
from quota.pricing.allocated import AllocatedPricer
from quota.pricing.capacity import (
    accelerators,
    eligible,
    memoryless_drivers,
    nominal_memory_charge,
    unpriced_accelerators,
)
from quota.pricing.counters import all_mode, count_memory, per_scope
from quota.pricing.priced import PricedRequest, Pricing, Share, combine
from quota.quotas.scope import DeviceSelection
from quota.values.lru import LRU
from quota.values.model import ZERO, Charge, DeviceClass, DeviceClassName, DeviceKey, Mode, RecordKey
from quota.values.quantity import ceil_int, format_quantity
from quota.values.work import COMPILE_UNITS_PER_BYTE, Budget, BudgetExceeded

__all__ = ["Pricer"]


@dataclass(frozen=True, slots=True)
class _Estimate:
    candidates: int
    charge: Charge  # over the accelerators among the candidates (`quota.pricing.priced`)
    warnings: tuple[str, ...] = ()
    error: str | None = None
    unpriced: bool = False
    # The matches it took, (key, cost): what a claim that finds it cached is charged.
    matches: tuple[tuple[object, int], ...] = ()
    # Over every candidate, devices without a memory at 0 memory (None: `charge`).
    whole: Charge | None = None
    # Drivers of candidates without a memory that are no accelerators (an RDMA NIC).
    unmetered: tuple[str, ...] = ()
    # Some candidate (or, with none, some device of the class) is an accelerator.
    governed: bool = True


@dataclass(frozen=True, slots=True)
class _Selected:
    """One requirement priced over the candidates a `DeviceSelection` selects (`Share`)."""

    charge: Charge
    touches: bool
    unpriced: bool = False
    warnings: tuple[str, ...] = ()
    matches: tuple[tuple[object, int], ...] = ()
    unmetered: tuple[str, ...] = ()


_Cached = TypeVar("_Cached", _Estimate, _Selected)


class Pricer:
    """Prices claims against one inventory and a live map of DeviceClasses."""

    def __init__(
        self,
        inventory: Inventory,
        classes: Mapping[DeviceClassName, DeviceClass],
        *,
        matcher: SelectorMatcher | None = None,
        cache_size: int = 4096,
    ) -> None:
        self.inventory = inventory
        self.classes = classes
        self.matcher = matcher or SelectorMatcher(inventory)
        self._cache: LRU[object, _Estimate | _Selected] = LRU(cache_size)
        # Counts the entries `_cache` took: what `known` answers can change only when it does.
        self.cache_changes = 0
        self._bounds: LRU[object, Charge] = LRU(cache_size)
        self._allocated = AllocatedPricer(inventory, classes, self.matcher)

    # -- unallocated claims: an estimate -------------------------------------------

    def estimate(self, spec: ClaimSpec, *, mode: Mode = "conservative", budget: Budget | None = None,
                 selections: Sequence[DeviceSelection] = ()) -> Pricing:
        """The claim's estimate; `budget` is the claim's (shared by its pricing modes), a
        claim budget of its own when None. Each request is also priced for each of
        `selections` (the namespace's quotas' `spec.devices`, `quota.pricing.priced`), within
        the same budget: a selection's selectors run on the candidates once more."""
        budget = budget if budget is not None else Budget.claim()
        requests: list[PricedRequest] = []
        warnings: list[str] = []
        errors: list[str] = []
        try:
            for request in spec.requests:
                priced, req_warnings, req_errors = self._request(request, mode, budget, selections)
                requests.append(priced)
                warnings.extend(req_warnings)
                errors.extend(req_errors)
        except BudgetExceeded as exceeded:
            return Pricing((), False, tuple(warnings), (str(exceeded),), over_budget=True)
        return Pricing(tuple(requests), False, tuple(dict.fromkeys(warnings)), tuple(errors),
                       selections=frozenset(selections))

    def _request(self, request: Request, mode: Mode, budget: Budget,
                 selections: Sequence[DeviceSelection]) -> tuple[PricedRequest, list[str], list[str]]:
        alternatives: list[tuple[DeviceClassName, Charge]] = []
        warnings: list[str] = []
        errors: list[str] = []
        chosen: int | None = None
        counts: list[int] = []
        unpriced: list[tuple[str, DeviceClassName]] = []
        unmetered: list[tuple[str, DeviceClassName, tuple[str, ...]]] = []
        estimates: list[_Estimate] = []
        for alt in request.alternatives:
            est = self._requirement(alt, mode, budget)
            estimates.append(est)
            if est.unpriced:
                unpriced.append((alt.name, alt.device_class))
            if est.unmetered:
                unmetered.append((alt.name, alt.device_class, est.unmetered))
            counts.append(est.candidates)  # the same in both modes
            alternatives.append((alt.device_class, est.charge))
            warnings.extend(f"request {alt.name}: {w}" for w in est.warnings)
            if est.error is not None:
                errors.append(f"request {alt.name}: {est.error}")
            # Report the candidates of the alternative the scheduler would try to take.
            if chosen is None and est.candidates >= max(alt.count, 1):
                chosen = est.candidates
        candidates = chosen if chosen is not None else max(counts, default=0)
        charge = combine((c for _, c in alternatives), mode)
        shares = []
        for selection in selections:
            per_alternative = []
            for alt, est in zip(request.alternatives, estimates, strict=True):
                selected = self._selected(alt, mode, budget, selection, est)
                per_alternative.append(Share(selected.charge, selected.touches,
                                             (alt.name, alt.device_class) if selected.unpriced else None,
                                             (alt.name, alt.device_class, selected.unmetered)
                                             if selected.unmetered else None))
                warnings.extend(f"request {alt.name}: {w}" for w in selected.warnings)
            shares.append((selection, tuple(per_alternative)))
        whole = tuple(est.charge if est.whole is None else est.whole for est in estimates)
        priced = PricedRequest(request.name, candidates, charge, tuple(alternatives), mode, tuple(unpriced),
                               tuple(shares), whole if whole != tuple(c for _, c in alternatives) else (),
                               tuple(unmetered), any(est.governed for est in estimates))
        return priced, warnings, errors

    def _requirement(self, req: DeviceRequirement, mode: Mode, budget: Budget) -> _Estimate:
        for expression in req.selectors:
            budget.once(("compile", expression), len(expression.encode("utf-8", "replace")) * COMPILE_UNITS_PER_BYTE)
        cls = self.classes.get(req.device_class)
        if cls is None:
            return _Estimate(0, Charge(0, 0 if req.admin_access else req.count), (), (
                f"device class {req.device_class!r} not found: fix deviceClassName (kubectl get deviceclasses "
                "lists them), or ask the cluster admin to create the DeviceClass"
            ))
        return self._lookup(self._key(req, cls, mode), budget, lambda: self._price(req, cls, mode, budget))

    def _lookup(self, key: object, budget: Budget, compute: Callable[[], _Cached]) -> _Cached:
        """The cached value for `key`, charging `budget` the matches it took; else computed."""
        cached = self._cache.lookup(key)
        if cached is None:
            value = compute()
            self._cache.store(key, value)
            self.cache_changes += 1
            return value
        for match_key, cost in cached.matches:
            budget.once(match_key, cost)
        return cached  # type: ignore[return-value]  # keys of one kind hold values of one kind

    def _key(self, req: DeviceRequirement, cls: DeviceClass, mode: Mode) -> object:
        # The request's own name only shapes messages: leave it out of the cache key.
        return (unnamed(req), cls.selectors, mode, self.inventory.generation)

    def known(self, spec: ClaimSpec, mode: Mode, selections: Sequence[DeviceSelection] = ()) -> bool:
        """Whether `estimate` would find every requirement of `spec` priced already (at
        this inventory generation), for each of `selections` too: then it evaluates no
        CEL and takes microseconds."""
        return all(cls is None or (key := self._key(alt, cls, mode)) in self._cache
                   and all((key, selection) in self._cache for selection in selections)
                   for request in spec.requests for alt in request.alternatives
                   for cls in [self.classes.get(alt.device_class)])

    def _price(self, req: DeviceRequirement, cls: DeviceClass, mode: Mode, budget: Budget) -> _Estimate:
        match = self.matcher.match((cls.selectors, req.selectors), [n for n, _ in req.capacity_requests], budget)
        spent = ((match.key, match.cost),)
        if match.error is not None:
            where = f"class {cls.name}" if match.error.stage == 0 else "selector"
            kind = "CEL compile error" if match.error.compile_error else "CEL runtime error"
            return _Estimate(0, ZERO, (), f"{where} #{match.error.index}: {kind}: {match.error.message}", matches=spent)
        priced = eligible(match.groups, req)
        count = sum(n for _, n, _ in priced)
        if req.admin_access:
            # adminAccess devices stay usable by others: they cost nothing (docs/design.md, "The charge of a claim").
            return _Estimate(count, ZERO, matches=spent)
        if count == 0:
            return self._no_candidate(req, cls, mode, budget, spent)
        # A quota with no scope governs the accelerators among the candidates; one that
        # names the request's class or the devices' driver, every candidate (`quota.pricing.priced`).
        governed = accelerators(priced)
        whole, warnings = self._candidates_charge(req, priced, count, mode)
        charge = whole if len(governed) == len(priced) else (
            self._candidates_charge(req, governed, sum(n for _, n, _ in governed), mode)[0] if governed else ZERO)
        return _Estimate(count, charge, warnings, unpriced=unpriced_accelerators(g for _, _, g in governed),
                         matches=spent, whole=whole, unmetered=memoryless_drivers(g for _, _, g in priced),
                         governed=bool(governed))

    def _candidates_charge(self, req: DeviceRequirement, priced: list[tuple[int, int, DeviceGroup]], count: int,
                           mode: Mode) -> tuple[Charge, tuple[str, ...]]:
        """What a request with candidates costs (docs/charging.md): All per node, within the
        nodes' counters; ExactCount `count` devices at the largest (Optimistic: smallest)
        per-device charge, capped by the most `count` devices can take together on one node."""
        if req.allocation_mode == "All":
            return all_mode(priced, self.inventory, mode)
        if mode == "optimistic" or count < req.count:
            per_device = (max if mode == "conservative" else min)(c for c, _, _ in priced)
            short = (f"only {count} device(s) match now, {req.count} requested",) if count < req.count else ()
            return Charge(per_device * req.count, req.count), short
        memory, warnings = count_memory(priced, req.count, self.inventory)
        return Charge(memory, req.count), warnings

    def _no_candidate(self, req: DeviceRequirement, cls: DeviceClass, mode: Mode, budget: Budget,
                      spent: tuple[tuple[object, int], ...]) -> _Estimate:
        """Price at the class's largest per-device charge so the claim cannot slip in for free.

        Per device, the charge this request would have on it (docs/design.md): a whole device,
        or on a shared one the request's memory rounded by the policy, or the policy
        default when it asks for none, not the shared device's whole memory.
        """
        class_match = self.matcher.match((cls.selectors,), (), budget)
        priced = [(nominal_memory_charge(g.representative, req), len(g.devices), g) for g in class_match.groups]
        whole = self._class_charge(priced, req)
        governed = accelerators(priced)
        # A class with no device at all cannot tell what its devices will be: unpriced,
        # and governed by every quota (docs/charging.md, "No free claims").
        charge = whole if len(governed) == len(priced) else self._class_charge(governed, req) if governed else ZERO
        largest = max((c for c, _, _ in governed or priced), default=0)
        return _Estimate(0, charge, (
            f"no device matches now; charged as {charge.devices or whole.devices} device(s) at the largest "
            f"per-device charge in class {cls.name} ({format_quantity(largest)} each)",
        ), unpriced=not priced or unpriced_accelerators(g for _, _, g in governed),
            matches=(*spent, (class_match.key, class_match.cost)), whole=whole,
            unmetered=memoryless_drivers(g for _, _, g in priced), governed=bool(governed) or not priced)

    def _class_charge(self, priced: list[tuple[int, int, DeviceGroup]], req: DeviceRequirement) -> Charge:
        """The no-candidate rule over these devices of the class: `count` devices at the
        largest per-device charge (All: `all_mode`, within the nodes' counters)."""
        if req.allocation_mode == "All":
            return all_mode(priced, self.inventory)[0]
        return Charge(max((c for c, _, _ in priced), default=0) * req.count, req.count)

    # -- unallocated claims, for a quota that selects devices ----------------------------

    def _selected(self, req: DeviceRequirement, mode: Mode, budget: Budget, selection: DeviceSelection,
                  est: _Estimate) -> _Selected:
        cls = self.classes.get(req.device_class)
        if cls is None or est.error is not None:
            # Denied at admission; where such a claim exists anyway, it counts whole.
            return _Selected(est.charge if est.whole is None else est.whole, True, est.unpriced)
        return self._lookup((self._key(req, cls, mode), selection), budget,
                            lambda: self._price_selected(req, cls, mode, budget, selection, est.candidates))

    def _price_selected(self, req: DeviceRequirement, cls: DeviceClass, mode: Mode, budget: Budget,
                        selection: DeviceSelection, candidates: int) -> _Selected:
        """The rules of `_price`, over only the candidates `selection` selects: none
        selected costs 0; none at all (the no-candidate rule) the largest per-device charge
        among the class's selected devices."""
        spent: list[tuple[object, int]] = []
        if candidates == 0 and not req.admin_access:
            return self._no_candidate_selected(req, cls, budget, selection, spent)
        _, groups, warnings = self._narrowed((cls.selectors, req.selectors), [n for n, _ in req.capacity_requests],
                                             selection, budget, spent)
        priced = eligible(groups, req)
        count = sum(n for _, n, _ in priced)
        if req.admin_access or count == 0:
            return _Selected(ZERO, count > 0, False, warnings, tuple(spent))
        charge, _ = self._candidates_charge(req, priced, count, mode)
        groups = [g for _, _, g in priced]
        return _Selected(charge, True, unpriced_accelerators(groups), warnings, tuple(spent),
                         memoryless_drivers(groups))

    def _no_candidate_selected(self, req: DeviceRequirement, cls: DeviceClass, budget: Budget,
                               selection: DeviceSelection, spent: list[tuple[object, int]]) -> _Selected:
        """`_no_candidate` over the class's selected devices. A class with devices, none
        selected, costs 0; a class with no devices at all cannot tell what a device would
        be, and costs what it costs unscoped (and is unpriced for memory)."""
        whole, groups, warnings = self._narrowed((cls.selectors,), (), selection, budget, spent)
        if whole.groups and not groups:
            return _Selected(ZERO, False, False, warnings, tuple(spent))
        priced = [(nominal_memory_charge(g.representative, req), len(g.devices), g) for g in groups]
        charge = self._class_charge(priced, req)
        return _Selected(charge, True, not groups or unpriced_accelerators(groups), warnings, tuple(spent),
                         memoryless_drivers(groups))

    def _narrowed(self, chain: tuple[tuple[str, ...], ...], capacity_names: Sequence[str], selection: DeviceSelection,
                  budget: Budget, spent: list[tuple[object, int]]) -> tuple[Match, list[DeviceGroup], tuple[str, ...]]:
        """The match of `chain`, and its groups `selection` selects: its selectors as one
        more stage (seeing only the devices the chain kept, so their verdicts are cached
        like a class's), then its drivers. A selector that cannot be evaluated on some
        candidate selects every candidate, with a warning: never less than the truth."""
        whole = self.matcher.match(chain, capacity_names, budget)
        spent.append((whole.key, whole.cost))
        groups = whole.groups
        warnings: tuple[str, ...] = ()
        if selection.expressions and whole.error is None:
            narrowed = self.matcher.match((*chain, selection.stage), capacity_names, budget)
            spent.append((narrowed.key, narrowed.cost))
            if narrowed.error is None:
                groups = narrowed.groups
            else:
                index = narrowed.error.index - (len(selection.stage) - len(selection.expressions))  # the guard's
                warnings = (f"a DeviceQuota's spec.devices.selectors[{max(index, 0)}] cannot be evaluated "
                            f"({narrowed.error.message}): every candidate of its drivers counts toward that quota",)
        return whole, [g for g in groups if selection.admits_driver(g.representative.driver)], warnings

    # -- stored claims not priced yet: an upper bound ----------------------------------

    def upper_bound(self, spec: ClaimSpec) -> Pricing:
        """At least what `estimate` charges in any mode, computed without the claim's own
        selectors (no tenant CEL: microseconds a claim, from the classes' cached matches).

        Per alternative: `count` devices at the largest per-device charge among its
        class's devices (each device's whole memory, or what the request would take of a
        shared one, whichever is larger), All mode the largest per-node sum over the
        class's devices; firstAvailable the largest alternative per dimension; adminAccess
        nothing, as the estimate. Every candidate is one of the class's devices and every
        per-device charge is at most that, so no mode's estimate is above it.
        """
        requests = []
        for request in spec.requests:
            alternatives = tuple((alt.device_class, self._bound(alt)) for alt in request.alternatives)
            requests.append(PricedRequest(request.name, 0, combine((c for _, c in alternatives), "conservative"),
                                          alternatives))
        return Pricing(tuple(requests))

    def _bound(self, req: DeviceRequirement) -> Charge:
        if req.admin_access:
            return ZERO
        cls = self.classes.get(req.device_class)
        if cls is None:
            return Charge(0, req.count)  # what the estimate charges an unknown class
        # Selectors aside, requests share their shape: a thousand stored claims, one bound.
        key = (unnamed(req, selectors=()), cls.selectors, self.inventory.generation)
        found = self._bounds.lookup(key)
        if found is None:
            found = self._class_bound(req, cls)
            self._bounds.store(key, found)
        return found

    def _class_bound(self, req: DeviceRequirement, cls: DeviceClass) -> Charge:
        groups = self.matcher.match((cls.selectors,)).groups
        priced = [(max(ceil_int(g.representative.memory), nominal_memory_charge(g.representative, req)),
                   len(g.devices), g) for g in groups]
        if req.allocation_mode == "All":
            # Per dimension: the estimate's node (the largest memory sum of its
            # candidates) may have more devices than the node with the most memory.
            return reduce(Charge.max, per_scope(priced).charges.values(), ZERO)
        return Charge(max((c for c, _, _ in priced), default=0) * req.count, req.count)

    # -- allocated claims: exact (`quota.pricing.allocated`) -------------------------------

    def exact(self, claim: Claim, *, selections: Sequence[DeviceSelection] = ()) -> Pricing:
        """`AllocatedPricer.exact`: the charge from `status.allocation`."""
        return self._allocated.exact(claim, selections=selections)

    def recorded(self, claim: Claim, *, selections: Sequence[DeviceSelection] = ()) -> Pricing | None:
        """`AllocatedPricer.recorded`: a deallocated claim's last allocation, from its record."""
        return self._allocated.recorded(claim, selections=selections)

    def rescoped(self, pricing: Pricing, selections: Sequence[DeviceSelection]) -> Pricing:
        """`AllocatedPricer.rescoped`: an exact pricing's requests priced for `selections`."""
        return self._allocated.rescoped(pricing, selections)

    def allocation_record(self, claim: Claim) -> dict[RecordKey, int]:
        """`AllocatedPricer.allocation_record`: what the claim's `draquota.io/allocated-charge` should say."""
        return self._allocated.allocation_record(claim)
