"""One claim as the ledger counts it (`Entry`), and how entries add up to a quota's usage.

Neighbours: `quota.accounting.ledger.Ledger` holds the entries and keeps each quota's usage with
`add_usage` and `sum_usage`; `quota.accounting.claimsrebuild` sums a relist's entries aside with
them; `quota.admission.counting` and `quota.admission.admitter` build the entries from priced claims
(`quota.pricing.priced.Pricing` per mode), and one for what an admitted Kueue Workload holds
(`Admitter.workload_entry`). Pure: plain values in, a `Usage` out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NewType

from quota.objects.claims import Claim
from quota.pricing.priced import Pricing
from quota.quotas.devicequota import DeviceQuota, Usage
from quota.quotas.scope import Scope
from quota.values.model import ZERO, Charge, Mode, Namespace

__all__ = ["ClaimRef", "Entry", "add_usage", "sum_usage", "usage_scope"]

# The key of a claim: its uid when it has one (every claim the API server admits does),
# else namespace/name (`dra-quota check` reads files without uids). A uid never holds a
# '/', so the two forms cannot collide.
ClaimRef = NewType("ClaimRef", str)


@dataclass(frozen=True, slots=True)
class Entry:
    """One claim as the ledger counts it: exact once allocated, else a reservation."""

    namespace: Namespace
    ref: ClaimRef
    # Pricing per mode: quotas may price optimistically while the default is conservative.
    pricing: Mapping[Mode, Pricing]
    allocated: bool
    # The uid of the Pod whose controlling ownerReference the claim carries: a claim of a
    # Pod of an admitted Kueue Workload draws on that Workload's holding (`quota.accounting.workloads`).
    owner: str = ""
    # An unallocated claim's own object: what prices it again for a quota selecting other
    # devices than its pricing knows (`Admitter.add_or_update_quota`). None for allocated
    # and deallocated claims (their pricing holds their last devices) and Workloads.
    claim: Claim | None = None

    def charge_for(self, quota: DeviceQuota, default_mode: Mode) -> Charge:
        return self._pricing(quota, default_mode).charge_for(quota.scope)

    def unmetered_in(self, quota: DeviceQuota, default_mode: Mode) -> bool:
        """Whether `quota` counts devices of this claim that have no memory at 0 memory
        while limiting memory: its scope names them (a quota with no scope governs
        accelerators only)."""
        if quota.scope.everything or quota.hard.memory is None:
            return False
        return any(r.unmetered_in(quota.scope) for r in self._pricing(quota, default_mode).requests)

    def in_scope(self, quota: DeviceQuota, default_mode: Mode) -> bool:
        """Counted in `quota`'s allocated/pending claims: a quota scoped to other classes
        or devices does not count the claim, as it does not charge it."""
        return self._pricing(quota, default_mode).in_scope(quota.scope)

    def _pricing(self, quota: DeviceQuota, default_mode: Mode) -> Pricing:
        return self.pricing.get(quota.mode or default_mode) or next(iter(self.pricing.values()))

def usage_scope(quota: DeviceQuota) -> tuple[Mode | None, Scope, bool]:
    """What a quota's usage depends on, all `add_usage` reads of it: its pricing mode, what
    it charges (device classes and devices, `quota.quotas.scope`) and whether it limits memory
    (`Entry.unmetered_in`). Two quotas alike here count any claims alike."""
    return quota.mode, quota.scope, quota.hard.memory is None


def sum_usage(entries: Iterable[Entry], quota: DeviceQuota, default_mode: Mode) -> Usage:
    """`add_usage` of every entry from an empty usage, in plain integers: a relist sums
    every claim once per quota (150,000 of them; a `Usage` and two `Charge`s built per
    claim were most of that)."""
    used_memory = used_devices = reserved_memory = reserved_devices = 0
    allocated = pending = unmetered = 0
    for entry in entries:
        charge = entry.charge_for(quota, default_mode)
        counted = 1 if entry.in_scope(quota, default_mode) else 0
        if entry.unmetered_in(quota, default_mode):
            unmetered += 1
        if entry.allocated:
            used_memory += charge.memory
            used_devices += charge.devices
            allocated += counted
        else:
            reserved_memory += charge.memory
            reserved_devices += charge.devices
            pending += counted
    return Usage(used=Charge(used_memory, used_devices), reserved=Charge(reserved_memory, reserved_devices),
                 allocated_claims=allocated, pending_claims=pending, unmetered_claims=unmetered)


def add_usage(usage: Usage, entry: Entry, quota: DeviceQuota, default_mode: Mode, sign: int) -> Usage:
    charge = entry.charge_for(quota, default_mode)
    signed = charge if sign > 0 else ZERO - charge
    counted = sign if entry.in_scope(quota, default_mode) else 0
    unmetered = usage.unmetered_claims + (sign if entry.unmetered_in(quota, default_mode) else 0)
    # Built directly, not by `dataclasses.replace`: a relist sums every claim through here
    # (150,000 calls; replace was a sixth of a relist of unchanged claims, bench/controller.py).
    # Every field of `Usage` is passed on: a field added there must be added here.
    if entry.allocated:
        return Usage(used=usage.used + signed, reserved=usage.reserved, allocated_claims=usage.allocated_claims + counted,
                     pending_claims=usage.pending_claims, workloads=usage.workloads, unmetered_claims=unmetered)
    return Usage(used=usage.used, reserved=usage.reserved + signed, allocated_claims=usage.allocated_claims,
                 pending_claims=usage.pending_claims + counted, workloads=usage.workloads, unmetered_claims=unmetered)
