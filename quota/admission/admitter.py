"""Admission decisions for claims and templates, shared by the webhook and `check`.

Neighbours: `quota.pricing.pricer` prices; `quota.admission.counting` counts the claims that exist and
`quota.admission.annotating` says what our annotations on them should be (`Admitter` is both);
the webhook (webhook/) and the offline checker
(`quota.reports.check`) are thin adapters over `Admitter`, so both price exactly the same way
and check with the same rule (`quota.quotas.devicequota.check`): the checker against this
ledger (`quota.accounting.ledger` checks and reserves), the webhook against the reservations
persisted on DeviceQuota status (`quota.accounting.reservations`). Pure and synchronous.

Every method that prices takes the `budget` of the review it serves (`quota.values.work`; a
review of its own when None) and prices each claim under a claim budget inside it: a
claim that exceeds either is denied with the budget's message, like any claim that
cannot be priced.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from quota.accounting.ledgerentry import ClaimRef, Entry
from quota.admission.annotating import Annotating
from quota.admission.counting import MAX_PRICED_SELECTIONS, Priced, Repriced, claim_ref, object_ref
from quota.admission.explain import conservative_note
from quota.admission.memoryless import unmetered_warning, unpriced_message
from quota.objects.claims import Claim
from quota.pricing.priced import PricedRequest, Pricing
from quota.quotas.devicequota import RESOURCES, Decision, DeviceQuota, QuotaCheck, Usage, check, format_resource
from quota.values.model import Charge, Device, DeviceClassName, Mode, Namespace
from quota.values.validation import MAX_INT64
from quota.values.work import Budget

# MAX_PRICED_SELECTIONS, Repriced, claim_ref and object_ref live in `quota.admission.counting`;
# importable from here as before.
__all__ = ["ADMIN_ACCESS_LABEL", "ADMIN_ACCESS_MESSAGE", "MAX_PRICED_SELECTIONS", "Admission", "Admitter", "Allocation",
           "Fit", "Repriced", "charged_above", "claim_ref", "object_ref"]

# TYPES: DRAAdminNamespaceLabelKey; the value must be exactly "true" (pkg/registry/resource/utils.go).
ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"
ADMIN_ACCESS_MESSAGE = (
    "admin access to devices requires the `resource.kubernetes.io/admin-access: true` label "
    "on the containing namespace"
)


@dataclass(frozen=True, slots=True)
class Admission:
    allowed: bool
    reason: str
    warnings: tuple[str, ...]
    pricing: Pricing
    charged_quotas: tuple[str, ...] = ()
    # The quotas whose `hard` denied it (empty for any other denial: adminAccess, pricing).
    denied_by: tuple[str, ...] = ()
    # The quotas whose `hard` it exceeds, admitted with a warning (Audit enforcement, or
    # the allocation check in account-only mode).
    warned_by: tuple[str, ...] = ()
    # An allocation charged above the claim's `draquota.io/charge`: what `charged_above` says.
    charged_above: str = ""

    @property
    def charge(self) -> Charge:
        return self.pricing.total


@dataclass(frozen=True, slots=True)
class Allocation:
    """An allocation priced (`Admitter.price_allocation`)."""

    own: Claim  # the claim, carrying what it was admitted at (`Admitter._own_record`)
    pricing: Pricing  # its exact charge
    entry: Entry  # the ledger's entry for it, allocated
    # What the reviewed copy reserves (`Admitter._reserved`; None: nothing this ledger knows).
    held: Entry | None = None
    # What a replica counts the reviewed copy at from its allocation record
    # (`Counting.recorded_allocation`; None: no record it can read).
    recorded: Entry | None = None


def _joined(persisted: Decision | None, local: Decision) -> Decision:
    """The persisted decision (allowed) and the ledger's on the other quotas, as one."""
    if persisted is None:
        return local
    return replace(local, warnings=(*persisted.warnings, *local.warnings),
                   charged=(*persisted.charged, *local.charged), warned_by=(*persisted.warned_by, *local.warned_by))


@dataclass(frozen=True, slots=True)
class Fit:
    """`Admitter.fit`: a claim checked against empty usage (`never`) and today's (`now`)."""

    pricing: Pricing
    never: Decision
    now: Decision
    warnings: tuple[str, ...]  # pricing's, memory no device prices (Audit), Audit excesses of `never`


def charged_above(claim: Claim, exact: Charge) -> str:
    """Why `claim`'s allocation charges more than it was admitted at, "" if it does not.

    Compared with `claim.recorded_charge` (`Admitter.allocate_claim` puts there what the
    ledger reserved for it, else the `draquota.io/charge` it carries), per dimension:
    more memory or more devices. A claim with neither (created before the install) has
    nothing to compare with. Usually an Optimistic estimate (the scheduler picked a
    larger device than the smallest candidate) or a device whose published memory grew
    between admission and allocation.
    """
    recorded = claim.recorded_charge
    if recorded is None:
        return ""
    above = [r for r in RESOURCES if exact.amount(r) > recorded.amount(r)]
    if not above:
        return ""

    def fmt(charge: Charge) -> str:
        return ",".join(format_resource(r, charge.amount(r)) for r in RESOURCES)

    return (f"ResourceClaim {claim.namespace}/{claim.name}: the allocated devices charge {fmt(exact)}, more than "
            f"the {fmt(recorded)} it was admitted at")


class Admitter(Annotating):
    """Admission decisions for claims, templates and Workloads, over what `Counting`
    counts; the annotations they are due (`Annotating`)."""

    def admit_claim(
        self, claim: Claim, *, namespace_labels: Mapping[str, str] | None, dry_run: bool = False,
        budget: Budget | None = None,
    ) -> Admission:
        """CREATE of an unallocated claim in `dra-quota check`: price, check every quota,
        reserve in this ledger if it fits (the webhook persists its reservations instead:
        `price_for_admission`, `charges`)."""
        entry = self._priced_entry(claim, namespace_labels, budget)
        if isinstance(entry, Admission):
            return entry
        pricing = entry.pricing[self.ledger.default_mode]
        decision = self.ledger.admit(entry, dry_run=dry_run)
        warnings = (*self.pricing_warnings(claim, pricing), *decision.warnings)
        message = self.explained(claim, decision.message, decision.denied_by)
        return Admission(decision.allowed, message, warnings, pricing, decision.charged, decision.denied_by,
                         decision.warned_by)

    def admit_template(self, claim: Claim, *, namespace_labels: Mapping[str, str] | None,
                       budget: Budget | None = None) -> Admission:
        """A template reserves nothing: denied only if its claim could never fit under `hard`."""
        fit = self.fit(claim, namespace_labels=namespace_labels, budget=budget)
        if isinstance(fit, Admission):
            return fit
        if not fit.never.allowed:
            message = self.explained(claim, fit.never.message, fit.never.denied_by)
            return Admission(False, f"a claim from this template can never fit: {message}",
                             fit.pricing.warnings, fit.pricing, denied_by=fit.never.denied_by)
        warnings = fit.warnings
        if not fit.now.allowed:
            warnings = (*warnings, f"claims from this template do not fit now: {fit.now.message}")
        return Admission(True, "", warnings, fit.pricing, fit.now.charged if fit.now.allowed else (),
                         warned_by=fit.never.warned_by)

    def fit(self, claim: Claim, *, namespace_labels: Mapping[str, str] | None,
            budget: Budget | None = None) -> Fit | Admission:
        """How a claim that does not exist yet would fare; reserves nothing.

        An `Admission` (a denial) when it could not be admitted at all (adminAccess label,
        pricing errors, memory no device prices), else whether it could ever fit under
        `hard` and whether it fits what the namespace uses and reserves now.
        """
        entry = self._priced_entry(claim, namespace_labels, budget)
        if isinstance(entry, Admission):
            return entry
        pricing = entry.pricing[self.ledger.default_mode]
        quotas = self.ledger.quotas(claim.namespace)
        charges = [entry.charge_for(q, self.ledger.default_mode) for q in quotas]
        checked = [self.ledger.in_force(q) for q in quotas]  # the limits in force now (`quota.quotas.windows`)
        never = check([QuotaCheck(q, Usage(), c) for q, c in zip(checked, charges)], namespace=claim.namespace)
        now = check([QuotaCheck(q, self.ledger.usage(q.namespace, q.name), c) for q, c in zip(checked, charges)],
                    namespace=claim.namespace)
        warnings = (*pricing.warnings, *self._unpriced(claim, pricing)[1], *never.warnings)
        return Fit(pricing, never, now, warnings)

    def explained(self, claim: Claim, message: str, denied_by: Sequence[str]) -> str:
        """A quota denial's `message` with why the claim costs that much, when Conservative
        pricing is why (`quota.admission.explain`); other messages unchanged."""
        if not denied_by:
            return message
        quotas = [q for q in self.ledger.quotas(claim.namespace) if q.ref in denied_by]
        note = conservative_note(self.pricer, claim, quotas, self.ledger.default_mode)
        return f"{message}. {note}" if note else message

    def _priced_entry(self, claim: Claim, labels: Mapping[str, str] | None, budget: Budget | None,
                      priced: Priced | None = None) -> Entry | Admission:
        """The claim priced in every mode its namespace's quotas use, or a denial."""
        pricings = self._estimate(claim, budget, priced)
        pricing = pricings[self.ledger.default_mode]
        if claim.admin_access and (labels or {}).get(ADMIN_ACCESS_LABEL) != "true":
            return Admission(False, ADMIN_ACCESS_MESSAGE, pricing.warnings, pricing)
        if pricing.errors:
            return Admission(False, "; ".join(pricing.errors), pricing.warnings, pricing)
        denials, _ = self._unpriced(claim, pricing)
        if denials:
            return Admission(False, "; ".join(denials), pricing.warnings, pricing)
        return Entry(claim.namespace, claim_ref(claim), pricings, allocated=False, owner=claim.owner, claim=claim)

    def _unpriced(self, claim: Claim, pricing: Pricing) -> tuple[list[str], list[str]]:
        """Denials (Enforce) and warnings (Audit) for memory no known device can price,
        and warnings for devices without a memory that a quota's scope counts.

        A request that could get accelerators whose memory nothing tells (no `memory`
        capacity, no memory source applies), or whose class has no devices at all, is
        charged 0 memory: under a quota that limits memory that would make it free,
        however many are made. So no price is no admission (docs/design.md, "The charge
        of a claim"; docs/charging.md, "No free claims"). Devices that are no
        accelerators (an RDMA NIC) are outside a quota with no scope; one whose scope
        names them charges them 0 memory, and says so (`quota.admission.memoryless`).
        """
        denials: list[str] = []
        warnings: list[str] = []
        for quota in self.ledger.quotas(claim.namespace):
            if quota.hard.memory is None:
                continue
            for request in pricing.requests:
                for alternative, cls in request.unpriced_in(quota.scope):
                    message = unpriced_message(quota, alternative, cls, self._class_devices(cls))
                    if quota.enforcement == "Audit":
                        warnings.append(f"{message} (enforcement: Audit, admitted)")
                    else:
                        denials.append(message)
                warnings.extend(unmetered_warning(quota, alternative, cls, drivers)
                                for alternative, cls, drivers in request.unmetered_in(quota.scope))
        return denials, list(dict.fromkeys(warnings))

    def _class_devices(self, name: DeviceClassName) -> list[Device]:
        """One device of each group of class `name` (what a denial names; the class's
        selectors only, cached: no tenant CEL)."""
        cls = self.pricer.classes.get(name)
        if cls is None:
            return []
        return [g.representative for g in self.pricer.matcher.match((cls.selectors,)).groups]

    def account_allocated(self, claim: Claim) -> Admission:
        """An allocated claim is existing state: charged exactly to `used`, never denied."""
        entry = self.allocated_entry(claim)
        pricing = entry.pricing[self.ledger.default_mode]
        self.ledger.add_or_update_claim(entry)
        charged = tuple(
            q.name for q in self.ledger.quotas(claim.namespace)
            if not entry.charge_for(q, self.ledger.default_mode).is_zero()
        )
        return Admission(True, "", pricing.warnings, pricing, charged)

    def allocate_claim(self, claim: Claim, *, enforce: bool, dry_run: bool = False) -> Admission:
        """The `status` update that sets an allocation, decided from this ledger alone
        (`dra-quota check`; the webhook persists the excess first: `price_allocation`,
        `excess_to_persist`, `allocated`)."""
        return self.allocated(self.price_allocation(claim), enforce=enforce, dry_run=dry_run)

    def price_allocation(self, claim: Claim) -> Allocation:
        """The exact charge of `claim`'s allocation, and what it was admitted at."""
        held = self._reserved(claim)
        own = self._own_record(claim, held)
        pricing = self.pricer.exact(own, selections=self._selections(claim.namespace))
        entry = Entry(claim.namespace, claim_ref(claim), {self.ledger.default_mode: pricing}, allocated=True,
                      owner=claim.owner)
        # The reviewed copy's record, read as on that (unallocated) copy: `Pricer.recorded`
        # reads none on an allocated claim.
        recorded = self.recorded_allocation(replace(claim, allocation=None))
        return Allocation(own, pricing, entry, held, recorded)

    def _reserved(self, claim: Claim) -> Entry | None:
        """What the reviewed copy of `claim` holds: the ledger's entry for it (its
        reservation, or its last allocation once deallocated: `deallocated_entry`), unless
        that entry is an allocation. The review's old object is unallocated, so this
        replica's claim watch has not brought the deallocation yet. The replicas whose
        watch has count the last allocation, as this one does; a replica that started
        after the deallocation never saw that allocation: it counts what the claim's
        allocation record says (`Allocation.recorded`), else the reservation
        (`existing_entry`, returned here). `excess_to_persist` measures the excess over
        the smallest of these and the ledger's entry, so every kind of replica counts the
        whole exact charge."""
        held = self.ledger.entry(claim_ref(claim))
        if held is None or not held.allocated:
            return held
        return self.existing_entry(claim)

    def excess_to_persist(self, allocation: Allocation, *, history_known: bool = True) -> dict[DeviceQuota, Charge]:
        """Per Enforce quota, the allocation's excess over what its claim holds, where it
        touches a resource the quota limits: what the webhook reserves in that quota's
        persisted record before allowing it (`quota.accounting.excess`). Empty in the common case
        (within the reservation): no write. Audit quotas only warn, from this ledger.

        `history_known` False: this replica cannot vouch for what the claim's last
        allocation charged (`kube.claimstore.ClaimStore.history_known`: a list brought it
        unallocated, and its record may be missing or stale, the tenant can make the
        leader's write of it fail). Another replica may count it at that smaller last
        charge and have admitted claims into the room it freed, so the whole allocation
        is persisted and checked against the quota's total less the claim's own count
        here (`quota.accounting.reservations.Request.own`): fail closed, and a claim that was never
        allocated still fits where its reservation did."""
        entry = allocation.entry
        # Over the least of what the reviewed copy reserves (what the replicas holding that
        # copy count), what this ledger holds (a stale allocation: what this replica counts
        # until its watch moves) and what the copy's record says (what a replica that
        # started since counts, and one whose watch saw the last allocation: this ledger's
        # history may be older, its watch having missed a whole allocation), so each counts
        # the whole exact charge.
        overs = [allocation.held, self.ledger.entry(entry.ref)]  # None: nothing held, all of it is excess
        if not history_known:
            overs.append(None)
        if allocation.recorded is not None:
            overs.append(allocation.recorded)
        excess = self.ledger.excess(entry, over=overs)
        return {q: c for q, c in excess.items()
                if q.enforcement != "Audit" and any(c.amount(r) > 0 and q.hard.get(r) is not None for r in RESOURCES)}

    def allocated(self, allocation: Allocation, *, enforce: bool, dry_run: bool = False,
                  persisted: Decision | None = None, excess: Collection[DeviceQuota] = (),
                  account: bool = True, whole: bool = False) -> Admission:
        """The exact charge replaces the reservation.

        Denied only when the exact charge exceeds what the claim reserved and the excess
        breaks `hard` (an Optimistic quota can price below what the scheduler picks);
        with `enforce` false that is a warning and the charge is accounted anyway.
        `persisted`: the decision on `excess` (the quotas `excess_to_persist` named),
        taken on their persisted records; the other quotas are checked here.
        `account`: count the allocation in the ledger now (`dra-quota check`, which has no
        watch). `serve` passes False: its claim cache counts the allocation when the watch
        brings it, so every allocated entry of its ledger is one that landed, and the last
        one is what a deallocated claim keeps counting (`kube.claimstore.ClaimStore`); an
        allocation allowed here may still be refused by a later admission step.
        """
        own, pricing, entry = allocation.own, allocation.pricing, allocation.entry
        if persisted is not None and not persisted.allowed:
            decision = persisted
        else:
            keys = [(q.namespace, q.name) for q in excess] if persisted is not None else []
            decision = _joined(persisted, self.ledger.allocate(entry, enforce=enforce, dry_run=dry_run or not account,
                                                               persisted=keys))
        warnings = (*pricing.warnings, *decision.warnings)
        # Only where a quota counts the claim's devices: elsewhere nothing was reserved to exceed.
        counted = any(not entry.charge_for(q, self.ledger.default_mode).is_zero()
                      for q in self.ledger.quotas(own.namespace))
        # What it was admitted at: the ledger's reservation (the leader's annotation may
        # not be on the claim yet), else the annotation.
        above = charged_above(own, pricing.total) if counted else ""
        if decision.allowed:
            return Admission(True, "", warnings, pricing, decision.charged, warned_by=decision.warned_by,
                             charged_above=above)
        if whole and persisted is not None and not persisted.allowed:
            # `excess_to_persist` with history_known False: the whole allocation was checked.
            message = ("dra-quota cannot tell what this claim's last allocation charged (its allocation record is "
                       "missing or may be stale), so the allocation must fit whole beside everything else the quota "
                       f"counts (requested: the whole allocation; reserved: without this claim): {decision.message}")
        else:
            message = ("the allocated devices charge more than the claim reserved (requested: the excess): "
                       f"{decision.message}")
        if enforce:
            return Admission(False, message, warnings, pricing, denied_by=decision.denied_by)
        return Admission(True, "", (*warnings, f"{message} (allocation check: account-only, admitted)"), pricing,
                         warned_by=decision.denied_by, charged_above=above)

    def price_for_admission(self, claim: Claim, *, namespace_labels: Mapping[str, str] | None,
                            budget: Budget | None = None) -> Entry | Admission:
        """A new claim priced once, in every mode its namespace's quotas use, or the denial
        no quota needs to decide (adminAccess label, pricing errors, memory no device
        prices): what the webhook's persisted admission checks against the persisted
        reservations (`webhook.claimreview`), so the claim is priced once per review."""
        return self._priced_entry(claim, namespace_labels, budget)

    def price_if_priced(self, claim: Claim, *, namespace_labels: Mapping[str, str] | None,
                        budget: Budget | None = None) -> Entry | Admission | None:
        """`price_for_admission` where its estimate is memoised (`Counting._estimate`: a
        lookup, microseconds whatever the claim's size), else None: the webhook then prices
        it in slices (`runtime.slicing`)."""
        priced = self._priced(claim)
        return self._priced_entry(claim, namespace_labels, budget, priced) if priced.memoised else None

    def pricing_warnings(self, claim: Claim, pricing: Pricing) -> tuple[str, ...]:
        """What an admission of `claim` priced at `pricing` warns of before any quota check."""
        return (*pricing.warnings, *self._unpriced(claim, pricing)[1])

    def charges(self, entry: Entry) -> dict[DeviceQuota, Charge]:
        """What a priced claim's `entry` adds to each quota of its namespace, each in its
        pricing mode: its charge, less what the admitted Kueue Workload of its Pod still
        holds for it (`Ledger.uncovered`), so a Workload's claims are never counted twice."""
        return {q: self.ledger.uncovered(entry, q) for q in self.ledger.quotas(entry.namespace)}

    def workload_entry(self, namespace: Namespace, ref: ClaimRef, claims: Sequence[tuple[Claim, int]], *,
                       budget: Budget | None = None) -> Entry | str:
        """A Kueue Workload's price as one ledger entry (`quota.accounting.workloads`): each claim
        (of a ResourceClaimTemplate) times how many Pods stamp it, priced in every mode
        the namespace's quotas use, exactly as the claims will be when they come. A
        string: why it cannot be priced (the denial a claim would get). The Workload is
        one review: its templates share `budget`."""
        review = budget if budget is not None else Budget.review()
        priced: list[tuple[Entry, int]] = []
        for claim, count in claims:
            entry = self._priced_entry(claim, None, review)  # every mode at once
            if isinstance(entry, Admission):
                return f"ResourceClaimTemplate {claim.name}: {entry.reason}"
            priced.append((entry, count))
        pricings: dict[Mode, Pricing] = {}
        for mode in self._modes(namespace):
            requests: list[PricedRequest] = []
            warnings: list[str] = []
            for entry, count in priced:
                pricing = entry.pricing[mode]
                # Arithmetic, not copies: a Job's parallelism may be 2^31-1, and a copy per Pod
                # would take the leader's memory with it.
                requests.extend(r.times(count) for r in pricing.requests if count)
                warnings.extend(pricing.warnings)
            pricings[mode] = Pricing(tuple(requests), warnings=tuple(dict.fromkeys(warnings)),
                                     selections=frozenset(self._selections(namespace)))
            total = pricings[mode].total
            if max(total.memory, total.devices) > MAX_INT64:
                return (f"the Workload's Pods together would charge {total.devices} devices and {total.memory} "
                        f"bytes of memory, past what a quota can count (2^63-1): lower the PodSets' counts")
        return Entry(namespace, ref, pricings, allocated=False)

    def workload_charges(self, entry: Entry) -> dict[DeviceQuota, Charge]:
        """What a Workload's `entry` takes from each quota of its namespace."""
        return {q: entry.charge_for(q, self.ledger.default_mode) for q in self.ledger.quotas(entry.namespace)}

    def _own_record(self, claim: Claim, held: Entry | None) -> Claim:
        """`claim` with the charge it reserved (`held`, `_reserved`) in place of its annotation.

        `draquota.io/charge` is tenant-writable metadata: where the ledger already
        counts the claim, its own record prices devices that vanished from the
        inventory. The annotation stays the fallback for claims the ledger never saw
        (a claim admitted before this process started). `account_allocated` keeps
        reading the annotation: `dra-quota check` has nothing else.
        """
        pricing = None if held is None else held.pricing.get(self.ledger.default_mode)
        # A deallocated claim's entry is its last allocation (`deallocated_entry`), not what it was admitted at.
        return claim if pricing is None or pricing.exact else replace(claim, recorded_charge=pricing.total)

