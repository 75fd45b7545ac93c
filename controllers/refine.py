"""Stored claims: counted at once at an upper bound, priced after ready.

Neighbours: `kube.claimstore.ClaimStore` enters each unallocated claim this process did
not admit (it started later, or the claim was deallocated) at
`quota.admission.counting` (`Admitter.bound_entry`) and hands it here; `runtime.slicing` prices it
like a review (budgeted, in slices, expensive ones in the slow lane); the quota
controller is told the quotas whose usage the new price moved (`changed`) so
DeviceQuota status follows.

Why: pricing every stored claim before ready let ten expensive claims hold a fresh
replica's readiness from 0.11 s to 16.4 s, and a thousand would keep a rollout not
ready for minutes. The bound needs no tenant CEL (microseconds a claim), and is never
below the claim's estimate in any mode nor below the charge recorded at its admission,
so a ready replica never counts less than the truth: it may count more, and refuse a
claim near `hard`, until the claim is priced. Pricing replaces the bound only if the
ledger still holds that very bound when it is done: a claim allocated, deleted or
changed meanwhile has been accounted by its own event. A claim whose pricing runs out
of budget keeps its bound (`Admitter.existing_entry`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable

from kube.rebuilds import Rebuilds
from quota.accounting.ledger import QuotaKey
from quota.accounting.ledgerentry import ClaimRef, Entry
from quota.admission.admitter import Admitter, claim_ref
from quota.objects.claims import Claim
from runtime.guard import guarded
from runtime.slicing import Slicer

__all__ = ["Refiner"]

log = logging.getLogger(__name__)

FREEZE_AFTER = 1000  # claims waiting at once: their pricing is a rebuild (`Refiner.run`)


class Refiner:
    def __init__(self, admitter: Admitter, slicer: Slicer, *, changed: Callable[[Iterable[QuotaKey]], None],
                 rebuilds: Rebuilds | None = None) -> None:
        self.admitter = admitter
        self.slicer = slicer
        self.changed = changed
        self.rebuilds = rebuilds
        self._queue: dict[ClaimRef, tuple[Claim, Entry]] = {}  # insertion-ordered: oldest first
        self._wake = asyncio.Event()
        self.refined = 0  # claims priced and replaced (tests and the bench read it)

    # -- told by the claim cache (synchronous, never raises) -----------------------------

    def add(self, claim: Claim, bound: Entry) -> None:
        self._queue[claim_ref(claim)] = (claim, bound)
        self._wake.set()

    @property
    def pending(self) -> int:
        return len(self._queue)

    # -- the background pricing -------------------------------------------------------------

    async def run(self, ready: Callable[[], Awaitable[object]]) -> None:
        """Until cancelled: once `ready()` returns (`serve` announced ready), price what waits.

        A drain of many claims (the stored claims a fresh replica found: 125,000 in
        bench/stalls.py) is a rebuild of the ledger: full collections stay off while it
        runs and what it built is frozen after (`kube.rebuilds`); a few at a time (a
        deallocated claim) are not.
        """
        await ready()
        while True:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            if self.rebuilds is not None and len(self._queue) >= FREEZE_AFTER:
                # Only the claims waiting now are the rebuild: full collections must not
                # stay off for as long as claims keep coming. And what a drain that met a
                # full slow lane built (the reviews' garbage of an attack among it) is
                # not frozen: a cycle frozen is never collected.
                with self.rebuilds.quiet():
                    if await self._drain(len(self._queue)):
                        self.rebuilds.freeze()
            else:
                await self._drain(len(self._queue))

    async def _drain(self, limit: int) -> bool:
        """Price up to `limit` waiting claims; False when a call waited behind a full slow
        lane meanwhile (`Slicer.crowded`: reviews were being refused)."""
        crowded = self.slicer.crowded
        while self._queue and limit > 0:
            limit -= 1
            # A claim whose pricing ends in its first slice awaits nothing: give the
            # loop a turn between claims, or a thousand of them would be one stall.
            await asyncio.sleep(0)
            ref = next(iter(self._queue))
            claim, bound = self._queue.pop(ref)
            if self.admitter.ledger.entry(ref) is not bound:
                continue  # accounted since by its own event, or gone
            # Waits its turn in a full slow lane: nobody retries this, and the bound counts meanwhile.
            priced = await self.slicer.run(
                lambda: guarded(f"pricing stored ResourceClaim {claim.namespace}/{claim.name}",
                                lambda: self.admitter.existing_entry(claim)), wait=True)
            if priced is None or self.admitter.ledger.entry(ref) is not bound:
                continue  # failed (logged: the bound stays), or replaced while it was priced
            keys = self.admitter.ledger.add_or_update_claim(priced)
            self.refined += 1
            log.debug("stored ResourceClaim %s/%s uid=%s priced: %s (counted at %s until now); %d left",
                      claim.namespace, claim.name, claim.uid, _total(priced), _total(bound), len(self._queue))
            self.changed(keys)
        return self.slicer.crowded == crowded


def _total(entry: Entry) -> str:
    return ", ".join(f"{mode} {pricing.total.as_json()}" for mode, pricing in entry.pricing.items())
