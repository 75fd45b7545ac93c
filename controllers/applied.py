"""The leader copies each team quota's numbers into its member namespaces, as
AppliedClusterDeviceQuotas, so tenants read their team's budget where they may read.

Neighbours: `controllers.quotas.QuotaController` tells `published` each ClusterDeviceQuota
as it stands after each of its reconciles (written or already current; None once
deleted); `quota.applied` says what each member's copy holds; `commands.wiring` runs
`AppliedQuotas.run` beside the quota controller while this replica leads.

What it writes: one object per (team, member namespace `status.namespaces` lists), named
after the team, owned by it (garbage collection deletes them with the team), written by
server-side apply (creates or updates) only when its content differs from what this
replica last wrote or found; deleted when the namespace leaves the team. On start it lists
the existing ones (by the managed-by label) so that a new leader writes only what changed
and deletes the copies of namespaces that left meanwhile; and again each resync period,
so that a copy deleted or edited by hand is written again.

The bound: a team's totals move with every claim event in any member, and every member's
copy holds them, so a change costs one write per member. Two things keep that bounded:
a team is written at most once per `interval` (2 s: the events in between coalesce into
the newest status), and the writes of all teams together at most `rate` per second on
average (50: after a round of k writes the next round waits k / rate seconds), `concurrency`
(4) at a time. A team of 500 namespaces under constant churn is thus written every 10 s,
500 small writes, 50 a second; the copies lag the team quota by at most
max(interval, members / rate) plus the write time. Members beyond the breakdown's
`MAX_NAMESPACES` (`quota.quotastatus`) get no copy.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from kube.api import ApiError, KubeApi
from kube.resources import APPLIED_QUOTAS as APPLIED
from quota.applied import MANAGED_BY, applied_quotas
from quota.devicequota import QuotaError
from quota.raw import Obj, as_map

__all__ = ["APPLIED", "AppliedQuotas"]

log = logging.getLogger(__name__)

FIELD_MANAGER = "dra-quota"
_FAILURES = (ApiError, aiohttp.ClientError, TimeoutError, OSError)
_RETRY_AFTER_FAILURE = 2.0

# What decides whether a copy must be written: its owner's uid and its status.
Written = tuple[Any, Any]


def _content(body: Obj) -> Written:
    owners = as_map(body.get("metadata")).get("ownerReferences") or []
    return (tuple(as_map(o).get("uid") for o in owners), body.get("status"))


class AppliedQuotas:
    def __init__(self, api: KubeApi, *, leading: Callable[[], bool], interval: float = 2.0, rate: float = 50.0,
                 concurrency: int = 4, resync: float = 300.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.leading = leading
        # Seconds between two lists of what is there: a copy someone deleted or edited is
        # written again at the team's next publication (the quota controller's resync).
        self.resync = resync
        self.interval = interval
        self.rate = rate
        self.concurrency = concurrency
        self.clock = clock
        self.writes = 0  # applies and deletes that landed (tests and logs read it)
        self._teams: dict[str, Obj | None] = {}  # the newest published object of each team not written yet
        self._due: dict[str, float] = {}  # team -> when it may be written again
        self._have: dict[tuple[str, str], Written] = {}  # (team, namespace) -> what is there
        self._budget = 0.0  # when the next round may start (`rate`)
        self._wake = asyncio.Event()

    def published(self, name: str, team: Obj | None) -> None:
        """ClusterDeviceQuota `name` as it stands now (None: deleted)."""
        self._teams[name] = team
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
            ready = [name for name in self._teams if self._due.get(name, 0.0) <= now]
            if not ready:
                await self._sleep(min((self._due[n] for n in self._teams), default=next_list))
                continue
            for name in sorted(ready):
                if (wait := self._budget - self.clock()) > 0:
                    await asyncio.sleep(wait)
                team = self._teams.pop(name, None)
                written = await self._round(name, team, semaphore)
                now = self.clock()
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
        have = {}
        for obj in listing.items:
            meta = as_map(obj.get("metadata"))
            have[(str(meta.get("name")), str(meta.get("namespace")))] = _content(obj)
        self._have = have

    async def _round(self, name: str, team: Obj | None, semaphore: asyncio.Semaphore) -> int:
        """Bring team `name`'s copies in line with `team`; the writes it made."""
        if team is None:  # deleted: garbage collection deletes its copies (their owner is gone)
            for key in [k for k in self._have if k[0] == name]:
                del self._have[key]
            self._due.pop(name, None)
            return 0
        try:
            desired = applied_quotas(team)
        except QuotaError as err:
            log.warning("AppliedClusterDeviceQuotas of %s not written: %s", name, err)
            return 0
        gone = [ns for (team_name, ns) in self._have if team_name == name and ns not in desired]
        changed = {ns: body for ns, body in desired.items() if self._have.get((name, ns)) != _content(body)}
        if not self.leading():
            return 0
        results = await asyncio.gather(*(self._apply(name, ns, body, semaphore) for ns, body in changed.items()),
                                       *(self._delete(name, ns, semaphore) for ns in gone))
        if not all(results):  # look again soon, with whatever is newest then
            self._teams.setdefault(name, team)
            self._due[name] = self.clock() + _RETRY_AFTER_FAILURE
        done = sum(results)
        self.writes += done
        return done

    async def _apply(self, name: str, namespace: str, body: Obj, semaphore: asyncio.Semaphore) -> bool:
        async with semaphore:
            try:
                await self.api.patch(APPLIED, name, body, patch_type="apply", namespace=namespace,
                                     field_manager=FIELD_MANAGER, force=True)
            except _FAILURES as err:
                log.warning("cannot write AppliedClusterDeviceQuota %s/%s: %s", namespace, name,
                            err or type(err).__name__)
                return False
        self._have[(name, namespace)] = _content(body)
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
        self._have.pop((name, namespace), None)
        return True
