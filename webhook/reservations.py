"""Reservations persisted on DeviceQuota status before a claim is admitted (issue 7, item 3).

Neighbours: `quota.reservations` holds the record's format and the pure decision (read
its docstring for the protocol, the TTL and what a status reader sees); `webhook.claims`
calls `Reservations.admit` on a claim CREATE and `release` on its DELETE; the
`webhook.caches` stores feed `observe` (every DeviceQuota the watch delivers) and
`forget` (claims deleted from the cache); `quota.ledger` gives the usage this
replica's claim cache counts.

One write per quota for many admissions: requests for one quota queue in a per-quota
batch; one task drains it, so while a status write is in flight the next requests
collect and go out together in the following write, each answered from that write's
outcome. This is the in-tree plugin's shape (staging/src/k8s.io/apiserver/pkg/
admission/plugin/resourcequota/controller.go: a work queue per namespace, one
`UpdateStatus` per changed quota for a batch of requests, conflicts re-read and
re-checked up to 3 times, then every request in the batch denied). Deny by default:
an admission whose reservation is not persisted is never allowed.

Several quotas per claim: Kubernetes has no multi-object transaction, so the quotas
are reserved one at a time in name order (a fixed order, so two claims never hold
each other's first quota while waiting on the second) and the ones already reserved
are released if a later one denies or fails. Until that release lands the claim holds
capacity it will not use: other claims may be denied meanwhile (never over-committed),
and a release that fails is repaired by the entry's expiry.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from quota.devicequota import Decision, DeviceQuota, parse_device_quota
from quota.kubeapi import ApiError, KubeApi, Resource
from quota.ledger import ClaimRef, Ledger, QuotaKey
from quota.model import Charge, Namespace
from quota.reservations import Outcome, Request, apply, counting, outstanding, parse_reservations, status_fields

__all__ = ["CONTENTION", "QUOTAS", "Reservations", "StatusWrite"]

log = logging.getLogger(__name__)

QUOTAS = Resource("draquota.io/v1alpha1", "devicequotas")
CONTENTION = "could not persist the reservation: too much contention; retry"
Obj = dict[str, Any]


@dataclass(slots=True)
class _Batch:
    pending: list[tuple[Request, asyncio.Future[Decision]]] = field(default_factory=list)
    running: bool = False


@dataclass(frozen=True, slots=True)
class StatusWrite:
    """How one `Reservations.write_status` ended."""

    read: Obj | None = None  # the object the last body was built from; None: the quota is gone
    written: Obj | None = None  # what the API server stored; None: nothing was written
    conflicts: bool = False  # every attempt met a newer object


class Reservations:
    """The persisted reservations of every DeviceQuota, written with optimistic concurrency."""

    def __init__(self, api: KubeApi, ledger: Ledger, *, ttl: float, retries: int = 3,
                 clock: Callable[[], float] = time.time) -> None:
        self.api = api
        self.ledger = ledger
        self.ttl = ttl
        self.retries = retries
        self.clock = clock
        # The newest DeviceQuota object known per quota: from the watch or from our own
        # write's answer. A stale one only costs a conflict and a re-read.
        self._objects: dict[QuotaKey, Obj] = {}
        self._batches: dict[QuotaKey, _Batch] = {}
        # One status write per quota at a time in this process: the webhook's batch and
        # the quota controller take turns (FIFO), each building from what the other just
        # wrote, instead of racing into 409s. Under admission bursts the controller lost
        # four races in a row, gave up until its next round, and `used` lagged an
        # allocation by 3 s (tests/e2e/test_fleet.py on a loaded machine).
        self._writing: dict[QuotaKey, asyncio.Lock] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # uid -> when this replica's cache saw the claim deleted; kept for one TTL, after
        # which the entry has expired anyway.
        self._gone: dict[str, float] = {}

    # -- fed by the caches ------------------------------------------------------------

    def observe(self, obj: Obj) -> None:
        meta = obj.get("metadata") or {}
        self._objects[(Namespace(str(meta.get("namespace"))), str(meta.get("name")))] = obj

    def drop(self, namespace: str, name: str) -> None:
        key = (Namespace(namespace), name)
        self._objects.pop(key, None)
        lock = self._writing.get(key)
        if lock is not None and not lock.locked():
            del self._writing[key]

    def newest(self, namespace: str, name: str) -> Obj | None:
        """The newest DeviceQuota object known (the quota controller writes against it too)."""
        return self._objects.get((Namespace(namespace), name))

    def is_gone(self, uid: str) -> bool:
        """Whether this replica saw claim `uid` deleted (its entry counts no more)."""
        return uid in self._gone

    def forget(self, uid: str) -> None:
        """The claim `uid` is gone from the cache: its entry, if any, counts no more."""
        now = self.clock()
        self._gone[uid] = now
        if len(self._gone) > 1024:
            self._gone = {u: t for u, t in self._gone.items() if t > now - self.ttl}

    def pending(self, namespace: str, name: str) -> Charge:
        """What the quota's persisted entries add to this replica's ledger now: the live
        entries whose claim its cache does not hold yet (the sum `apply` checks against)."""
        obj = self._objects.get((Namespace(namespace), name))
        if obj is None:
            return Charge()
        held = counting(parse_reservations(obj.get("status")), gone=self.is_gone, now=self.clock())
        return outstanding(held, cached=self._cached)

    def _cached(self, uid: str) -> bool:
        return self.ledger.counts(ClaimRef(uid))

    # -- admission --------------------------------------------------------------------

    async def admit(self, charges: Mapping[DeviceQuota, Charge], *, uid: str, claim: str,
                    dry_run: bool = False, series: str = "") -> Decision:
        """Reserve `charges` (quota -> charge) for claim `uid`, in quota-name order;
        `series` replaces earlier attempts (`quota.reservations.Request.series`)."""
        done: list[DeviceQuota] = []
        warnings: list[str] = []
        warned_by: list[str] = []
        for quota in sorted(charges, key=lambda q: q.name):
            request = Request("reserve", uid, claim, charges[quota], series)
            decision = await (self._check(quota, request) if dry_run else self._submit(quota, request))
            if not decision.allowed:
                await self._compensate(done, uid)
                return Decision(False, decision.message, (*warnings, *decision.warnings), denied_by=decision.denied_by)
            done.append(quota)
            warnings.extend(decision.warnings)
            warned_by.extend(decision.warned_by)
        return Decision(True, "", tuple(warnings), tuple(q.name for q in done), warned_by=tuple(warned_by))

    async def release(self, namespace: str, uid: str) -> None:
        """A claim DELETE: remove `uid`'s entries from the quotas that hold one."""
        self.forget(uid)
        keys = [k for k, obj in self._objects.items()
                if k[0] == namespace and uid in ((obj.get("status") or {}).get("reservations") or {})]
        await asyncio.gather(*(self._release_one(k, uid) for k in keys))

    async def _compensate(self, quotas: list[DeviceQuota], uid: str) -> None:
        await asyncio.gather(*(self._release_one((q.namespace, q.name), uid) for q in quotas))

    async def _release_one(self, key: QuotaKey, uid: str) -> None:
        try:
            await self._submit_key(key, Request("release", uid))
        except Exception as err:  # noqa: BLE001 - the entry expires anyway
            log.warning("cannot release reservation %s on DeviceQuota %s/%s: %s; it expires after %ss",
                        uid, key[0], key[1], err, self.ttl)

    # -- the per-quota batch ----------------------------------------------------------

    async def _submit(self, quota: DeviceQuota, request: Request) -> Decision:
        return await self._submit_key((quota.namespace, quota.name), request)

    async def _submit_key(self, key: QuotaKey, request: Request) -> Decision:
        future: asyncio.Future[Decision] = asyncio.get_running_loop().create_future()
        batch = self._batches.setdefault(key, _Batch())
        batch.pending.append((request, future))
        if not batch.running:
            batch.running = True
            task = asyncio.create_task(self._drain(key, batch), name=f"reservations {key[0]}/{key[1]}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await future

    async def _drain(self, key: QuotaKey, batch: _Batch) -> None:
        try:
            while batch.pending:
                # One turn of the loop lets the reviews that arrived with this one join it.
                await asyncio.sleep(0)
                items, batch.pending = batch.pending, []
                try:
                    decisions = await self._write(key, [r for r, _ in items])
                except Exception as err:  # noqa: BLE001 - answered as a denial, never a 500
                    log.warning("cannot persist reservations on DeviceQuota %s/%s: %s", key[0], key[1], err)
                    decisions = [Decision(False, f"could not persist the reservation: {err}")] * len(items)
                for (_, future), decision in zip(items, decisions):
                    if not future.done():
                        future.set_result(decision)
        finally:
            batch.running = False
            for _, future in batch.pending:  # only on cancellation (shutdown)
                if not future.done():
                    future.set_result(Decision(False, "could not persist the reservation: shutting down"))
            batch.pending.clear()

    async def _write(self, key: QuotaKey, requests: list[Request]) -> list[Decision]:
        """Read, decide, conditionally write; on a conflict re-read and decide again."""
        outcome: Outcome | None = None

        def build(obj: Obj) -> Obj | None:
            nonlocal outcome
            outcome = self._decide(obj, requests)
            if not outcome.changed:
                return None
            return {**obj, "status": {**(obj.get("status") or {}), **status_fields(outcome.held)}}

        result = await self.write_status(key, build, retries=self.retries)
        if result.conflicts:
            return [Decision(False, CONTENTION) if r.op == "reserve" else Decision(True) for r in requests]
        if result.read is None or outcome is None:  # the quota is gone: nothing left to hold against
            return [Decision(True)] * len(requests)
        return list(outcome.decisions)

    async def write_status(self, key: QuotaKey, build: Callable[[Obj], Obj | None], *, retries: int) -> StatusWrite:
        """One conditional write of a DeviceQuota's status: the one way both writers (these
        reservations and the quota controller, `quota.quotastatus`) change it.

        `build(obj)` returns the object to PUT, built from `obj` (None: nothing to write).
        The first attempt builds from the newest object known, each later one from a fresh
        read: the write carries the resourceVersion it was built from, so a conflict (409)
        means someone wrote in between, and the body is built again from what they wrote.
        Writes of one quota from this process are serialized, so a conflict means another
        replica or another client wrote.
        """
        lock = self._writing.setdefault(key, asyncio.Lock())
        async with lock:
            return await self._write_status(key, build, retries=retries)

    async def _write_status(self, key: QuotaKey, build: Callable[[Obj], Obj | None], *, retries: int) -> StatusWrite:
        for attempt in range(retries + 1):
            obj = self._objects.get(key) if attempt == 0 else None
            if obj is None:
                obj = await self._get(key)
                if obj is None:
                    return StatusWrite()
            body = build(obj)
            if body is None:
                return StatusWrite(read=obj)
            try:
                written = await self.api.update_status(QUOTAS, body, namespace=key[0])
            except ApiError as err:
                if err.status == 409:
                    log.debug("conflict writing DeviceQuota %s/%s status (attempt %d)", key[0], key[1], attempt + 1)
                    continue
                if err.status == 404:
                    self._objects.pop(key, None)
                    return StatusWrite()
                raise
            self._objects[key] = written
            return StatusWrite(read=obj, written=written)
        return StatusWrite(conflicts=True)

    async def _check(self, quota: DeviceQuota, request: Request) -> Decision:
        """dryRun: the same decision, nothing written."""
        key = (quota.namespace, quota.name)
        obj = self._objects.get(key) or await self._get(key)
        return Decision(True) if obj is None else self._decide(obj, [request]).decisions[0]

    def _decide(self, obj: Obj, requests: list[Request]) -> Outcome:
        # Synchronous from the usage read to the decision: the cache cannot move in between.
        quota = parse_device_quota(obj)
        now = self.clock()
        return apply(
            quota, parse_reservations(obj.get("status")), requests,
            usage=self.ledger.usage(quota.namespace, quota.name),
            cached=self._cached, gone=self.is_gone, now=now, ttl=self.ttl,
        )

    async def _get(self, key: QuotaKey) -> Obj | None:
        try:
            obj = await self.api.get(QUOTAS, key[1], namespace=key[0])
        except ApiError as err:
            if err.status == 404:
                self._objects.pop(key, None)
                return None
            raise
        self._objects[key] = obj
        return obj
