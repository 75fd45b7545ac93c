"""Pods waiting on quota get their claim as soon as quota frees, not ~17 minutes later.

Neighbours: the claim cache (`kube.claimstore.ClaimStore`) calls `Requeuer.quota_freed`
with the namespace of each deleted claim; `quota.waiting` picks, from that namespace's
unscheduled Pods, the ResourceClaimTemplates some Pod still waits on; this module
touches them (annotation `draquota.io/requeued-at`), which makes the resourceclaim
controller re-queue every Pod using them at once (`quota.waiting` module doc). Without
it, a Pod whose template claim we denied is retried by that controller with exponential
backoff (5 ms doubling, up to 1000 s): after an hour of waiting, quota freed now would
be noticed up to ~17 minutes later.

Only the leader touches templates (`leading`), so replicas do not write N times.
Deletions come in bursts (a Job's Pods go together): namespaces are collected and
handled at most once per `interval`; each is handled again after `settle` seconds,
because a replica whose claim watch lags behind ours may deny the first retry (the
controller then backs off again). RBAC: list pods, patch resourceclaimtemplates.

Quota freed in a team's namespace frees it for every namespace of the team
(`commands.wiring`): a team of 500 namespaces made each claim deletion 500 Pod lists,
twice. Past `_PER_NAMESPACE` namespaces due at once, one list of every unscheduled Pod
of the cluster serves them all.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime, timezone

import aiohttp

from kube.api import ApiError, KubeApi
from kube.resources import PODS, TEMPLATES
from quota.raw import Obj, dig
from quota.waiting import trim_pod, waiting_templates

__all__ = ["ANNOTATION", "Requeuer"]

log = logging.getLogger(__name__)

ANNOTATION = "draquota.io/requeued-at"
FIELD_MANAGER = "dra-quota"
# Namespaces due at once up to which each gets its own list of unscheduled Pods.
_PER_NAMESPACE = 8
_UNSCHEDULED = "spec.nodeName="


class Requeuer:
    def __init__(self, api: KubeApi, *, leading: Callable[[], bool] = lambda: True,
                 interval: float = 1.0, settle: float = 3.0) -> None:
        self._api = api
        self._leading = leading
        self._interval = interval
        self._settle = settle
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()

    def quota_freed(self, namespace: str) -> None:
        """Called from the caches' event handlers: never blocks, never raises."""
        if namespace:
            self._dirty.add(namespace)
            self._wake.set()

    async def run(self) -> None:
        """Until cancelled: requeue the waiting Pods of every namespace where quota freed."""
        loop = asyncio.get_running_loop()
        again: dict[str, float] = {}  # namespace -> when to pass a second time
        while True:
            timeout = max(0.0, min(again.values()) - loop.time()) if again else None
            try:
                async with asyncio.timeout(timeout):  # not wait_for: 3.11's can drop a cancellation
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            now = loop.time()
            fresh, self._dirty = self._dirty, set()
            due = fresh | {ns for ns, at in again.items() if at <= now}
            for namespace in due:
                again.pop(namespace, None)
            again.update((namespace, now + self._settle) for namespace in fresh)
            if self._leading():
                await self._requeue_all(sorted(due))
            # Rate limit: a burst of deletions is one pass per interval, not one per claim.
            await asyncio.sleep(self._interval)

    async def _requeue_all(self, namespaces: list[str]) -> None:
        if len(namespaces) <= _PER_NAMESPACE:
            for namespace in namespaces:
                await self._requeue(namespace)
            return
        try:
            pods = (await self._api.list(PODS, field_selector=_UNSCHEDULED, transform=trim_pod)).items
        except (ApiError, aiohttp.ClientError, TimeoutError) as err:
            log.warning("cannot requeue the Pods waiting for claims in %d namespaces: %s", len(namespaces), err)
            return
        by_namespace: dict[str, list[Obj]] = {}
        for pod in pods:
            by_namespace.setdefault(str(dig(pod, "metadata", "namespace") or ""), []).append(pod)
        for namespace in namespaces:
            if namespace in by_namespace:
                await self._requeue(namespace, by_namespace[namespace])

    async def _requeue(self, namespace: str, pods: list[Obj] | None = None) -> None:
        """Touch the templates `namespace`'s unscheduled Pods wait on (`pods`: listed already)."""
        try:
            if pods is None:
                pods = (await self._api.list(PODS, namespace=namespace, field_selector=_UNSCHEDULED,
                                             transform=trim_pod)).items
            templates = sorted(waiting_templates(pods))
            stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            for name in templates:
                try:
                    await self._api.patch(TEMPLATES, name, {"metadata": {"annotations": {ANNOTATION: stamp}}},
                                          namespace=namespace, field_manager=FIELD_MANAGER)
                except ApiError as err:
                    if err.status != 404:  # deleted since: nothing waits on it any more
                        raise
        except (ApiError, aiohttp.ClientError, TimeoutError) as err:
            log.warning("cannot requeue the Pods waiting for claims in namespace %s: %s", namespace, err)
            return
        if templates:
            log.info("quota freed in namespace %s: requeued the Pods waiting on ResourceClaimTemplate(s) %s",
                     namespace, ", ".join(templates))
