"""Counting the claims that exist: the ledger entries of stored, allocated and repriced claims.

Neighbours: `quota.admission.admitter.Admitter` (a `Counting`) decides admissions on top of this;
the claim and quota caches (`kube.claimstore`, `kube.caches`) and the stored-claim refiner
(`controllers.refine`) count through these methods; `quota.pricing.pricer` prices. Pure and
synchronous. A claim that exists is counted, never checked: refusing it now would
change nothing.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, replace
from typing import NamedTuple

from quota.accounting.ledger import Ledger, QuotaKey
from quota.accounting.ledgerentry import ClaimRef, Entry
from quota.objects.claims import Claim
from quota.objects.claimspec import ClaimSpec
from quota.pricing.priced import Pricing, at_least_recorded
from quota.pricing.pricer import Pricer
from quota.quotas.devicequota import DeviceQuota
from quota.quotas.scope import DeviceSelection
from quota.values.lru import LRU
from quota.values.model import DeviceClass, Mode, Namespace
from quota.values.work import Budget

__all__ = ["MAX_PRICED_SELECTIONS", "MEMO_SIZE", "MEMO_SPEC_BYTES", "Counting", "Priced", "Repriced", "claim_ref",
           "object_ref"]

# Distinct `spec.devices` a claim is priced for, per namespace: each prices every request
# once more (`quota.pricing.pricer`). Past it (sorted), a quota's selection sees a claim's
# unscoped charge of its classes: more than the truth, never less.
MAX_PRICED_SELECTIONS = 8
# Distinct estimates kept (`Counting._estimate`), least recently used out first: a
# template's claims share one; a tenant making every spec distinct only misses.
MEMO_SIZE = 1024
# Only estimates of specs at most this large (`_spec_size`) are kept: the key holds the
# spec, and a mutating admission sees a create before the API server validates it, so a
# spec may be as large as the request (3 MiB: 32 requests of 8 subrequests, 32 selectors
# of 10 KiB or 16 tolerations each); 1,024 of those would be gigabytes. A template's
# claims are far below it.
MEMO_SPEC_BYTES = 16 * 1024
# What an alternative weighs beyond its text (its objects, its priced shares).
_ALTERNATIVE_BYTES = 512


class Priced(NamedTuple):
    """What a claim of a namespace is priced for now, its memo key, and whether pricing it
    evaluates no CEL: memoised, or every part of it cached (`Pricer.known`)."""

    selections: tuple[DeviceSelection, ...]
    modes: list[Mode]
    key: Hashable
    known: bool
    memoised: bool  # known, and in the memo: pricing it costs the same however large it is
    named: tuple[DeviceClass | None, ...] = ()  # the classes its spec names, as they are now


@dataclass(frozen=True, slots=True)
class Repriced:
    """What counting a DeviceQuota changed (`Admitter.add_or_update_quota`, `price_for`):
    the quotas whose usage may have moved (the ledger's keys), and the unallocated claims
    still to price for its devices, each with the entry that counts it meanwhile."""

    keys: tuple[QuotaKey, ...] = ()
    stale: tuple[tuple[Claim, Entry], ...] = ()


def claim_ref(claim: Claim) -> ClaimRef:
    """The ledger key of a parsed claim (see `object_ref`; the same, inline: several a
    claim a list brings)."""
    return ClaimRef(claim.uid or f"{claim.namespace}/{claim.name}")


def object_ref(*, uid: str, namespace: str, name: str) -> ClaimRef:
    """The ledger key of a claim: its uid, else namespace/name.

    A stored claim has the uid the API server generated for it, and names are reused: a
    late DELETE of an old claim must not erase the entry of a new claim of the same name.
    The mutating admission sees no uid yet and puts its token's key in the uid's place
    (`webhook.claimadmit`). Files read by `dra-quota check` carry no uids: there
    namespace/name is the identity.
    """
    return ClaimRef(uid or f"{namespace}/{name}")


class Counting:
    """The pricer and the ledger, and how the claims that exist are counted in it."""

    def __init__(self, pricer: Pricer, ledger: Ledger) -> None:
        self.pricer = pricer
        self.ledger = ledger
        # `_estimate`'s memo: its key -> every mode's pricing and the claim budget it spent.
        self._memo: LRU[Hashable, tuple[dict[Mode, Pricing], int]] = LRU(MEMO_SIZE)
        # `bound_entry`'s pricings by what they are a function of (`_bound_key`), shared
        # by the entries of every claim with that key: most stored claims share a
        # template's spec, so at start 111,300 bounds were a few hundred distinct values.
        self._bounds: LRU[Hashable, tuple[tuple[DeviceClass | None, ...], Mapping[Mode, Pricing]]] = LRU(MEMO_SIZE)
        # `_existing`'s pricings by their identities (`_shared`).
        self._pricings: LRU[tuple[tuple[Mode, int], ...], Mapping[Mode, Pricing]] = LRU(MEMO_SIZE)
        # `_priced_as` per namespace, at `_views_at` of the ledger's quotas.
        self._views: dict[Namespace, tuple[tuple[DeviceSelection, ...], tuple[Mode, ...]]] = {}
        self._views_at = -1
        # `_known`'s answers by memo key, at `_known_at` of the pricer's cache.
        self._known_keys: dict[Hashable, bool] = {}
        self._known_at = -1

    def allocated_entry(self, claim: Claim) -> Entry:
        """What `account_allocated` counts: the exact charge of the allocated devices."""
        pricing = self.pricer.exact(claim, selections=self._selections(claim.namespace))
        return Entry(claim.namespace, claim_ref(claim), {self.ledger.default_mode: pricing}, allocated=True,
                     owner=claim.owner)

    def deallocated_entry(self, allocated: Entry) -> Entry:
        """A claim whose allocation the watch saw go, counted at what that allocation
        (`allocated`, the ledger's entry from the watch) charged, among the pending claims:
        not at its reservation again. The room an allocation below its reservation freed
        may have been admitted to another claim meanwhile; counted at its reservation
        again, the claim's next allocation would be "within what it holds", unchecked, and
        could take that room twice (`used` above `hard`). So a reallocation is checked
        for what it adds to the last allocation (`Ledger.allocate`), and a claim is always
        free to get back what it had. Its pricing keeps the devices: a quota selecting
        other devices reprices it from them (`price_for`), with no tenant CEL."""
        return replace(allocated, allocated=False)

    def recorded_since(self, held: Entry, claim: Claim) -> Entry | None:
        """What replaces `held`, the ledger's unallocated entry of `claim`, on an unallocated
        copy: the last allocation its record says (`recorded_allocation`) where `held` is
        a reservation (this watch missed the allocation: a relist after it and the
        deallocation) or was read from another record (the leader rewrote it:
        `quota.admission.annotating`). None: `held` stays (the last allocation this process saw
        itself, or no record to read)."""
        pricing = held.pricing.get(self.ledger.default_mode)
        if pricing is not None and pricing.exact and \
                (not pricing.from_record or dict(pricing.record) == dict(claim.recorded_devices)):
            return None
        return self.recorded_allocation(claim)

    def recorded_allocation(self, claim: Claim) -> Entry | None:
        """`deallocated_entry` for a claim whose allocation this process never saw (it
        started after the deallocation): its last allocation from the record the leader
        wrote on it (`Pricer.recorded`). None where there is none to read: the claim then
        counts its reservation (`existing_entry`)."""
        if claim.allocation is not None or not claim.recorded_devices:
            return None  # `Pricer.recorded`'s own first test, before the namespace's selections
        pricing = self.pricer.recorded(claim, selections=self._selections(claim.namespace))
        if pricing is None:
            return None
        return Entry(claim.namespace, claim_ref(claim), {self.ledger.default_mode: pricing}, allocated=False,
                     owner=claim.owner)

    def reserve_existing(self, claim: Claim, *, budget: Budget | None = None) -> tuple[QuotaKey, ...]:
        """Count an unallocated claim that already exists, without a check: one admitted
        before this process started, or deallocated. Refusing it now would change nothing.
        The quotas whose usage it moved (`Ledger.add_or_update_claim`)."""
        return self.ledger.add_or_update_claim(self.existing_entry(claim, budget=budget))

    def existing_entry(self, claim: Claim, *, budget: Budget | None = None) -> Entry:
        """What `reserve_existing` counts: the estimate in every mode, in the default mode
        at no less than the charge recorded at its admission (`quota.pricing.priced.at_least_recorded`:
        a restart must not re-price what was reserved). A mode whose pricing ran out of
        budget keeps the upper bound: an existing claim is never counted at less."""
        return self._existing(claim, self._estimate(claim, budget))

    def existing_entry_if_priced(self, claim: Claim) -> Entry | None:
        """`existing_entry` where that evaluates no CEL (`Priced.known`), else None: what a
        claim event counts before ready (`kube.claimstore`), with one lookup of the memo."""
        priced = self._priced(claim)
        if not priced.known:
            return None
        return self._existing(claim, self._estimate(claim, None, priced))

    def _existing(self, claim: Claim, pricings: dict[Mode, Pricing]) -> Entry:
        for mode, pricing in pricings.items():
            if pricing.over_budget:
                pricings[mode] = self.pricer.upper_bound(claim.spec)
        mode = self.ledger.default_mode
        pricings[mode] = at_least_recorded(pricings[mode], claim.recorded_charge)
        return Entry(claim.namespace, claim_ref(claim), self._shared(pricings), allocated=False, owner=claim.owner,
                     claim=claim)

    def _shared(self, pricings: dict[Mode, Pricing]) -> Mapping[Mode, Pricing]:
        """One mapping for the entries priced alike (the memo answers every claim of a spec
        with the same pricings: a copy each was 25 MiB at 150,000 claims), never mutated.
        Keyed by the pricings' identities: a kept mapping holds them, so no other object
        can take their ids while it is kept. Bounded, least recently used out first."""
        key = tuple((mode, id(p)) for mode, p in pricings.items())
        if (found := self._pricings.lookup(key)) is not None:
            return found
        self._pricings.store(key, pricings)
        return pricings

    def add_or_update_quota(self, quota: DeviceQuota) -> Repriced:
        """Count `quota` (`Ledger.add_or_update_quota`), and price the namespace's claims
        for its `spec.devices` where no quota there selected those devices before.

        Allocated claims are priced again at once, from their devices (no tenant CEL:
        `Pricer.rescoped`). Unallocated ones are returned (`Repriced.stale`), each with the
        entry that counts it meanwhile (its unscoped charge: more than the truth, never
        less): the caller prices them as stored claims (`controllers.refine`, budgeted) or
        with `reserve_existing`. Only a selection new to the namespace costs a pass over
        its claims: a quota's status writes come back as updates of an unchanged spec.
        """
        if quota.cluster:
            return self._add_or_update_team(quota)
        before = self._selections(quota.namespace)
        keys = self.ledger.add_or_update_quota(quota)
        selection = quota.scope.devices
        if selection.everything or selection in before:
            return Repriced(keys)
        repriced = self.price_for(quota.namespace, selection)
        return Repriced(tuple(dict.fromkeys((*keys, *repriced.keys))), repriced.stale)

    def _add_or_update_team(self, quota: DeviceQuota) -> Repriced:
        """A ClusterDeviceQuota: its members' claims priced for its `spec.devices` when its
        scope or selector changed (`price_for` passes over what is priced already)."""
        old = self.ledger.quota(quota.namespace, quota.name)
        keys = self.ledger.add_or_update_quota(quota)
        unchanged = old is not None and (old.scope, old.selector) == (quota.scope, quota.selector)
        if quota.scope.devices.everything or unchanged:
            return Repriced(keys)
        return self._price_members(keys, [(ns, quota.scope.devices) for ns in self.ledger.members(quota.name)])

    def set_namespace(self, namespace: Namespace, labels: Mapping[str, str]) -> Repriced:
        """A Namespace's labels (`Ledger.set_namespace`): the teams it joined or left, and
        its claims priced for the `spec.devices` of the teams it joined."""
        keys = self.ledger.set_namespace(namespace, labels)
        joined = [(namespace, q.scope.devices) for q in self.ledger.quotas(namespace)
                  if (q.namespace, q.name) in keys and not q.scope.devices.everything]
        return self._price_members(keys, joined)

    def _price_members(self, keys: tuple[QuotaKey, ...], todo: list[tuple[Namespace, DeviceSelection]]) -> Repriced:
        found: dict[QuotaKey, None] = dict.fromkeys(keys)
        stale: list[tuple[Claim, Entry]] = []
        for namespace, selection in todo:
            repriced = self.price_for(namespace, selection)
            found.update(dict.fromkeys(repriced.keys))
            stale.extend(repriced.stale)
        return Repriced(tuple(found), tuple(stale))

    def selections(self, namespace: Namespace) -> tuple[DeviceSelection, ...]:
        """The device selections claims of `namespace` are priced for (`add_or_update_quota`)."""
        return self._selections(namespace)

    def price_for(self, namespace: Namespace, selection: DeviceSelection) -> Repriced:
        """`add_or_update_quota`'s pass over the namespace's claims for a `selection` new
        to it: allocated claims priced again at once, unallocated ones returned (also after
        a relist built while the selection arrived: `kube.claimstore.ClaimStore.replace`)."""
        selections = self._selections(namespace)
        if selection not in selections:
            return Repriced()
        keys: dict[QuotaKey, None] = {}
        stale: list[tuple[Claim, Entry]] = []
        for entry in list(self.ledger.entries_in(namespace)):
            if all(p.priced_for(selection) for p in entry.pricing.values()):
                continue
            if all(p.exact for p in entry.pricing.values()):  # allocated, or deallocated (`deallocated_entry`)
                rescoped = {mode: self.pricer.rescoped(p, selections) for mode, p in entry.pricing.items()}
                # Pricing may pause (a sliced relist): a claim deleted or changed meanwhile
                # must not come back as it was.
                if self.ledger.entry(entry.ref) is entry:
                    keys.update(dict.fromkeys(self.ledger.add_or_update_claim(replace(entry, pricing=rescoped))))
            elif entry.claim is not None:
                stale.append((entry.claim, entry))
        return Repriced(tuple(keys), tuple(stale))

    def _priced(self, claim: Claim) -> Priced:
        selections, priced_modes = self._priced_as(claim.namespace)
        modes = list(priced_modes)
        named = self._named_classes(claim)
        key = self._memo_key(claim, selections, modes, named)
        memoised = key in self._memo
        return Priced(selections, modes, key, memoised or self._known(claim, selections, modes, key), memoised, named)

    def _known(self, claim: Claim, selections: tuple[DeviceSelection, ...], modes: list[Mode], key: Hashable) -> bool:
        """`Pricer.known` in every mode, by the claim's memo key: a function of what the key
        is (its spec, selections, modes, classes and the inventory's generation) and of the
        requirements the pricer has cached, so kept until that cache takes another entry
        (`Pricer.cache_changes`). A list's stored claims ask it once each (111,300 at
        start, a few hundred keys, none priced until after ready)."""
        if self._known_at != self.pricer.cache_changes:
            self._known_keys.clear()
            self._known_at = self.pricer.cache_changes
        if (found := self._known_keys.get(key)) is not None:
            return found
        known = all(self.pricer.known(claim.spec, mode, selections) for mode in modes)
        if len(self._known_keys) < MEMO_SIZE and _spec_size(claim.spec, MEMO_SPEC_BYTES) <= MEMO_SPEC_BYTES:
            self._known_keys[key] = known
        return known

    def stored_entry(self, claim: Claim) -> tuple[Entry, bool]:
        """`existing_entry_if_priced`, else `bound_entry` (True: to price later), from one
        look at what the claim is priced for: what a list counts for each stored claim
        this process never counted (150,000 at start)."""
        priced = self._priced(claim)
        if priced.known:
            return self._existing(claim, self._estimate(claim, None, priced)), False
        return Entry(claim.namespace, claim_ref(claim), self._bound(claim, priced.named), allocated=False,
                     owner=claim.owner, claim=claim), True

    def bound_entry(self, claim: Claim) -> Entry:
        """An existing claim at its upper bound (`Pricer.upper_bound`), never below its
        recorded charge: what a replica counts for a stored claim until it has priced it
        (`controllers.refine`), so that it is ready at once and never counts less than the truth."""
        return Entry(claim.namespace, claim_ref(claim), self._bound(claim, self._named_classes(claim)), allocated=False,
                     owner=claim.owner, claim=claim)

    def _bound(self, claim: Claim, named: tuple[DeviceClass | None, ...]) -> Mapping[Mode, Pricing]:
        """`bound_entry`'s pricing in every mode, one mapping shared by the claims of one
        `_bound_key` (never mutated: `Entry.pricing` is read only). Bounded as `_memo` is:
        least recently used out first, specs past `MEMO_SPEC_BYTES` never kept, so a
        tenant making every spec distinct only misses."""
        key = self._bound_key(claim, named)
        if (found := self._bounds.lookup(key)) is not None:
            return found[1]
        bound = at_least_recorded(self.pricer.upper_bound(claim.spec), claim.recorded_charge)
        pricings = dict.fromkeys(self._modes(claim.namespace), bound)
        # The class's devices are matched to price it, which may pause (`runtime.slicing`):
        # kept only if what it is a function of did not change meanwhile (the classes by
        # identity, as in `_estimate`).
        after = self._named_classes(claim)
        if self._bound_key(claim, after) == key and all(a is b for a, b in zip(named, after, strict=True)) \
                and _spec_size(claim.spec, MEMO_SPEC_BYTES) <= MEMO_SPEC_BYTES:
            self._bounds.store(key, (named, pricings))
        return pricings

    def _bound_key(self, claim: Claim, named: tuple[DeviceClass | None, ...]) -> Hashable:
        """What `Pricer.upper_bound` and `at_least_recorded` are functions of: the spec, the
        classes it names (`named`, by identity: hashing a class is slow, and a kept bound
        holds its classes, so no other object can take their ids while it is kept), the
        inventory's generation; and the modes it is counted in and the charge recorded at
        its admission."""
        return (claim.spec, tuple(map(id, named)), self.pricer.inventory.generation,
                self._priced_as(claim.namespace)[1], claim.recorded_charge)

    def _estimate(self, claim: Claim, review: Budget | None, priced: Priced | None = None) -> dict[Mode, Pricing]:
        """Every mode under one claim budget: the modes share their matches.

        Memoised by content (`_memo_key`): a claim is priced at its admission and again
        at its watch event, and the claims a template stamps share one spec; each
        pricing's requests were still looked up, built and charged anew (4-5 % of
        `serve`'s busy time in bench/floor.py's one-write mode). A hit charges the claim
        budget what computing it did (a claim's spending is the sum of its distinct
        matches: the same for the same key), and only where that fits, so a review's
        budget and every denial for it read as before; an estimate that ran out of
        budget is not kept."""
        budget = Budget.claim(review)
        priced = priced if priced is not None else self._priced(claim)
        selections, modes, key = priced.selections, priced.modes, priced.key
        if (found := self._memo.lookup(key)) is not None and found[1] <= budget.remaining:
            budget.spend(found[1])
            return dict(found[0])
        named = self._named_classes(claim)
        pricings = {mode: self.pricer.estimate(claim.spec, mode=mode, budget=budget, selections=selections)
                    for mode in modes}
        # Pricing may pause (`runtime.slicing`): kept only if no slice or class changed
        # meanwhile. The classes by identity too: one changed and changed back while it
        # paused compares equal, though a part of this estimate saw the other spec.
        after = self._named_classes(claim)
        if (not any(p.over_budget for p in pricings.values()) and self._memo_key(claim, selections, modes, after) == key
                and all(a is b for a, b in zip(named, after, strict=True))
                and _spec_size(claim.spec, MEMO_SPEC_BYTES) <= MEMO_SPEC_BYTES):
            self._memo.store(key, (pricings.copy(), budget.spent))
        return pricings

    def _memo_key(self, claim: Claim, selections: tuple[DeviceSelection, ...], modes: list[Mode],
                  named: tuple[DeviceClass | None, ...] | None = None) -> Hashable:
        """What an estimate is a function of (`quota.pricing.pricer`: no clock, no I/O): the spec,
        the selections and modes it is priced for, the inventory's generation and the
        classes it names as they are now (`named`, if the caller has them: a DeviceClass
        changed or gone is another key)."""
        return (claim.spec, selections, tuple(modes), self.pricer.inventory.generation,
                named if named is not None else self._named_classes(claim))

    def _named_classes(self, claim: Claim) -> tuple[DeviceClass | None, ...]:
        classes = self.pricer.classes
        return tuple(classes.get(alt.device_class) for req in claim.spec.requests for alt in req.alternatives)

    def _selections(self, namespace: Namespace) -> tuple[DeviceSelection, ...]:
        """The distinct `spec.devices` of the namespace's quotas a claim there is priced
        for, in a stable order, at most `MAX_PRICED_SELECTIONS`."""
        return self._priced_as(namespace)[0]

    def _modes(self, namespace: Namespace) -> list[Mode]:
        return list(self._priced_as(namespace)[1])

    def _priced_as(self, namespace: Namespace) -> tuple[tuple[DeviceSelection, ...], tuple[Mode, ...]]:
        """`_selections` and the modes a claim of `namespace` is priced in, derived from its
        quotas once per change of the ledger's quotas (`Ledger.quotas_generation`): asked
        several times for every claim a list brings (150,000 at start)."""
        if self._views_at != self.ledger.quotas_generation:
            self._views.clear()
            self._views_at = self.ledger.quotas_generation
        if (found := self._views.get(namespace)) is not None:
            return found
        quotas = self.ledger.quotas(namespace)
        selections = {q.scope.devices for q in quotas if not q.scope.devices.everything}
        modes: set[Mode] = {self.ledger.default_mode}
        modes.update(q.mode for q in quotas if q.mode is not None)
        found = self._views[namespace] = (tuple(sorted(selections, key=DeviceSelection.sort_key))[:MAX_PRICED_SELECTIONS],
                                          tuple(sorted(modes)))
        return found


def _spec_size(spec: ClaimSpec, limit: int) -> int:
    """About how many bytes `spec` holds (its text, and `_ALTERNATIVE_BYTES` an
    alternative), counted until past `limit`."""
    size = 0
    for request in spec.requests:
        for alt in request.alternatives:
            size += (_ALTERNATIVE_BYTES + len(alt.name) + len(alt.device_class) + sum(map(len, alt.selectors))
                     + sum(len(name) for name, _ in alt.capacity_requests)
                     + sum(len(t.key) + len(t.value) for t in alt.tolerations))
            if size > limit:
                return size
    return size
