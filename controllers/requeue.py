"""Pods waiting on quota get their claim as soon as quota frees, not ~17 minutes later.

Neighbours: the claim cache (`kube.claimstore.ClaimStore`) calls `Requeuer.quota_freed`
with the namespace of each deleted claim (and, through `commands.wiring`, the namespaces
of its teams); `quota.status.requeueing` decides whose turn it is and how many writes it may
spend; `quota.objects.waiting` says which ResourceClaimTemplates a namespace's unscheduled Pods
wait on; this module touches them (annotation `draquota.io/requeued-at`), which makes the
resourceclaim controller re-queue every Pod using them at once (`quota.objects.waiting` module
doc). Without it, a Pod whose template claim we denied is retried by that controller
with exponential backoff (5 ms doubling, up to 1000 s): after an hour of waiting, quota
freed now would be noticed up to ~17 minutes later.

What one deleted claim may cost us, whatever the tenant's objects: one template write
now and the same write again after `settle` seconds (a replica whose claim watch lags
may deny the first retry), fair turns across namespaces (`quota.status.requeueing`); one
metadata-only list of unscheduled Pods per namespace looked at, in pages of `_PAGE`
(memory by the number of Pods, not their size), and at most `_READS` Pods read whole per
turn, each once per resourceVersion. A team of many namespaces is looked at `_LOOKS`
namespaces a turn, round the team, never with one list of the cluster's Pods.

Only the leader writes (`leading`), so replicas do not write N times. RBAC: list and get
pods, patch resourceclaimtemplates. What it was granted, what it wrote and what it still
owes are counted (`credits`, `writes`, `pending`: `webhook.metrics`), so an operator can
check the budget against the API server's audit log, and see when the requeue is idle.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Iterable
from datetime import datetime, timezone
from typing import Any

import aiohttp

from kube.api import METADATA_LIST, KubeApi
from kube.apierror import ApiError
from kube.resources import PODS, TEMPLATES
from quota.objects.waiting import Waiter, pick, pod_mark, waiting_templates
from quota.status.requeueing import Settles, Turn, Turns

__all__ = ["ANNOTATION", "Requeuer"]

log = logging.getLogger(__name__)

ANNOTATION = "draquota.io/requeued-at"
FIELD_MANAGER = "dra-quota"
_UNSCHEDULED = "spec.nodeName="
_PAGE = 100  # Pods' metadata per page of a list
_READS = 8  # Pods read whole per turn, those not read at their resourceVersion yet
_LOOKS = 8  # namespaces looked at per turn: the origin, then its teams' in turn
_ERRORS = (ApiError, aiohttp.ClientError, TimeoutError)


class Requeuer:
    def __init__(self, api: KubeApi, *, leading: Callable[[], bool] = lambda: True,
                 interval: float = 1.0, settle: float = 3.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._api = api
        self._leading = leading
        self._settle = settle
        self._clock = clock
        self._turns = Turns(interval=interval)
        self._settles = Settles()
        self._waiters: dict[str, dict[str, Waiter]] = {}  # namespace -> Pod uid -> what it waits on
        self._touched: dict[str, dict[str, float]] = {}  # namespace -> template -> when we last wrote it
        self._rounds: dict[str, int] = {}  # origin -> where its next look round its teams starts
        self._wake = asyncio.Event()
        self.credits = 0  # quota_freed calls: one per deleted claim
        self.writes = 0  # template patches sent
        self._busy = 0  # writes of the turn or settle in flight

    @property
    def pending(self) -> int:
        """Template writes still owed: credits not spent, settles due, writes in flight.
        0 once every deletion told so far has been answered and settled."""
        return self._turns.credits() + len(self._settles) + self._busy

    def quota_freed(self, namespace: str, team: Iterable[str] = ()) -> None:
        """Called from the caches' event handlers: never blocks, never raises. `team`: the
        namespaces the freed quota is shared with (a ClusterDeviceQuota's)."""
        if namespace:
            self.credits += 1
            self._turns.grant(namespace, team)
            self._wake.set()

    async def run(self) -> None:
        """Until cancelled: requeue the waiting Pods of every namespace where quota freed."""
        while True:
            now = self._clock()
            leading = self._leading()
            due = self._settles.take(now)
            if leading and due:
                await self._busy_with(sum(len(templates) for _, templates in due), self._touch_due(due))
            turn = self._turns.take(now)
            if turn is not None:
                if leading:
                    await self._busy_with(turn.writes, self._serve(turn))
                continue
            wake = [at for at in (self._turns.next_at(), self._settles.next_at()) if at is not None]
            timeout = max(0.0, min(wake) - self._clock()) if wake else None
            try:
                async with asyncio.timeout(timeout):  # not wait_for: 3.11's can drop a cancellation
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()

    async def _busy_with(self, writes: int, work: Coroutine[Any, Any, None]) -> None:
        self._busy = writes
        try:
            await work
        finally:
            self._busy = 0

    async def _touch_due(self, due: list[tuple[str, list[str]]]) -> None:
        for namespace, templates in due:
            await self._touch(namespace, templates)

    async def _serve(self, turn: Turn) -> None:
        """Spend `turn`'s writes on templates waited on in its origin, else round its teams."""
        left = turn.writes
        for namespace in self._looks(turn):
            templates = pick((await self._read_waiters(namespace)).values(),
                             self._touched.get(namespace, {}), left)
            if templates:
                await self._touch(namespace, templates)
                self._settles.add(namespace, templates, self._clock() + self._settle)
                left -= len(templates)
            if left <= 0:
                return

    def _looks(self, turn: Turn) -> list[str]:
        team = turn.scope[1:]
        if not team:
            return [turn.origin]
        start = self._rounds.get(turn.origin, 0) % len(team)
        looked = [team[(start + i) % len(team)] for i in range(min(len(team), _LOOKS - 1))]
        self._rounds[turn.origin] = start + len(looked)
        return [turn.origin, *looked]

    async def _read_waiters(self, namespace: str) -> dict[str, Waiter]:
        """The namespace's unscheduled Pods, each with the templates it waits on (as far as read)."""
        try:
            marks = (await self._api.list(PODS, namespace=namespace, field_selector=_UNSCHEDULED, limit=_PAGE,
                                          headers=(("Accept", METADATA_LIST),), transform=pod_mark)).items
        except _ERRORS as err:
            log.warning("cannot list the unscheduled Pods of namespace %s: %s", namespace, err)
            return {}
        known = self._waiters.get(namespace, {})
        waiters = {m["uid"]: known[m["uid"]] for m in marks
                   if m["uid"] in known and known[m["uid"]].version == m["version"]}
        unread = sorted((m for m in marks if m["uid"] not in waiters), key=lambda m: (m["created"], m["name"]))
        for mark in unread[:_READS]:
            waiter = await self._read_one(namespace, mark["name"])
            if waiter is not None:
                waiters[mark["uid"]] = waiter
        # Kept for the Pods still unscheduled and the templates still waited on, no more.
        waited = {t for w in waiters.values() for t in w.templates}
        touched = {t: at for t, at in self._touched.pop(namespace, {}).items() if t in waited}
        if touched:
            self._touched[namespace] = touched
        if waiters:
            self._waiters[namespace] = waiters
        else:
            self._waiters.pop(namespace, None)
        return waiters

    async def _read_one(self, namespace: str, name: str) -> Waiter | None:
        try:
            pod = await self._api.get(PODS, name, namespace=namespace)
        except _ERRORS as err:
            if not isinstance(err, ApiError) or err.status != 404:  # deleted since: waits on nothing
                log.warning("cannot read Pod %s/%s: %s", namespace, name, err)
            return None
        meta = pod.get("metadata") or {}
        return Waiter(version=str(meta.get("resourceVersion") or ""), created=str(meta.get("creationTimestamp") or ""),
                      templates=tuple(sorted(waiting_templates([pod]))))

    async def _touch(self, namespace: str, templates: list[str]) -> None:
        """Write our annotation on each of `templates`: every Pod using one is retried."""
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        touched = self._touched.setdefault(namespace, {})
        for name in templates:
            touched[name] = self._clock()
            self.writes += 1
            try:
                await self._api.patch(TEMPLATES, name, {"metadata": {"annotations": {ANNOTATION: stamp}}},
                                      namespace=namespace, field_manager=FIELD_MANAGER)
            except _ERRORS as err:
                if not isinstance(err, ApiError) or err.status != 404:  # deleted since: nothing waits on it
                    log.warning("cannot requeue the Pods waiting on ResourceClaimTemplate %s/%s: %s",
                                namespace, name, err)
        log.info("quota freed in namespace %s: requeued the Pods waiting on ResourceClaimTemplate(s) %s",
                 namespace, ", ".join(templates))
