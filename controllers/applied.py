"""The leader copies each team quota's numbers into its member namespaces, as
AppliedClusterDeviceQuotas, so tenants read their team's budget where they may read.

Neighbours: `controllers.quotas.QuotaController` tells `published` each ClusterDeviceQuota
as it stands after each of its reconciles (written or already current; None once
deleted); `quota.status.applied` says what each member's copy holds and `quota.status.appliedplan`
which copies to write now and why; `commands.wiring` runs `AppliedQuotas.run` beside the
quota controller while this replica leads and exports `writes`
(`draquota_applied_quota_writes_total`).

What it writes: one object per (team, member namespace `status.namespaces` lists), named
after the team, owned by it (garbage collection deletes them with the team), written by
server-side apply (creates or updates) only when its content differs from what this
replica last wrote or found (the `teamObservedAt` stamp aside); deleted when the namespace
leaves the team. On start it lists the existing ones (by the managed-by label) so that a new
leader writes only what changed and deletes the copies of namespaces that left meanwhile;
and again each resync period, so that a copy deleted or edited by hand is written again.

The bound (the tenant budget: what a tenant's claim costs never grows with its team): a
claim event in namespace X writes X's copy only (its own part changed; `own`). The team's
totals in the other members' copies are refreshed in the background, each copy at most once
per `refresh` period (60 s) after its totals were last written (`refresh`), at once when an
admin changed them (spec, members; `spec`), and a flip (exceeded, a headroom reaching 0)
brings the refresh forward at most once per period per team. A round refreshes at most
rate x interval copies (100), the longest stale first, the rest in the next rounds: a big
team's refresh is spread, and the own writes of every team get in between; the copies
written in different rounds are then due in different rounds. So a team of M members under
constant churn from one tenant costs about 1 / `interval` own writes a second plus M per
period, not M per event; a team with no change costs nothing. Under those, the same two
rate bounds as before: a team is handled at most once per `interval` (2 s: the events in
between coalesce into the newest status), and the writes of all teams together at most
`rate` per second on average (50: after a round of k writes the next round waits k / rate
seconds), `concurrency` (4) at a time. A copy's totals thus lag the team quota by at most
`refresh` plus members / rate; its own part by `interval` plus the writes. Members beyond
the breakdown's `MAX_NAMESPACES` (`quota.status.quotastatus`) get no copy: the team's
`NamespacesListed` condition says so (and the quota controller logs it when it flips).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime

import aiohttp

from kube.api import KubeApi
from kube.apierror import ApiError
from kube.resources import APPLIED_QUOTAS as APPLIED
from quota.quotas.devicequota import QuotaError
from quota.status.applied import MANAGED_BY, applied_quotas
from quota.status.appliedplan import Copy, Reason, copy_of, plan
from quota.values.raw import Obj, as_map

__all__ = ["APPLIED", "AppliedQuotas"]

log = logging.getLogger(__name__)

FIELD_MANAGER = "dra-quota"
_FAILURES = (ApiError, aiohttp.ClientError, TimeoutError, OSError)
_RETRY_AFTER_FAILURE = 2.0
_STAMP = "%Y-%m-%dT%H:%M:%SZ"


def _utcnow() -> datetime:
    return datetime.now(UTC)


class AppliedQuotas:
    def __init__(self, api: KubeApi, *, leading: Callable[[], bool], interval: float = 2.0, rate: float = 50.0,
                 concurrency: int = 4, resync: float = 300.0, refresh: float = 60.0, batch: int | None = None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], datetime] = _utcnow) -> None:
        self.api = api
        self.leading = leading
        # Seconds between two lists of what is there: a copy someone deleted or edited is
        # written again at the round each team gets after the list.
        self.resync = resync
        self.interval = interval
        self.rate = rate
        self.concurrency = concurrency
        self.refresh = refresh  # a copy's team totals are written at most this often, but for admin changes
        # Refreshes per round (the rest wait for the next): what the rate allows in an interval.
        self.batch = batch if batch is not None else max(1, int(rate * interval))
        self.clock = clock
        self.wall = wall
        self.writes: Counter[Reason] = Counter()  # applies and deletes that landed, by reason
        self._latest: dict[str, Obj] = {}  # each team as last published
        self._pending: set[str] = set()  # teams published since their last round (or deleted)
        self._due: dict[str, float] = {}  # team -> when it may be handled again (`interval`)
        self._stale: dict[str, float] = {}  # team -> when a copy left stale may be refreshed
        self._flipped: dict[str, float] = {}  # team -> when a flip last brought its refresh forward
        self._have: dict[str, dict[str, Copy]] = {}  # team -> namespace -> what is there
        self._budget = 0.0  # when the next round may start (`rate`)
        self._wake = asyncio.Event()

    def published(self, name: str, team: Obj | None) -> None:
        """ClusterDeviceQuota `name` as it stands now (None: deleted)."""
        if team is None:
            self._latest.pop(name, None)
        else:
            self._latest[name] = team
        self._pending.add(name)
        self._wake.set()

    async def run(self) -> None:
        """Write until cancelled; lists the existing copies first. Without the CRD (an
        upgrade that has not installed it yet) it writes nothing, and says so."""
        while True:
            try:
                await self._list()
                break
            except ApiError as err:
                if err.status in (403, 404):
                    log.warning("AppliedClusterDeviceQuotas not written (tenants do not see their team quotas): %s",
                                err)
                    return
                log.warning("cannot list AppliedClusterDeviceQuotas (retried in %ss): %s", _RETRY_AFTER_FAILURE, err)
            except _FAILURES as err:
                log.warning("cannot list AppliedClusterDeviceQuotas (retried in %ss): %s", _RETRY_AFTER_FAILURE,
                            err or type(err).__name__)
            await asyncio.sleep(_RETRY_AFTER_FAILURE)
        semaphore = asyncio.Semaphore(self.concurrency)
        next_list = self.clock() + self.resync
        while True:
            now = self.clock()
            if now >= next_list:
                next_list = now + self.resync
                try:
                    await self._list()
                except _FAILURES as err:
                    log.warning("cannot list AppliedClusterDeviceQuotas: %s", err or type(err).__name__)
            # A team is ready once its interval passed: at once when published, else when a
            # stale copy falls due.
            wanted = {name: max(self._due.get(name, 0.0), 0.0 if name in self._pending else self._stale[name])
                      for name in self._pending | self._stale.keys()}
            ready = sorted(name for name, when in wanted.items() if when <= now)
            if not ready:
                await self._sleep(min(wanted.values(), default=next_list))
                continue
            for name in ready:
                if (wait := self._budget - self.clock()) > 0:
                    await asyncio.sleep(wait)
                written = await self._round(name, semaphore)
                now = self.clock()
                if name in self._latest:
                    self._due[name] = now + self.interval
                self._budget = max(self._budget, now) + written / self.rate

    async def _sleep(self, until: float) -> None:
        self._wake.clear()
        try:
            async with asyncio.timeout(max(until - self.clock(), 0.0)):
                await self._wake.wait()
        except TimeoutError:
            pass

    async def _list(self) -> None:
        key, value = MANAGED_BY
        listing = await self.api.list(APPLIED, label_selector=f"{key}={value}")
        now, wall = self.clock(), self.wall()
        have: dict[str, dict[str, Copy]] = {}
        for obj in listing.items:
            meta = as_map(obj.get("metadata"))
            have.setdefault(str(meta.get("name")), {})[str(meta.get("namespace"))] = copy_of(obj, now - _age(obj, wall))
        self._have = have
        self._stale.update({name: 0.0 for name in self._latest})  # compare each team with what is there

    async def _round(self, name: str, semaphore: asyncio.Semaphore) -> int:
        """Bring team `name`'s copies in line with its newest publication; the writes it made."""
        self._pending.discard(name)
        self._stale.pop(name, None)
        team = self._latest.get(name)
        if team is None:  # deleted: garbage collection deletes its copies (their owner is gone)
            for table in (self._have, self._due, self._flipped):
                table.pop(name, None)
            return 0
        try:
            desired = applied_quotas(team, observed_at=self.wall().strftime(_STAMP), refresh_seconds=self.refresh)
        except QuotaError as err:
            log.warning("AppliedClusterDeviceQuotas of %s not written: %s", name, err)
            return 0
        now = self.clock()
        decided = plan(desired, self._have.get(name, {}), now=now, refresh=self.refresh,
                       flip_allowed=now >= self._flipped.get(name, float("-inf")) + self.refresh,
                       max_refresh=self.batch)
        if not self.leading():
            return 0
        if decided.flipped:
            self._flipped[name] = now
        results = await asyncio.gather(
            *(self._apply(name, ns, desired[ns], reason, semaphore) for ns, reason in decided.writes.items()),
            *(self._delete(name, ns, semaphore) for ns in decided.deletes))
        due = [decided.due] if decided.due is not None else []
        if not all(results):  # look again soon, with whatever is newest then
            due.append(self.clock() + _RETRY_AFTER_FAILURE)
        if due:
            self._stale[name] = min(due)
        return sum(results)

    async def _apply(self, name: str, namespace: str, body: Obj, reason: Reason, semaphore: asyncio.Semaphore) -> bool:
        async with semaphore:
            try:
                await self.api.patch(APPLIED, name, body, patch_type="apply", namespace=namespace,
                                     field_manager=FIELD_MANAGER, force=True)
            except _FAILURES as err:
                log.warning("cannot write AppliedClusterDeviceQuota %s/%s: %s", namespace, name,
                            err or type(err).__name__)
                return False
        self._have.setdefault(name, {})[namespace] = copy_of(body, self.clock())
        self.writes[reason] += 1
        log.debug("wrote AppliedClusterDeviceQuota %s/%s (%s)", namespace, name, reason)
        return True

    async def _delete(self, name: str, namespace: str, semaphore: asyncio.Semaphore) -> bool:
        async with semaphore:
            try:
                await self.api.delete(APPLIED, name, namespace=namespace)
            except ApiError as err:
                if err.status != 404:
                    log.warning("cannot delete AppliedClusterDeviceQuota %s/%s: %s", namespace, name, err)
                    return False
            except _FAILURES as err:
                log.warning("cannot delete AppliedClusterDeviceQuota %s/%s: %s", namespace, name,
                            err or type(err).__name__)
                return False
        self._have.get(name, {}).pop(namespace, None)
        self.writes["delete"] += 1
        log.debug("deleted AppliedClusterDeviceQuota %s/%s (delete)", namespace, name)
        return True


def _age(obj: Obj, now: datetime) -> float:
    """Seconds since a found copy's totals were read (infinite when it does not say: an
    older copy, refreshed at its team's next round)."""
    stamp = as_map(obj.get("status")).get("teamObservedAt")
    try:
        return max(0.0, (now - datetime.strptime(str(stamp), _STAMP).replace(tzinfo=UTC)).total_seconds())
    except ValueError:
        return float("inf")
