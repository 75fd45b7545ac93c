"""Our annotations on a claim (`draquota.io/charge`, `draquota.io/quotas`, the allocation
record of `quota.objects.allocationrecord`): what they should say, from what the ledger counts.

Neighbours: the leader writes them (`controllers.annotator`), the webhook accepts exactly
these (`webhook.claimreview`); `quota.admission.counting` holds the ledger and prices; the
allocation record comes from `quota.pricing.pricer.Pricer.allocation_record`. Pure and
synchronous.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from types import MappingProxyType

from quota.accounting.ledgerentry import Entry
from quota.admission.counting import Counting, claim_ref
from quota.objects.allocationrecord import record_annotations, record_in_step
from quota.objects.claims import CHARGE_ANNOTATION, QUOTAS_ANNOTATION, Claim
from quota.pricing.priced import Pricing
from quota.values.model import Charge, RecordKey
from quota.values.work import Budget

__all__ = ["Annotating", "read_annotations"]

# `read_annotations`' shared answers, one per charge text (a template's claims carry one
# each), while fewer than this many are held; texts longer than ours are never kept.
_READ_KEPT = 4096
_READ_MAX_BYTES = 256
_NONE: Mapping[str, str] = MappingProxyType({})
_read: dict[str, Mapping[str, str]] = {}


def read_annotations(annotations: Mapping[str, str]) -> Mapping[str, str]:
    """What `annotations_due` and `annotations_may_be_due` read of a claim's annotations
    (whether it carries a charge), for a caller that holds them a while: a relist holds
    every claim's until its swap, and whole, their allocation records and other keys were
    a third of the claims' memory at start (bench/startup_local.py). Read only, and shared
    by the claims carrying one charge text."""
    charge = annotations.get(CHARGE_ANNOTATION)
    if charge is None:
        return _NONE
    if (found := _read.get(charge)) is not None:
        return found
    found = MappingProxyType({CHARGE_ANNOTATION: charge})
    if len(charge) <= _READ_MAX_BYTES and len(_read) < _READ_KEPT:
        _read[charge] = found
    return found


class Annotating(Counting):
    """`Counting`, and the annotations each claim should carry."""

    def price(self, claim: Claim, *, budget: Budget | None = None) -> Pricing:
        """The estimate in the default mode: the charge the leader records on a claim."""
        return self.pricer.estimate(claim.spec, mode=self.ledger.default_mode, budget=Budget.claim(budget),
                                    selections=self._selections(claim.namespace))

    def annotations_due(self, claim: Claim, current: Mapping[str, str]) -> dict[str, str]:
        """Our annotations `claim` should carry and does not (the leader writes them,
        `controllers.annotator`; the webhook accepts exactly these, `webhook.claimreview`).

        The charge is what admission charges the claim's spec in the default mode (the
        estimate, even once allocated: it says what was admitted, and the allocation
        record says what was allocated), and the quotas it draws on; both written once,
        when the claim carries no charge yet (a DeviceQuota made later does not rewrite
        them). The allocation record whenever it differs from what the allocation says.
        Pricing is cached per spec and inventory (`quota.pricing.pricer.Pricer`): every replica
        that asks gets the same answer from the same inventory. It runs the claim's CEL
        (within a claim's budget, `quota.values.work`): callers on the event loop run this
        through `runtime.slicing`, and ask `annotations_may_be_due` first. A claim over
        budget gets no charge (it counts at its bound, `bound_entry`).
        """
        due: dict[str, str] = {}
        if CHARGE_ANNOTATION not in current and not (pricing := self.price(claim)).over_budget:
            entry = Entry(claim.namespace, claim_ref(claim), {self.ledger.default_mode: pricing}, allocated=False)
            due.update(self.charge_annotations(entry))
        if claim.allocation is not None:
            record = self.pricer.allocation_record(claim)
            if not record_in_step(claim, record):
                due.update(record_annotations(claim, record))
        elif (last := self.record_due(claim)) is not None:
            due.update(record_annotations(claim, last))
        return due

    def charge_annotations(self, entry: Entry) -> dict[str, str]:
        """`draquota.io/charge` and `draquota.io/quotas` for a claim priced as `entry` (in
        the default mode at least): the one place their values are built, for the leader's
        patch (`annotations_due`) and for the one-write admission that sets them in the
        create itself (`webhook.claimadmit`), so both write the same bytes."""
        mode = self.ledger.default_mode
        pricing = entry.pricing[mode]
        return {CHARGE_ANNOTATION: _charge_text(pricing.total),
                QUOTAS_ANNOTATION: ",".join(sorted(q.ref for q in self.ledger.quotas(entry.namespace)
                                                   if not entry.charge_for(q, mode).is_zero()))}

    def record_due(self, claim: Claim) -> dict[RecordKey, int] | None:
        """What an unallocated claim's allocation record should say where it is not the last
        allocation this process saw land (the ledger's `Counting.deallocated_entry`): the
        claim was deallocated before the leader recorded that allocation, or allocated and
        deallocated again since. Replicas started after the deallocation count the record
        (`Counting.recorded_allocation`): it must be the last allocation's. None: nothing
        to write (in step, or no allocation seen here)."""
        held = self.ledger.entry(claim_ref(claim))
        pricing = held.pricing.get(self.ledger.default_mode) if held is not None and not held.allocated else None
        if pricing is None or not pricing.exact or pricing.from_record or not pricing.record:
            return None
        record = dict(pricing.record)
        return None if record_in_step(claim, record) else record

    def annotations_may_be_due(self, claim: Claim, current: Mapping[str, str]) -> bool:
        """Whether `annotations_due` could say anything, without running any CEL: a claim
        with no charge yet, or an allocation its record does not match (read from the exact
        pricing the ledger holds for it when it was just counted: priced once an event)."""
        if CHARGE_ANNOTATION not in current:
            return True
        if claim.allocation is None:
            return self.record_due(claim) is not None
        held = self.ledger.entry(claim_ref(claim))
        pricing = held.pricing.get(self.ledger.default_mode) if held is not None and held.allocated else None
        record = dict(pricing.record) if pricing is not None else self.pricer.allocation_record(claim)
        return not record_in_step(claim, record)


# A one-write admission writes the charge on every claim it admits, and claims of a
# template share one: encoded once per charge (bounded), not per create.
@functools.lru_cache(maxsize=256)
def _charge_text(charge: Charge) -> str:
    return json.dumps(charge.as_json(), separators=(",", ":"))
