"""Whether this replica can reach the API server now, and what it answers when it cannot.

Neighbours: `commands.serve` runs `Contact.run` beside the reflectors, makes `/readyz`
depend on `reachable` and gives `unavailable` to `webhook.server.build_app`; the metrics
export `reachable` (`webhook.metrics`).

Why: a replica cut off from the API server while the others are not (a network partition,
a NetworkPolicy, a broken route on its node) keeps its caches, which stop moving without
a word: a watch whose packets are dropped stays open and silent, and a quiet one brings a
bookmark only once a minute, so the reflectors notice after their silence bound (90 s).
Meanwhile the replica would answer from what it last saw: it would admit claims in a
namespace a DeviceQuota began to govern since, and it cannot persist a reservation, so
each governed create would hang on its status write to the webhook's deadline.

So a probe (`GET /readyz`, which every authenticated user may read: the
`system:public-info-viewer` ClusterRole) runs every `interval` seconds on a connection pool
of its own (the writes' pool may be full under load). Once nothing answered it for
`grace` seconds the replica is *cut off*:

- `/readyz` answers 503, so the endpoints drop the Pod and a kubelet's probe shows why;
- every review is answered HTTP 503 with a Status saying so, not with a decision, and
  the connection closes after it (the API server dials again, through the Service, to a
  ready Pod: a kept-alive connection would keep coming back here); the
  webhook configuration's failurePolicy decides, as if the replica were down. Where a
  quota governs (the leader, which can reach the API server, labelled the namespace, and
  the API server picked the Fail copy of the webhook by that label, not by this replica's
  stale cache) the create is refused: "failed calling webhook ... cannot reach the API
  server"; where none does (Ignore) it is admitted and the leader charges it later, as
  any claim that arrived without our webhook (`controllers.annotator`).

The first `grace` seconds of a cut are answered as before: admissions under a lease this
replica holds (persisted room: `quota.accounting.headroom`, never past its window) and ungoverned
namespaces from the cache; a governed create that needs a write waits on it until the
review's deadline and is denied "could not decide within the webhook timeout; retry". Once
the probe answers again the replica is ready and decides again: its watches go on from
where they were (or relist after a 410), and every reservation is still a conditional
write that waits for the claim watch to reach the record's watermark (`kube.statuswriter`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import aiohttp

from kube.api import KubeApi
from kube.apierror import ApiError

__all__ = ["Contact"]

log = logging.getLogger(__name__)

PATH = "/readyz"  # granted in `kube.resources.NON_RESOURCE_URLS`
_FAILURES = (ApiError, aiohttp.ClientError, TimeoutError, OSError)


class Contact:
    """The probe of one API server (module doc); `run` until cancelled."""

    def __init__(self, api: KubeApi, *, interval: float = 1.0, grace: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.interval = interval
        self.grace = grace
        self._clock = clock
        self._heard = clock()  # started: the caches' first lists say whether it answers
        self._lost_at: float | None = None
        self.cut_offs = 0  # how many times it was cut off (for the log and tests)

    def reachable(self) -> bool:
        """The API server answered the probe within the last `grace` seconds."""
        return self._clock() - self._heard < self.grace

    def unavailable(self) -> str:
        """What a review is answered while cut off (HTTP 503), else ""."""
        if self.reachable():
            return ""
        return ("dra-quota cannot reach the API server: its caches may be stale and it cannot persist a "
                "reservation; retry")

    async def run(self) -> None:
        try:
            while True:
                await self.probe()
                await asyncio.sleep(self.interval)
        finally:
            await self.api.close()

    async def probe(self) -> None:
        """One bounded `GET /readyz`; notes an answer, and says when contact is lost or back."""
        try:
            async with asyncio.timeout(self.grace):
                await self.api.text(PATH)
        except _FAILURES as err:
            if self._lost_at is None and not self.reachable():
                self._lost_at = self._clock()
                self.cut_offs += 1
                log.warning("cannot reach the API server %s for %.0fs (%s): not ready, and every review is "
                            "answered 503 so the webhooks' failurePolicy decides until it answers again",
                            self.api.server, self._clock() - self._heard, str(err) or type(err).__name__)
            return
        now = self._clock()
        if self._lost_at is not None:
            log.info("the API server %s answers again after %.1fs without an answer: ready, deciding reviews again",
                     self.api.server, now - self._heard)
            self._lost_at = None
        self._heard = now
