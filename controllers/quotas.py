"""The quota controller: writes each (Cluster)DeviceQuota's usage to its status, on the leader only.

Neighbours: `quota.status.quotastatus` computes the status (and says how this writer and the
webhooks' `kube.quotawriter` share it); `quota.accounting.ledger` is the usage the webhook's
caches (`kube.claimstore`) already keep from the claim watch: there is one accountant, and
this module only publishes what it counts. `controllers.leader` runs `QuotaController.run`
while this replica leads and cancels it the moment it stops; `commands.serve` wires the
caches' change notifications to `changed`: the quotas each event moved, as the
ledger's mutations return them (`kube.caches`, `kube.claimstore`).

When it writes: at each boundary of a quota's windows (`status.nextChange`), on start (every quota, after the caches synced: a full list), on
every change the caches report for a quota (claim, quota and Workload events, and
for a ClusterDeviceQuota a Namespace relabelled into or out of it),
debounced so a burst of claim events becomes one write per quota (and while admissions
into a quota are being written, that quota at most every `min_interval`, 0.5 s), when the
earliest persisted reservation of a quota expires (so an entry whose claim never appeared is
dropped after the TTL), and for every quota each resync period (a missed or failed
write is repaired without any event). A quota is written only when its status differs
from what it would write.

After each reconcile of a ClusterDeviceQuota it tells `published` the object as it now
stands, whether or not a write was needed: `controllers.applied` copies the team's
numbers into its member namespaces, with its own, slower, bound on writes.

Each pass (the quotas marked since the last one, written concurrently) is timed, from
after the debounce to its last write, and told to `observe` (the metric
`draquota_reconcile_duration_seconds`).

Fencing: each write is a PUT of the status with the resourceVersion it was computed
from, through `Reservations.write_status` (`kube.statuswriter`), the one conditional write both writers use
(it first waits for this replica's claim watch to reach the record's watermark; 409
when a webhook or anyone wrote in between: re-read, recompute, up to 3 times, then
again in the next round), and is sent only while `leading()` holds; a replica that
stops leading has its run cancelled by the elector.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

import aiohttp

from kube.apierror import ApiError
from kube.events import uid_of
from kube.quotawriter import Reservations
from quota.accounting.ledger import Ledger, QuotaKey, shown
from quota.accounting.reservationrecord import parse_record
from quota.quotas.devicequota import DeviceQuota, QuotaError, Usage, parse_cluster_device_quota, parse_device_quota
from quota.status.quotastatus import InForce, boundary, desired_status, in_force, next_change, next_expiry
from quota.values.raw import Obj

__all__ = ["QuotaController"]

log = logging.getLogger(__name__)

_FAILURES = (ApiError, aiohttp.ClientError, TimeoutError, OSError)
_RETRY_AFTER_FAILURE = 1.0  # seconds before a quota whose write failed is tried again


class QuotaController:
    def __init__(self, ledger: Ledger, reservations: Reservations, *,
                 leading: Callable[[], bool], resync: float = 300.0, debounce: float = 0.1,
                 min_interval: float = 0.5, retries: int = 3,
                 concurrency: int = 8, clock: Callable[[], float] | None = None,
                 exceeded: Callable[[str, str, str, str], None] = lambda namespace, name, uid, message: None,
                 observe: Callable[[float], None] = lambda seconds: None,
                 published: Callable[[str, Obj | None], None] = lambda name, team: None,
                 boundary: Callable[[str, str, str, str, str], None] = lambda ns, name, uid, reason, message: None,
                 ) -> None:
        self.ledger = ledger
        self.reservations = reservations
        self.leading = leading
        self.resync = resync
        self.debounce = debounce
        # Seconds between two writes of one quota's status while admissions into it are
        # being written: in a burst of creates every claim event changes `reserved`, and
        # each write of the whole status takes its turn with the admissions' own writes of
        # that quota (`Reservations.write_status`); at the debounce alone (0.1 s) a third of
        # a burst's status writes were this controller's. Otherwise (allocations landing,
        # deletions) the debounce alone: `used` follows an allocation within it.
        self.min_interval = min_interval
        self.retries = retries
        # The reservations' clock: an entry's expiry is judged by the one clock that wrote it.
        self.clock = clock or reservations.clock
        self.writes = 0  # status writes that landed (the logs report it per quota)
        self.passes = 0  # reconcile passes completed: what "it looked and did nothing" is measured by
        # Told (namespace, name, uid, message) when a write turns a quota's Exceeded
        # condition True: `commands.serve` records a QuotaExceeded Event on the DeviceQuota
        # (namespace "": the ClusterDeviceQuota, e.g. a namespace joined a full team; the
        # Event lives in `default`), with its uid, which `kubectl describe` selects Events by.
        self.exceeded = exceeded
        # Told (namespace, name, uid, reason, message) when a write changes the hard in force
        # of a quota with windows (`quota.status.quotastatus.boundary`): a window opened or closed.
        # The leader writes each boundary's status once, so each boundary makes one Event.
        self.boundary = boundary
        # Told the seconds of each reconcile pass (`webhook.metrics`' reconcile histogram).
        self.observe = observe
        # Told each ClusterDeviceQuota as it stands after its reconcile (None: deleted):
        # `controllers.applied` copies its numbers into the member namespaces.
        self.published = published
        self._concurrency = concurrency
        self._dirty: set[QuotaKey] = set()
        self._timers: dict[QuotaKey, float] = {}  # wall time to look at a quota again
        self._written: dict[QuotaKey, float] = {}  # wall time of each quota's last write
        # Each quota with windows: its windows' state (`quota.status.quotastatus.in_force`) for the
        # quota as parsed, kept until that state's next change (at most an hour): a schedule
        # opening every minute costs thousands of steps, and a burst writes a quota twice a second.
        self._windows: dict[QuotaKey, tuple[DeviceQuota, float, InForce | None]] = {}
        self._wake = asyncio.Event()

    # -- told by the caches (synchronous: called from reflector callbacks) -----------------

    def changed(self, keys: Iterable[QuotaKey] | None) -> None:
        """Something that counts for these quotas changed (None: for any); a quota gone
        from the ledger has no status left to write."""
        if keys is None:
            known = [(q.namespace, q.name) for q in self.ledger.quotas()]
        else:
            known = [k for k in keys if self.ledger.quota(*k) is not None]
        if known:
            self._mark(known)
            self._wake.set()

    def _mark(self, keys: Iterable[QuotaKey]) -> None:
        self._dirty.update(keys)

    # -- the loop -------------------------------------------------------------------------

    async def run(self) -> None:
        """Reconcile until cancelled. Start it only once the caches have synced."""
        self.changed(None)
        next_resync = time.monotonic() + self.resync
        semaphore = asyncio.Semaphore(self._concurrency)
        while True:
            await self._sleep_until(next_resync)
            if time.monotonic() >= next_resync:
                next_resync = time.monotonic() + self.resync
                self._mark((q.namespace, q.name) for q in self.ledger.quotas())
            now = self.clock()
            due = [k for k, at in self._timers.items() if at <= now]
            for key in due:
                del self._timers[key]
            self._mark(due)
            if not self._dirty:
                continue
            # Debounce: the events of one burst (a scheduler allocating many claims, a
            # namespace deleted) land in this window and go out as one write per quota.
            await asyncio.sleep(self.debounce)
            keys, self._dirty = self._postponed(self._dirty), set()
            if not keys:
                continue

            async def one(key: QuotaKey) -> None:
                async with semaphore:
                    await self._reconcile_safely(key)

            started = time.monotonic()
            await asyncio.gather(*(one(k) for k in sorted(keys)))
            self.passes += 1
            self.observe(time.monotonic() - started)

    def _postponed(self, keys: set[QuotaKey]) -> set[QuotaKey]:
        """`keys` but those admissions are writing that this controller wrote less than
        `min_interval` ago: those are looked at again once it has passed (a timer), with
        whatever changed meanwhile."""
        now = self.clock()
        due = set()
        for key in keys:
            at = self._written.get(key, float("-inf")) + self.min_interval
            if at <= now or not self.reservations.admitting(key):
                due.add(key)
            else:
                self._timers[key] = min(self._timers.get(key, float("inf")), at)
        return due

    async def _sleep_until(self, next_resync: float) -> None:
        if self._dirty:
            self._wake.clear()
            return
        timeout = next_resync - time.monotonic()
        if self._timers:
            timeout = min(timeout, min(self._timers.values()) - self.clock())
        try:
            async with asyncio.timeout(max(timeout, 0.0)):
                await self._wake.wait()
        except TimeoutError:
            pass
        self._wake.clear()

    async def _reconcile_safely(self, key: QuotaKey) -> None:
        try:
            await self.reconcile(key)
        except _FAILURES as err:
            log.warning("cannot write the status of %s (retried in %ss): %s",
                        shown(key), _RETRY_AFTER_FAILURE, err or type(err).__name__)
            self._timers[key] = min(self._timers.get(key, float("inf")), self.clock() + _RETRY_AFTER_FAILURE)

    async def reconcile(self, key: QuotaKey) -> bool:
        """Bring one quota's status up to date; True when a write landed."""

        def build(obj: Obj) -> Obj | None:
            body = self._desired(key, obj)
            if body is not None and not self.leading():
                log.info("not leading: %s status left to the next leader", shown(key))
                return None
            return body

        result = await self.reservations.write_status(key, build, retries=self.retries)
        if result.lagging:
            # Our claim watch is behind the record's watermark: counting from it could
            # miss a claim another writer already counts from its own (quota.accounting.reservations).
            self._timers[key] = min(self._timers.get(key, float("inf")), self.clock() + _RETRY_AFTER_FAILURE)
            return False
        if result.conflicts:
            log.info("%s: %d conflicts in a row, trying again next round", shown(key), self.retries + 1)
            self._mark([key])
            self._wake.set()
            return False
        if not key[0]:
            self.published(key[1], result.written if result.written is not None else result.read)
        if result.read is None:
            self._written.pop(key, None)
            self._windows.pop(key, None)
            return False  # deleted
        if result.written is None:
            return False  # nothing to write
        self.writes += 1
        self._written[key] = self.clock()
        status = result.written.get("status") or {}
        now_exceeded = _exceeded(status)
        if now_exceeded is not None and _exceeded(result.read.get("status") or {}) is None:
            self.exceeded(key[0], key[1], uid_of(result.written), now_exceeded)
        if (event := boundary(result.read.get("status") or {}, status)) is not None:
            self.boundary(key[0], key[1], uid_of(result.written), *event)
        _log_listed(key, result.read.get("status") or {}, status)
        log.debug("%s status: used %s, reserved %s, claims %s", shown(key),
                  status.get("used"), status.get("reserved"), status.get("claims"))
        return True

    def _desired(self, key: QuotaKey, obj: Obj) -> Obj | None:
        """`obj` with the status it should have, or None when it already has it.

        Synchronous from the ledger read to the result: no event can land in between.
        """
        try:
            quota = parse_device_quota(obj) if key[0] else parse_cluster_device_quota(obj)
        except QuotaError as err:
            log.warning("skipping %s: %s", shown(key), err)
            return None
        if quota.cluster and self.ledger.recounting(quota.name):
            return None  # its usage is partial until the recount ends, which tells `changed` (`kube.recounts`)
        record = parse_record(obj.get("status"))
        now = self.clock()
        status = desired_status(obj, quota, record, usage=self.ledger.usage(quota.namespace, quota.name),
                                caches=self.reservations, now=now, members=self._members(quota),
                                namespaces=self.reservations.namespaces_seen() if quota.cluster else None,
                                windows=self._in_force(key, quota, now))
        # Wake at the earliest entry's expiry and at the next boundary of its windows: the
        # status changes then with no event to say so. One timer per quota.
        for at in (next_expiry(record, now), next_change(status)):
            if at is not None:
                self._timers[key] = min(self._timers.get(key, float("inf")), at)
        return None if status == (obj.get("status") or {}) else {**obj, "status": status}


    def _in_force(self, key: QuotaKey, quota: DeviceQuota, now: float) -> InForce | None:
        kept = self._windows.get(key)
        if kept is not None and kept[0] == quota and now < kept[1]:
            return kept[2]
        windows = in_force(quota, now)
        if windows is None:
            self._windows.pop(key, None)
            return None
        change = windows.state.next_change
        self._windows[key] = (quota, min(now + 3600.0, change.timestamp() if change else now + 3600.0), windows)
        return windows

    def _members(self, quota: DeviceQuota) -> list[tuple[str, Usage]] | None:
        """A team's breakdown: each member namespace's part (`Ledger.usage_in`)."""
        if not quota.cluster:
            return None
        return [(ns, self.ledger.usage_in(quota.name, ns)) for ns in self.ledger.members(quota.name)]


def _log_listed(key: QuotaKey, before: Obj, after: Obj) -> None:
    """One line when a team's breakdown starts or stops leaving members out of
    `status.namespaces` (`NamespacesListed`): at the write that flips the condition, not
    at each write after it, so a team past the cap does not log at every admission."""
    was, now = _condition(before, "NamespacesListed"), _condition(after, "NamespacesListed")
    if now is None or was is not None and was.get("status") == now.get("status"):
        return
    if now.get("status") == "False":
        log.warning("%s: %s", shown(key), now.get("message"))
    elif was is not None:
        log.info("%s: %s", shown(key), now.get("message"))


def _condition(status: Obj, kind: str) -> Obj | None:
    for condition in status.get("conditions") or []:
        if isinstance(condition, dict) and condition.get("type") == kind:
            return condition
    return None


def _exceeded(status: Obj) -> str | None:
    """The message of a True Exceeded condition, else None."""
    condition = _condition(status, "Exceeded")
    return None if condition is None or condition.get("status") != "True" else str(condition.get("message") or "")
