"""Each quota's status writes from this process: reservations batched per quota, and the one conditional write.

Neighbours: `kube.quotawriter.Reservations` builds on this class (a claim's reservations across its
quotas, all or nothing); `quota.accounting.reservationrecord` holds the record's format,
`quota.accounting.reservations` the watermark protocol (read its docstring first) and the pure
decision; `quota.accounting.headroom` and `kube.leasebook` the lease each write settles and
re-sizes; the quota controller (`controllers.quotas`) writes through `write_status` too; the
`kube.caches` stores feed `observe` and `drop` (every DeviceQuota the watch delivers or loses), and
the claim and Namespace reflectors move `progress` and `namespace_progress`;
`quota.accounting.ledger` gives the usage this replica's claim cache counts.

Every write of a DeviceQuota's status, by either writer, goes: take the newest object
known, wait until this replica's claim watch has reached its `claimsThrough` (at most
`catch_up` seconds, else the write is refused: deciding from a cache that lags the
watermark could count a claim nowhere; on a ClusterDeviceQuota, its Namespace watch
too, up to `namespacesThrough`), refuse reserving if the object's spec is one this
replica's ledger has not counted (read afresh after a conflict, it may be newer than the
quota watch: another selector or scope), build the body synchronously, PUT it with the
resourceVersion it was built from; on a conflict read again and start over.

One write per quota for many admissions: requests for one quota queue in a per-quota
batch; one task drains it, so while a status write is in flight the next requests
collect and go out together in the following write, each answered from that write's
outcome. This is the in-tree plugin's shape (staging/src/k8s.io/apiserver/pkg/
admission/plugin/resourcequota/controller.go: a work queue per namespace, one
`UpdateStatus` per changed quota for a batch of requests, conflicts re-read and
re-checked up to 3 times, then every request in the batch denied). Deny by default:
an admission whose reservation is not persisted is never allowed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from kube.api import KubeApi
from kube.apierror import ApiError
from kube.leasebook import LeaseBook, version_of
from kube.resources import quota_resource
from kube.seen import Seen
from kube.watching import Progress
from kube.writegate import ungated
from quota.accounting.headroom import Plan, renew
from quota.accounting.ledger import Ledger, QuotaKey, recounting_message, shown
from quota.accounting.ledgerentry import ClaimRef, usage_scope
from quota.accounting.reservationrecord import parse_record, parse_version, status_fields
from quota.accounting.reservations import Outcome, Request, Undo, apply
from quota.quotas.devicequota import (
    CLUSTER_KIND,
    KIND,
    Decision,
    DeviceQuota,
    Usage,
    parse_cluster_device_quota,
    parse_device_quota,
)
from quota.values.model import Namespace
from quota.values.raw import Obj

__all__ = ["CONTENTION", "QuotaStatusWriter", "StatusWrite"]

log = logging.getLogger(__name__)

CONTENTION = "could not persist the reservation: too much contention; retry"
# A request's answer: its decision, and how to take an allowed allocation's excess back
# (`quota.accounting.reservations.Undo`; None for everything else).
_Answer = tuple[Decision, Undo | None]


@dataclass(slots=True)
class _Batch:
    pending: list[tuple[Request, asyncio.Future[_Answer]]] = field(default_factory=list)
    running: bool = False


@dataclass(frozen=True, slots=True)
class StatusWrite:
    """How one `QuotaStatusWriter.write_status` ended."""

    read: Obj | None = None  # the object the last body was built from; None: the quota is gone
    written: Obj | None = None  # what the API server stored; None: nothing was written
    conflicts: bool = False  # every attempt met a newer object
    lagging: bool = False  # this replica's claim (or Namespace) watch did not reach a watermark in time


class QuotaStatusWriter(Seen):
    """The newest object known of each quota, and this process's writes of its status:
    the per-quota batch of reservation requests and the conditional write (module doc).

    It is also this replica's `quota.accounting.reservations.Caches` (`kube.seen`): what its own
    caches know of the uids a record holds.
    """

    def __init__(self, api: KubeApi, ledger: Ledger, *, ttl: float, retries: int = 3,
                 clock: Callable[[], float] = time.time, progress: Progress | None = None,
                 claim_version: Callable[[str], int | None] = lambda uid: None,
                 claim_recorded: Callable[[str], int | None] | None = None, catch_up: float = 2.0,
                 namespace_progress: Progress | None = None,
                 namespaces_seen: Callable[[], int | None] = lambda: None, leases: LeaseBook | None = None) -> None:
        self.api = api
        self.ttl = ttl
        self.retries = retries
        self.clock = clock
        super().__init__(ledger, progress=progress, claim_version=claim_version, claim_recorded=claim_recorded)
        self.catch_up = catch_up
        # How far the Namespace watch has come, and the newest Namespace it brought
        # (`kube.caches.NamespaceStore.newest`): a team's second watermark
        # (`quota.accounting.reservations`, namespacesThrough) waits on the one, is raised to the other.
        self.namespace_progress = namespace_progress or Progress()
        self.namespaces_seen = namespaces_seen
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
        # This process's leases (`kube.leasebook`; none unless sized).
        self.leases = leases or LeaseBook()

    # -- fed by the caches ------------------------------------------------------------

    def observe(self, obj: Obj) -> None:
        meta = obj.get("metadata") or {}
        key = (Namespace(str(meta.get("namespace") or "")), str(meta.get("name")))
        # The watch may deliver a version older than our own write's answer: keep the newer
        # (one object's resourceVersions are etcd revisions, ordered).
        known_meta = (self._objects.get(key) or {}).get("metadata") or {}
        known = parse_version(known_meta.get("resourceVersion"))
        version = parse_version(meta.get("resourceVersion"))
        if known is None or version is None or version >= known:
            self._known(key, obj)

    def drop(self, namespace: str, name: str) -> None:
        key = (Namespace(namespace), name)
        self._objects.pop(key, None)
        # The lease went with the object: a quota created again under that name holds
        # none, and no other replica counts it (its window may have seconds to run).
        self.leases.forget(key)
        lock = self._writing.get(key)
        if lock is not None and not lock.locked():
            del self._writing[key]

    def _known(self, key: QuotaKey, obj: Obj) -> None:
        """`obj` is the newest object known of `key`; the leases learn its uid and
        generation (a spec changed, even back to an earlier one, ends the lease granted
        before: `kube.leasebook.LeaseBook.saw`)."""
        self.leases.saw(key, obj)
        self._objects[key] = obj

    def newest(self, namespace: str, name: str) -> Obj | None:
        """The newest DeviceQuota object known (the quota controller writes against it too)."""
        return self._objects.get((Namespace(namespace), name))

    def admitting(self, key: QuotaKey) -> bool:
        """Whether admissions into quota `key` are being written or wait to be (the quota
        controller then writes that quota less often: `controllers.quotas`)."""
        batch = self._batches.get(key)
        return batch is not None and (batch.running or bool(batch.pending))

    # -- the per-quota batch ----------------------------------------------------------

    async def _submit(self, quota: DeviceQuota, request: Request) -> _Answer:
        return await self._submit_key((quota.namespace, quota.name), request)

    async def _submit_key(self, key: QuotaKey, request: Request) -> _Answer:
        future: asyncio.Future[_Answer] = asyncio.get_running_loop().create_future()
        batch = self._batches.setdefault(key, _Batch())
        batch.pending.append((request, future))
        if not batch.running:
            batch.running = True
            task = asyncio.create_task(self._drain(key, batch), name=f"reservations {shown(key)}", context=ungated())
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
                    answers = await self._write(key, [r for r, _ in items])
                except Exception as err:  # noqa: BLE001 - answered as a denial, never a 500
                    log.warning("cannot persist reservations on %s: %s", shown(key), err)
                    answers = [(Decision(False, f"could not persist the reservation on {_kind(key)} "
                                                f'"{key[1]}": {err}'), None)] * len(items)
                for (_, future), answer in zip(items, answers):
                    if not future.done():
                        future.set_result(answer)
        finally:
            batch.running = False
            for _, future in batch.pending:  # only on cancellation (shutdown)
                if not future.done():
                    future.set_result((Decision(False, "could not persist the reservation: shutting down"), None))
            batch.pending.clear()

    async def _write(self, key: QuotaKey, requests: list[Request]) -> list[_Answer]:
        """Read, decide, conditionally write; on a conflict re-read and decide again."""
        outcome: Outcome | None = None
        plan: Plan | None = None
        planned = False

        def build(obj: Obj) -> Obj | None:
            nonlocal outcome, plan, planned
            outcome, plan = self._decide(obj, requests)
            if plan is not None:
                planned = True
                self.leases.writing(key, plan)  # local admissions keep within old and new amount
            if not outcome.changed:
                return None
            return {**obj, "status": {**(obj.get("status") or {}), **status_fields(outcome.record)}}

        try:
            result = await self.write_status(key, build, retries=self.retries)
        except ApiError as err:
            if planned and self.leases.refused_by_schema(key, err):
                return await self._write(key, requests)  # leases are off now: the exact path
            if planned:
                self.leases.uncertain(key, plan)  # it may have landed: the entry is left to expire
            raise
        except BaseException:
            if planned:
                self.leases.uncertain(key, plan)  # it may have landed: the entry is left to expire
            raise
        # Nothing to write and a book that matched the entry: the plan is what is stored
        # (its window ended, say), so the book takes it too.
        unchanged = result.read is not None and outcome is not None and not outcome.changed
        if plan is not None and (result.written is not None
                                 or (unchanged and plan.lease is not None and not plan.stale)):
            if result.written is not None:
                self.leases.wrote(key, plan, result.read, result.written)
            self.leases.landed(key, plan)
            self.leases.tend(key, lambda: self._write(key, []), self, clock=self.clock, ttl=self.ttl)
        else:
            self.leases.unwritten(key)
        if result.lagging:
            message = (f'could not persist the reservation on {_kind(key)} "{key[1]}": this replica\'s claim watch '
                       f"(or, on a ClusterDeviceQuota, Namespace watch) is more than {self.catch_up:g}s behind the "
                       "quota's record; retry")
            return [(Decision(False, message) if r.op == "reserve" else Decision(True), None) for r in requests]
        if result.conflicts:
            return [(Decision(False, f'{CONTENTION} ({_kind(key)} "{key[1]}")') if r.op == "reserve"
                     else Decision(True), None) for r in requests]
        if result.read is None or outcome is None:  # the quota is gone: nothing left to hold against
            return [(Decision(True), None)] * len(requests)
        return list(zip(outcome.decisions, outcome.undos, strict=True))

    async def write_status(self, key: QuotaKey, build: Callable[[Obj], Obj | None], *, retries: int) -> StatusWrite:
        """One conditional write of a quota's status: the one way both writers (these
        reservations and the quota controller, `quota.status.quotastatus`) change it.

        `build(obj)` returns the object to PUT, built from `obj` (None: nothing to write);
        it runs only once this replica's claim watch has reached `obj`'s watermark. The
        first attempt builds from the newest object known, each later one from a fresh
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
            obj = await self._caught_up(key, fresh=attempt > 0)
            if obj is None:
                return StatusWrite()
            if obj is _LAGGING:
                return StatusWrite(lagging=True)
            body = build(obj)
            if body is None:
                return StatusWrite(read=obj)
            resource, namespace = quota_resource(key[0])
            try:
                written = await self.api.update_status(resource, body, namespace=namespace)
            except ApiError as err:
                if err.status == 409:
                    log.debug("conflict writing %s status (attempt %d)", shown(key), attempt + 1)
                    continue
                if err.status == 404:
                    self._objects.pop(key, None)
                    return StatusWrite()
                raise
            self._known(key, written)
            return StatusWrite(read=obj, written=written)
        return StatusWrite(conflicts=True)

    async def _caught_up(self, key: QuotaKey, *, fresh: bool) -> Obj | None:
        """The object to build from, once the claim watch reached its watermark (None:
        the quota is gone; `_LAGGING`: the watch did not get there within `catch_up`).

        No await may come between this returning and the body being built: the cache
        only moves forward, so what it reached stays reached."""
        obj = await self._get(key) if fresh else (self._objects.get(key) or await self._get(key))
        deadline = time.monotonic() + self.catch_up
        while obj is not None:
            record = parse_record(obj.get("status"))
            watches = ((self.progress, record.through, "claim"),
                       (self.namespace_progress, record.namespaces, "Namespace"))
            behind = [(progress, through, what) for progress, through, what in watches
                      if not progress.has_reached(through)]
            if not behind:
                return obj
            progress, through, what = behind[0]
            if not await progress.reached(through, timeout=max(deadline - time.monotonic(), 0.0)):
                log.warning("%s: the %s watch is at %s, behind the record's watermark %s after "
                            "%ss", shown(key), what, progress.version, through, self.catch_up)
                return _LAGGING
            # The watch may have brought a newer object meanwhile: build from the newest.
            obj = self._objects.get(key)
        return None

    async def _check(self, quota: DeviceQuota, request: Request) -> _Answer:
        """dryRun: the same decision, nothing written (so nothing to take back)."""
        obj = await self._caught_up((quota.namespace, quota.name), fresh=False)
        if obj is _LAGGING:
            return Decision(False, f'could not check {quota.kind} "{quota.name}": this replica\'s claim watch (or, '
                                   "on a ClusterDeviceQuota, Namespace watch) is behind the quota's record; retry"), None
        return (Decision(True) if obj is None else self._decide(obj, [request])[0].decisions[0]), None

    def _decide(self, obj: Obj, requests: list[Request]) -> tuple[Outcome, Plan | None]:
        # Synchronous from the usage read to the decision: the cache cannot move in between.
        namespaced = bool((obj.get("metadata") or {}).get("namespace"))
        quota = parse_device_quota(obj) if namespaced else parse_cluster_device_quota(obj)
        known = self.ledger.quota(quota.namespace, quota.name)
        message = None
        if known is None or _counted_as(known) != _counted_as(quota):
            # An object read from the API server (after a conflict) may be newer than this
            # replica's quota watch: the ledger's usage is then of another selector or scope
            # (a team just given a namespace would count none of its claims). Releases only.
            message = (f'could not persist the reservation on {quota.kind} "{quota.name}": this replica has not '
                       "counted its newest spec (namespaceSelector, scope or pricing) yet; retry")
        elif quota.cluster and self.ledger.recounting(quota.name):
            message = recounting_message(quota.name)  # a partial usage (`kube.recounts`): releases only
        if message is not None:
            releases = [r for r in requests if r.op == "release"]
            outcome = apply(quota, parse_record(obj.get("status")), releases, usage=Usage(), caches=self,
                            now=self.clock(), ttl=self.ttl, namespaces=self.namespaces_seen() if quota.cluster else None)
            return replace(outcome, decisions=tuple(Decision(True) if r.op == "release" else Decision(False, message)
                                                    for r in requests), undos=(None,) * len(requests)), None
        usage = self.ledger.usage(quota.namespace, quota.name)
        quota = self.ledger.in_force(quota)  # a window's hard, when one is in force (`quota.quotas.windows`)
        # An allocation checked whole: its claim's own count, from the same ledger read.
        requests = [replace(r, credit=self.ledger.counted(ClaimRef(r.own), quota)) if r.own else r for r in requests]
        if self.leases.leasable(quota):
            key = (quota.namespace, quota.name)
            return renew(self.leases.leases.get(key), key=self.leases.key(key), holder=self.leases.holder,
                         quota=quota, record=parse_record(obj.get("status")), requests=requests, usage=usage,
                         caches=self, now=self.clock(), ttl=self.ttl, sizing=self.leases.sizing,
                         version=version_of(obj))
        return apply(quota, parse_record(obj.get("status")), requests, usage=usage, caches=self, now=self.clock(),
                     ttl=self.ttl, namespaces=self.namespaces_seen() if quota.cluster else None), None

    async def _get(self, key: QuotaKey) -> Obj | None:
        try:
            resource, namespace = quota_resource(key[0])
            obj = await self.api.get(resource, key[1], namespace=namespace)
        except ApiError as err:
            if err.status == 404:
                self._objects.pop(key, None)
                return None
            raise
        self._known(key, obj)
        return obj


# A sentinel object: `_caught_up`'s "the watch did not reach the watermark in time".
_LAGGING: Obj = {}


def _counted_as(quota: DeviceQuota) -> tuple[object, ...]:
    """What the ledger's usage of `quota` depends on (`quota.accounting.ledgerentry.usage_scope`), and a
    team's members (its selector)."""
    return (*usage_scope(quota), quota.selector)


def _kind(key: QuotaKey) -> str:
    return KIND if key[0] else CLUSTER_KIND
