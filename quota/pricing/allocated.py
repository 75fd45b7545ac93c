"""The exact charge of an allocated claim, from its `status.allocation`.

Neighbours: `quota.pricing.pricer.Pricer` estimates claims not allocated yet and hands allocated
ones to `AllocatedPricer` (`Pricer.exact`, `rescoped`, `allocation_record`);
`quota.pricing.capacity` says what one allocation of a device holds; `quota.pricing.priced` holds the
values built here (`Pricing.held`, `Pricing.record`). A device that vanished from the
inventory is charged what the claim's allocation record (`quota.objects.allocationrecord`) kept for
it (docs/design.md, "The charge of a claim"), never dropped or guessed. No clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from quota.devices.inventory import Inventory
from quota.devices.selectors import SelectorMatcher
from quota.objects.allocationrecord import by_device
from quota.objects.claims import AllocatedDevice, Claim
from quota.objects.claimspec import request_classes
from quota.pricing.capacity import round_request
from quota.pricing.priced import HeldDevice, PricedRequest, Pricing, Share
from quota.quotas.scope import DeviceSelection
from quota.values.model import MEMORY, ZERO, Charge, Device, DeviceClass, DeviceClassName, DeviceKey, RecordKey, qualify
from quota.values.quantity import ceil_int, format_quantity
from quota.values.work import Budget, BudgetExceeded

__all__ = ["AllocatedPricer"]


class AllocatedPricer:
    """Prices allocated claims against one inventory and a live map of DeviceClasses."""

    def __init__(self, inventory: Inventory, classes: Mapping[DeviceClassName, DeviceClass],
                 matcher: SelectorMatcher) -> None:
        self.inventory = inventory
        self.classes = classes
        self.matcher = matcher

    def exact(self, claim: Claim, *, selections: Sequence[DeviceSelection] = ()) -> Pricing:
        """Charge from `status.allocation`; a device that vanished from the inventory is
        charged what the claim's allocation record keeps for it, what it was charged
        while it existed. Each request also priced for each of `selections`
        (`rescoped`)."""
        recorded: dict[RecordKey, int] | None = None  # the record, read only for a device gone
        classes = request_classes(claim.spec)
        held: list[HeldDevice | None] = []
        unknown: list[tuple[int, AllocatedDevice, str, DeviceClassName]] = []
        record: dict[RecordKey, int] = {}
        for result in claim.allocation or ():
            top, cls = _request_class(result.request, classes)
            # Looked up once (every allocation event of every claim comes through here).
            found = self.inventory.lookup(result.key)
            device = None if result.admin_access else found
            # The record is read for a device that left the inventory only.
            kept = None
            if device is None and not result.admin_access:
                if recorded is None:
                    recorded = dict(claim.recorded_devices)
                kept = _recorded_for(recorded, claim, result)
            charge = self._device_exact(result, kept, found)
            if result.admin_access:
                pass  # free: nothing to keep
            elif device is None and kept is not None:
                record[_result_key(result)] = kept  # vanished: kept, never dropped or guessed
            elif charge is not None:
                record[_result_key(result)] = charge.memory
            if charge is None:
                unknown.append((len(held), result, top, cls))
            held.append(None if charge is None else
                        HeldDevice(top, cls, result.key, charge, self._accelerator(result.key, charge.memory, found)))
        warnings: list[str] = []
        if unknown:
            names = ", ".join(str(r.key) for _, r, _, _ in unknown)
            if claim.recorded_charge is not None:
                known = sum((h.charge for h in held if h is not None), ZERO)
                share = _vanished_share(claim.recorded_charge, known, len(unknown))
                warnings.append(f"allocated device(s) {names} vanished from the inventory; charged "
                                f"{format_quantity(share)} each from the charge recorded at admission")
                shares = [share] * len(unknown)
            else:
                # Nothing recorded (a device that never existed, or another driver's pool
                # named): the class's largest device, so an allocation cannot be free.
                shares = [self._largest_in_class(classes.get(r.request, DeviceClassName(""))) for _, r, _, _ in unknown]
                warnings.append(f"allocated device(s) {names} not in the inventory and no charge recorded; "
                                "charged as the largest device of their class")
            for (at, result, top, cls), share in zip(unknown, shares, strict=True):
                held[at] = HeldDevice(top, cls, result.key, Charge(share, 1))
                # Recorded too: a process started after a deallocation counts the claim's last
                # allocation from the record (`recorded`), which must charge every device.
                record[_result_key(result)] = share
        lines = tuple(h for h in held if h is not None)
        return Pricing(self._requests(lines, selections), exact=True, warnings=tuple(warnings),
                       record=tuple(sorted(record.items(), key=lambda kv: str(kv[0]))),
                       selections=frozenset(selections), held=lines)

    def recorded(self, claim: Claim, *, selections: Sequence[DeviceSelection] = ()) -> Pricing | None:
        """An unallocated claim's last allocation, from the record the leader wrote on it
        (`quota.objects.allocationrecord`: each allocation result and its memory), as `exact`
        priced it then: what a process that never saw that allocation (it started after
        the deallocation) counts, as the ones that saw it do (`Counting.deallocated_entry`).
        A record by result names each request, so its device is charged to that request's
        class, as `exact` charged it. A record by device (a claim of one class, or one an
        older release wrote): a device is charged to the class of the claim's requests it
        belongs to (`_recorded_class`). None without a record, or where such a device's
        class cannot be told."""
        if claim.allocation is not None or not claim.recorded_devices:
            return None
        by_request = request_classes(claim.spec)
        classes = sorted(set(by_request.values()))
        requests = {cls: ",".join(r.name for r in claim.spec.requests
                                  if any(alt.device_class == cls for alt in r.alternatives)) for cls in classes}
        held = []
        budget = Budget.claim()
        for key, memory in claim.recorded_devices:
            accelerator = self._accelerator(key.device, memory, self.inventory.lookup(key.device))
            if key.request:
                top, named = _request_class(key.request, by_request)
                held.append(HeldDevice(top, named, key.device, Charge(memory, 1), accelerator))
                continue
            cls = classes[0] if len(classes) == 1 else self._recorded_class(key.device, classes, budget)
            if cls is None:
                return None
            held.append(HeldDevice(requests[cls], cls, key.device, Charge(memory, 1), accelerator))
        return self.rescoped(Pricing((), exact=True, record=claim.recorded_devices, held=tuple(held),
                                     from_record=True), selections)

    def _recorded_class(self, key: DeviceKey, classes: Sequence[DeviceClassName], budget: Budget) -> \
            DeviceClassName | None:
        """The one class of `classes` whose selectors select recorded device `key` in the
        inventory: a device the scheduler allocated for a request satisfies its class's
        selectors, so if only one of the claim's classes selects it, that was its request's
        class. None: the device left the inventory, or none or several select it (or a
        selector fails on it, or the budget ran out). Only DeviceClass selectors run (the
        cluster admin's CEL, never the tenant's)."""
        device = self.inventory.lookup(key)
        if device is None:
            return None
        found: list[DeviceClassName] = []
        for name in classes:
            cls = self.classes.get(name)
            try:
                if cls is not None and self.matcher.selects(cls.selectors, device, budget) is True:
                    found.append(name)
            except BudgetExceeded:
                return None
        return found[0] if len(found) == 1 else None

    def rescoped(self, pricing: Pricing, selections: Sequence[DeviceSelection]) -> Pricing:
        """An exact pricing's requests again, priced for `selections`: from its devices
        (`Pricing.held`), without the claim. A quota selecting devices counts an
        allocated device when the selection selects it (`_selects`)."""
        return replace(pricing, requests=self._requests(pricing.held, selections), selections=frozenset(selections))

    def _requests(self, held: tuple[HeldDevice, ...], selections: Sequence[DeviceSelection]) -> tuple[PricedRequest, ...]:
        """The priced requests of an allocation's devices, for `selections` too (`rescoped`)."""
        per_request: dict[str, list[HeldDevice]] = {}
        for line in held:
            per_request.setdefault(line.request, []).append(line)
        budget = Budget.claim()
        requests = []
        for name, lines in per_request.items():
            whole = sum((line.charge for line in lines), ZERO)
            # A quota with no scope counts the accelerators; one whose scope names the
            # others (an RDMA NIC), every device (`quota.pricing.priced`).
            total = sum((line.charge for line in lines if line.accelerator), ZERO)
            shares = tuple((selection, (self._held_share(lines, selection, budget),)) for selection in selections)
            others = tuple(sorted({line.key.driver for line in lines if not line.accelerator}))
            requests.append(PricedRequest(
                name, len(lines), total, ((lines[0].device_class, total),), shares=shares,
                whole=(whole,) if whole != total else (),
                unmetered=((name, lines[0].device_class, others),) if others else (),
                governed=any(line.accelerator for line in lines)))
        return tuple(requests)

    def _held_share(self, lines: list[HeldDevice], selection: DeviceSelection, budget: Budget) -> Share:
        selected = [line for line in lines if self._selects(selection, line.key, budget)]
        others = tuple(sorted({line.key.driver for line in selected if not line.accelerator}))
        return Share(sum((line.charge for line in selected), ZERO), bool(selected),
                     unmetered=(lines[0].request, lines[0].device_class, others) if others else None)

    def _selects(self, selection: DeviceSelection, key: DeviceKey, budget: Budget) -> bool:
        """Whether `selection` selects the allocated device `key`: by the driver the
        allocation names, then by its selectors on the device as the inventory holds it.
        A device gone from the inventory (its selectors cannot see it), one a selector
        fails on, and any past the budget are selected: an allocated device never drops
        out of a quota because it cannot be judged."""
        if not selection.admits_driver(key.driver):
            return False
        device = self.inventory.lookup(key) if selection.expressions else None
        if device is None:
            return True
        try:
            return self.matcher.selects(selection.stage, device, budget) is not False
        except BudgetExceeded:
            return True

    def _accelerator(self, key: DeviceKey, memory: int, device: Device | None) -> bool:
        """Whether a quota with no scope governs allocated device `key`: as the inventory
        holds it (`device`, looked up by the caller); gone (None), when its driver is a
        known accelerator driver or it was charged memory (a record only dra-quota
        writes: a tenant cannot make a GPU a NIC)."""
        if device is not None:
            return device.is_accelerator
        return memory > 0 or self.inventory.memory_sources.listed(key.driver)

    def _largest_in_class(self, name: DeviceClassName) -> int:
        cls = self.classes.get(name)
        if cls is None:
            return 0
        return max((ceil_int(g.representative.memory) for g in self.matcher.match((cls.selectors,)).groups), default=0)

    def allocation_record(self, claim: Claim) -> dict[RecordKey, int]:
        """What the claim's allocation record should say now (the leader writes
        it, `controllers.annotator`; the webhook refuses anything else): the exact memory
        charge of each allocated device the inventory knows, for a device it no longer
        knows the charge already recorded (never dropped), and for one it never knew what
        `exact` charges it (the record must charge every device: `recorded`). adminAccess
        devices are free and not recorded. Found by `exact` in its pass: an allocated claim
        the ledger just counted has it on its pricing already."""
        return dict(self.exact(claim).record)

    def _device_exact(self, result: AllocatedDevice, kept: int | None, device: Device | None) -> Charge | None:
        """`device`: the inventory's device of `result.key` (None: gone)."""
        if result.admin_access:
            return ZERO
        driver = result.key.driver
        if device is not None and not device.allow_multiple_allocations:
            # A device that is not shared is allocated whole, whatever consumedCapacity says.
            return Charge(ceil_int(device.memory), 1)
        # Named with and without prefix, the largest counts: two entries for one capacity
        # never come from the scheduler, and the first must not undercut the other.
        # The capacity that holds the device's memory (`memory`, or the one a memory source
        # names); gone from the inventory, `memory` as the allocation names it.
        name = MEMORY if device is None else device.memory_name
        consumed = [amount for entry, amount in result.consumed_capacity if qualify(entry, driver) == (driver, name)]
        if consumed:
            amount = max(consumed)
            capacity = device.memory_capacity if device is not None else None
            # What the device sets aside for that amount: a share below the policy's
            # minimum or between its steps still holds the rounded amount.
            rounded = round_request(amount, capacity) if capacity is not None else None
            charge = ceil_int(rounded if rounded is not None else amount)
            # Gone from the inventory, its policy cannot round the amount: what the record
            # kept (rounded while the device was there) where that is more, so a device leaving
            # the inventory never lowers a share's charge.
            return Charge(max(charge, kept) if kept is not None else charge, 1)
        if device is not None:
            return Charge(ceil_int(device.memory), 1)
        if kept is not None:
            return Charge(kept, 1)
        return None


def _request_class(request: str, classes: Mapping[str, DeviceClassName]) -> tuple[str, DeviceClassName]:
    """An allocation result's request ("req" or "req/sub"): its top-level request and its class."""
    top = request.split("/", 1)[0]
    return top, classes.get(request, classes.get(top, DeviceClassName("")))


def _result_key(result: AllocatedDevice) -> RecordKey:
    return RecordKey(result.request, result.key, result.share_id or "")


def _recorded_for(recorded: Mapping[RecordKey, int], claim: Claim, result: AllocatedDevice) -> int | None:
    """What the record charged `result`: under its own key, else under its device's (the
    record by device: a record by device, or one by result that says another allocation),
    where the device has no other charged result (by device, a record holds the sum of a
    device's results; an older release's, the last one: never a result's own)."""
    kept = recorded.get(_result_key(result))
    if kept is not None:
        return kept
    if sum(1 for r in claim.allocation or () if r.key == result.key and not r.admin_access) > 1:
        return None
    return by_device(recorded).get(RecordKey("", result.key))


def _vanished_share(recorded: Charge, known: Charge, unknown: int) -> int:
    return max(recorded.memory - known.memory, 0) // unknown
