"""Reservations persisted on DeviceQuota and ClusterDeviceQuota status before a claim is admitted.

Neighbours: `quota.reservations` holds the record's format, the watermark protocol
(read its docstring first) and the pure decision; `webhook.claimreview` calls
`Reservations.admit` on a claim CREATE and `controllers.kueue` on a Workload's check; the
`kube.caches` stores feed `observe` (every DeviceQuota the watch delivers), the
claim store's versions and `claim_deleted` (claims the watch saw go), and the claim
reflector moves `progress`; `quota.ledger` gives the usage this replica's claim cache
counts; the quota controller (`controllers.quotas`) writes through `write_status` too.

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

Several quotas per claim (its namespace's DeviceQuotas and the ClusterDeviceQuotas
selecting it): Kubernetes has no multi-object transaction, so the quotas are reserved
one at a time in key order, team quotas (no namespace) first, then by name (a fixed
total order, so two claims never hold each other's first quota while waiting on the
second) and the ones already reserved
are released if a later one denies or fails (an allocation's excess is taken back by its
`quota.reservations.Undo`: its entry may be another attempt's too, `quota.excess`).
Until that release lands the claim holds
capacity it will not use: other claims may be denied meanwhile (never over-committed),
and a release that fails is repaired by the entry's expiry.

Leases (`quota.headroom`, `kube.leasebook`): while a DeviceQuota is far from `hard`, a
claim is admitted under this process's lease on it, with no write; every write of that
quota's status by this process settles and re-sizes the lease (`renew`), and the book
follows the write's fate (landed, not written, or unknown: the key is retired).

A claim's entry is never released when the claim is deleted at admission (a later
admission plugin may deny the DELETE): it goes once a cache saw the claim, and the
claim then stops counting when the watch delivers its deletion.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from kube.api import ApiError, KubeApi
from kube.leasebook import LeaseBook
from kube.resources import quota_resource
from kube.seen import Seen
from kube.watching import Progress
from quota.devicequota import (
    CLUSTER_KIND,
    KIND,
    Decision,
    DeviceQuota,
    Usage,
    parse_cluster_device_quota,
    parse_device_quota,
)
from quota.excess import parse_allocation_key
from quota.headroom import Plan, renew
from quota.ledger import Ledger, QuotaKey, recounting_message, shown, usage_scope
from quota.model import Charge, Namespace
from quota.raw import Obj
from quota.reservations import (Outcome, Record, Request, Source, Undo, apply, in_flight, parse_record, parse_version,
                                settle, status_fields)

__all__ = ["CONTENTION", "Reservations", "StatusWrite"]

log = logging.getLogger(__name__)

CONTENTION = "could not persist the reservation: too much contention; retry"
# A request's answer: its decision, and how to take an allowed allocation's excess back
# (`quota.reservations.Undo`; None for everything else).
_Answer = tuple[Decision, Undo | None]


@dataclass(slots=True)
class _Batch:
    pending: list[tuple[Request, asyncio.Future[_Answer]]] = field(default_factory=list)
    running: bool = False


@dataclass(frozen=True, slots=True)
class StatusWrite:
    """How one `Reservations.write_status` ended."""

    read: Obj | None = None  # the object the last body was built from; None: the quota is gone
    written: Obj | None = None  # what the API server stored; None: nothing was written
    conflicts: bool = False  # every attempt met a newer object
    lagging: bool = False  # this replica's claim (or Namespace) watch did not reach a watermark in time


class Reservations(Seen):
    """The persisted reservations of every DeviceQuota, written with optimistic concurrency.

    It is also this replica's `quota.reservations.Caches` (`kube.seen`): what its own
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
        # (`quota.reservations`, namespacesThrough) waits on the one, is raised to the other.
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
            if known_meta and known_meta.get("uid") != meta.get("uid"):
                self.leases.uncertain(key)  # another object of that name (a relist): the old one's lease went with it
            self._objects[key] = obj

    def drop(self, namespace: str, name: str) -> None:
        key = (Namespace(namespace), name)
        self._objects.pop(key, None)
        # The lease went with the object: a quota created again under that name holds
        # none, and no other replica counts it (its window may have seconds to run).
        self.leases.uncertain(key)
        lock = self._writing.get(key)
        if lock is not None and not lock.locked():
            del self._writing[key]

    def newest(self, namespace: str, name: str) -> Obj | None:
        """The newest DeviceQuota object known (the quota controller writes against it too)."""
        return self._objects.get((Namespace(namespace), name))

    def admitting(self, key: QuotaKey) -> bool:
        """Whether admissions into quota `key` are being written or wait to be (the quota
        controller then writes that quota less often: `controllers.quotas`)."""
        batch = self._batches.get(key)
        return batch is not None and (batch.running or bool(batch.pending))

    def pending(self, namespace: str, name: str) -> Charge:
        """What the quota's persisted entries add to this replica's ledger now, as the status
        shows it (`apply` also counts the leases, `quota.headroom`)."""
        obj = self._objects.get((Namespace(namespace), name))
        if obj is None:
            return Charge()
        return in_flight(settle(parse_record(obj.get("status")), self, now=self.clock()), self, leases=False)

    # -- admission --------------------------------------------------------------------

    async def admit(self, charges: Mapping[DeviceQuota, Charge], *, uid: str, claim: str,
                    dry_run: bool = False, series: str = "", source: Source = "Claim") -> Decision:
        """Reserve `charges` (quota -> charge) for `uid`: under this process's lease where one
        has room (`kube.leasebook`, no write), the rest in key order (module doc), all or
        nothing; `series` replaces earlier attempts (`quota.reservations.Request.series`)."""
        local: list[DeviceQuota] = []
        # Workloads, the scheduler's attempts and allocations' excesses (`quota.excess`): one entry each.
        if source == "Claim" and not series and parse_allocation_key(uid) is None:
            now = self.clock()
            local = [q for q in charges if self.leases.take(q, uid, charges[q], now, dry_run=dry_run)]
        try:
            decision = await self._admit_exact({q: c for q, c in charges.items() if q not in local}, uid=uid,
                                               claim=claim, dry_run=dry_run, series=series, source=source)
        except BaseException:
            for quota in local if not dry_run else ():
                self.leases.untake(quota, uid)
            raise
        if not decision.allowed:
            for quota in local if not dry_run else ():
                self.leases.untake(quota, uid)
            return decision
        if not dry_run:
            self.leases.stats.admitted["lease"] += len(local)
            self.leases.stats.admitted["exact"] += len(charges) - len(local)
        charged = sorted({*decision.charged, *(q.ref for q in local)},
                         key=lambda ref: ("" if "/" in ref else "~", ref))
        return replace(decision, charged=tuple(charged))

    async def _admit_exact(self, charges: Mapping[DeviceQuota, Charge], *, uid: str, claim: str,
                           dry_run: bool, series: str, source: Source) -> Decision:
        done: list[tuple[DeviceQuota, Undo | None]] = []
        warnings: list[str] = []
        warned_by: list[str] = []
        try:
            for quota in sorted(charges, key=lambda q: (q.namespace, q.name)):
                request = Request("reserve", uid, claim, charges[quota], series, source)
                decision, undo = await (self._check(quota, request) if dry_run else self._submit(quota, request))
                if not decision.allowed:
                    await self._compensate(done, uid)
                    return Decision(False, decision.message, (*warnings, *decision.warnings),
                                    denied_by=decision.denied_by)
                done.append((quota, undo))
                warnings.extend(decision.warnings)
                warned_by.extend(decision.warned_by)
        except asyncio.CancelledError:
            if not dry_run:
                # The review ran out of time (`webhook.server`): it is answered denied, so its
                # object is never created, but a write of its batch may still land. Release
                # it everywhere it may be held, queued behind that write, rather than leave
                # an orphan holding room for a TTL. An allocation's excess only where its
                # reserve's outcome is known: its key may hold another attempt's excess too
                # (`quota.excess`), so the one in flight is left to settle or expire.
                excess = parse_allocation_key(uid) is not None
                self._release_soon(done if excess else [(q, None) for q in charges], uid)
            raise
        return Decision(True, "", tuple(warnings), tuple(q.ref for q, _ in done), warned_by=tuple(warned_by))

    def _release_soon(self, quotas: list[tuple[DeviceQuota, Undo | None]], uid: str) -> None:
        task = asyncio.create_task(self._compensate(quotas, uid), name=f"release {uid}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def release(self, namespace: str, uid: str) -> None:
        """Remove `uid`'s entries from the quotas of `namespace` (and the team quotas) that
        hold one: only for an admission whose object will never be created (a Workload
        whose Ready could not be written), never for a claim DELETE (module doc)."""
        keys = [k for k, obj in self._objects.items()
                if k[0] in (namespace, "") and uid in ((obj.get("status") or {}).get("reservations") or {})]
        await asyncio.gather(*(self._release_one(k, uid) for k in keys))

    async def _compensate(self, quotas: list[tuple[DeviceQuota, Undo | None]], uid: str) -> None:
        """All or nothing: take `uid`'s reserves back from `quotas`; an allocation's excess by
        its `Undo`, so another attempt's on the same copy stays (`quota.excess`)."""
        await asyncio.gather(*(self._release_one((q.namespace, q.name), uid, undo) for q, undo in quotas))

    async def _release_one(self, key: QuotaKey, uid: str, undo: Undo | None = None) -> None:
        try:
            await self._submit_key(key, Request("release", uid, undo=undo))
        except Exception as err:  # noqa: BLE001 - the entry expires anyway
            log.warning("cannot release reservation %s on %s: %s; it expires after %ss",
                        uid, shown(key), err, self.ttl)

    # -- the per-quota batch ----------------------------------------------------------

    async def _submit(self, quota: DeviceQuota, request: Request) -> _Answer:
        return await self._submit_key((quota.namespace, quota.name), request)

    async def _submit_key(self, key: QuotaKey, request: Request) -> _Answer:
        future: asyncio.Future[_Answer] = asyncio.get_running_loop().create_future()
        batch = self._batches.setdefault(key, _Batch())
        batch.pending.append((request, future))
        if not batch.running:
            batch.running = True
            task = asyncio.create_task(self._drain(key, batch), name=f"reservations {shown(key)}")
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
        reservations and the quota controller, `quota.quotastatus`) change it.

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
            self._objects[key] = written
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
        if self.leases.leasable(quota):
            key = (quota.namespace, quota.name)
            return renew(self.leases.leases.get(key), key=self.leases.key(key), holder=self.leases.holder,
                         quota=quota, record=parse_record(obj.get("status")), requests=requests, usage=usage,
                         caches=self, now=self.clock(), ttl=self.ttl, sizing=self.leases.sizing)
        return apply(quota, parse_record(obj.get("status")), requests, usage=usage, caches=self, now=self.clock(),
                     ttl=self.ttl, namespaces=self.namespaces_seen() if quota.cluster else None), None

    async def close(self, *, patience: float = 2.0) -> None:
        """Shutdown, once no review is in flight: shrink each lease to what it admitted and
        has not settled (the rest of its room is not held idle until it expires), each
        write bounded by `patience`; then stop tending them."""
        for key in list(self.leases.leases):
            self.leases.idle(key)
            try:
                await asyncio.wait_for(self._write(key, []), patience)
            except Exception as err:  # noqa: BLE001 - it expires as an orphan, as after a SIGKILL
                log.warning("cannot release the lease on %s: %s", shown(key), err)
        await self.leases.close()

    async def _get(self, key: QuotaKey) -> Obj | None:
        try:
            resource, namespace = quota_resource(key[0])
            obj = await self.api.get(resource, key[1], namespace=namespace)
        except ApiError as err:
            if err.status == 404:
                self._objects.pop(key, None)
                return None
            raise
        self._objects[key] = obj
        return obj


# A sentinel object: `_caught_up`'s "the watch did not reach the watermark in time".
_LAGGING: Obj = {}


def _counted_as(quota: DeviceQuota) -> tuple[object, ...]:
    """What the ledger's usage of `quota` depends on (`quota.ledger.usage_scope`), and a
    team's members (its selector)."""
    return (*usage_scope(quota), quota.selector)


def _kind(key: QuotaKey) -> str:
    return KIND if key[0] else CLUSTER_KIND
