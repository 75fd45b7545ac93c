"""The leader records each allocated claim's exact per-device charge on the claim.

Neighbours: the claim cache (`webhook.caches.ClaimStore`) tells `AllocationRecorder.seen`
every claim it accounts and `gone` every claim deleted; `quota.pricing.Pricer
.allocation_record` says what the record should be; `quota.claims` parses the annotation
(`draquota.io/allocated-charge`), which `Pricer.exact` reads back for a device that left
the inventory; `webhook.claims.update_claim` refuses a record that is not the exact
charge, so a tenant cannot lower it.

Why: a device can vanish while a claim holds it (a driver rewrites its ResourceSlice, a
node goes away). Its charge must stay what it was, and be the same in the process that
saw the device and in a leader started afterwards, which never saw it. The charge
recorded at admission (`draquota.io/charge`) is an estimate of the whole claim; this is
the exact charge of each device, so nothing else has to be guessed.

Only the leader writes (`leading`); every replica collects the claims still to record,
so a new leader starts from its own cache without a list. A claim whose annotation
already matches its allocation is not written: a restart that relists writes nothing.
Each write is a merge patch of the claim's metadata carrying its uid, which the API
server checks as a precondition: a claim deleted and recreated under the same name is
never written. RBAC: patch resourceclaims.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import aiohttp

from quota.claims import ALLOCATED_CHARGE_ANNOTATION, Claim, allocated_charge_annotation
from quota.kubeapi import ApiError, KubeApi, Resource
from quota.pricing import Pricer
from webhook.guard import guarded

__all__ = ["AllocationRecorder"]

log = logging.getLogger(__name__)

CLAIMS = Resource("resource.k8s.io/v1", "resourceclaims")
FIELD_MANAGER = "dra-quota"


class AllocationRecorder:
    def __init__(self, api: KubeApi, pricer: Callable[[], Pricer], *, leading: Callable[[], bool],
                 concurrency: int = 4, backoff: float = 1.0, attempts: int = 5) -> None:
        self._api = api
        self._pricer = pricer  # the caches' current Pricer (its inventory moves)
        self._leading = leading
        self._concurrency = concurrency
        self._backoff = backoff
        self._attempts = attempts
        self._pending: dict[str, Claim] = {}  # uid -> the latest allocated claim to record
        self._failures: dict[str, int] = {}
        self._wake = asyncio.Event()
        self.writes = 0  # records that landed (tests and logs read it)

    # -- told by the claim cache (synchronous, never raises) -----------------------------

    def seen(self, claim: Claim) -> None:
        if claim.allocation is None or not claim.uid:
            self._pending.pop(claim.uid, None)
            return
        record = guarded(f"the allocation record of ResourceClaim {claim.namespace}/{claim.name}",
                         lambda: self._pricer().allocation_record(claim))
        if record is None or record == dict(claim.recorded_devices):
            self._pending.pop(claim.uid, None)
            self._failures.pop(claim.uid, None)
            return
        self._pending[claim.uid] = claim
        self._wake.set()

    def gone(self, uid: str) -> None:
        self._pending.pop(uid, None)
        self._failures.pop(uid, None)

    @property
    def pending(self) -> int:
        return len(self._pending)

    # -- the writer -----------------------------------------------------------------------

    async def run(self) -> None:
        """Until cancelled: while leading, write the records still missing."""
        while True:
            if not self._pending or not self._leading():
                # Leadership is polled: the elector has no callback and a new leader
                # finds its pending claims at most a second late.
                try:
                    await asyncio.wait_for(self._wake.wait(), 1.0)
                except TimeoutError:
                    pass
                self._wake.clear()
                continue
            batch = list(self._pending.values())[: self._concurrency * 8]
            for claim in batch:
                self._pending.pop(claim.uid, None)
            semaphore = asyncio.Semaphore(self._concurrency)

            async def write(claim: Claim) -> None:
                async with semaphore:
                    if self._leading():
                        await self._write(claim)

            retry = [c for c, ok in zip(batch, await asyncio.gather(*(write(c) for c in batch)), strict=True)
                     if ok is False]
            if retry:
                await asyncio.sleep(self._backoff)

    async def _write(self, claim: Claim) -> bool | None:
        """One record; False: failed and put back to retry; None: written or not needed."""
        record = guarded(f"the allocation record of ResourceClaim {claim.namespace}/{claim.name}",
                         lambda: self._pricer().allocation_record(claim))
        if record is None or record == dict(claim.recorded_devices):
            return None
        patch = {"metadata": {"uid": claim.uid,
                              "annotations": {ALLOCATED_CHARGE_ANNOTATION: allocated_charge_annotation(record)}}}
        try:
            await self._api.patch(CLAIMS, claim.name, patch, namespace=claim.namespace, field_manager=FIELD_MANAGER)
        except ApiError as err:
            if err.status in (404, 409):
                return None  # deleted, or recreated under its name (the uid precondition)
            return self._failed(claim, str(err))
        except (aiohttp.ClientError, TimeoutError) as err:
            return self._failed(claim, str(err))
        self.writes += 1
        self._failures.pop(claim.uid, None)
        return None

    def _failed(self, claim: Claim, why: str) -> bool:
        failures = self._failures.get(claim.uid, 0) + 1
        if failures >= self._attempts:
            # Its next event (or the next leader's) tries again; until then the running
            # ledger already charges it exactly.
            log.warning("cannot record the allocated charge of ResourceClaim %s/%s after %d attempts: %s",
                        claim.namespace, claim.name, failures, why)
            self._failures.pop(claim.uid, None)
            return True
        self._failures[claim.uid] = failures
        self._pending.setdefault(claim.uid, claim)  # a newer event's claim wins
        return False
