"""Team recounts in slices: a ClusterDeviceQuota's part of a namespace counted without holding the loop.

Neighbours: `quota.accounting.ledger.Ledger.defer_recounts` leaves a team's part that no quota of
the same scope already counts (a ClusterDeviceQuota created, its selector or scope
changed, a namespace relabelled into it) to a `quota.accounting.teams.Recount` and tells `due`;
`run` counts them through `kube.rebuilds.Rebuilds.run` (slices of the event loop, full
collections off meanwhile) and tells `changed` the teams counted whole, so the quota
controller writes their status then (`controllers.quotas` writes none of a team while it
is recounted). `webhook.claimreview` waits here, bounded, before it decides a claim
against a team being recounted; past the bound, and for every other writer, the
decision itself refuses (`kube.statuswriter`, `quota.accounting.ledger`): nothing is decided on a
partial count. Counted at once, one namespace of 150,000 claims held the loop 1.2-2.1 s
(bench/stalls.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from kube.caches import QuotasChanged
from kube.rebuilds import Rebuilds
from quota.accounting.ledger import RECOUNT_PAUSE_EVERY, Ledger

__all__ = ["RECOUNT_WAIT", "Recounter"]

log = logging.getLogger(__name__)

# Seconds a review waits for the recount of a team it is charged to, as long as it waits
# for a lagging watch (`kube.statuswriter`'s `catch_up`): a team over 144,000 claims is
# recounted in 3-13 s of a busy replica (bench/stalls.py); the webhook's own deadline is
# 5 s (`timeoutSeconds`), and past this the review is refused with a message to retry.
RECOUNT_WAIT = 2.0
_RETRY_AFTER_FAILURE = 1.0  # seconds before a recount that raised runs again


class Recounter:
    """Runs the ledger's recounts in slices as they fall due (module doc)."""

    def __init__(self, ledger: Ledger, rebuilds: Rebuilds, *, changed: QuotasChanged = lambda keys: None,
                 every: int = RECOUNT_PAUSE_EVERY) -> None:
        self.ledger = ledger
        self.rebuilds = rebuilds
        self.changed = changed
        self.passes = 0  # recount passes run (tests and the bench read it)
        self._due = asyncio.Event()
        self._counted = asyncio.Event()  # set after each pass: waiters look again
        ledger.defer_recounts(self._due.set, every=every)

    async def run(self) -> None:
        """Until cancelled: whenever recounts are due, run them all, in slices."""
        while True:
            await self._due.wait()
            self._due.clear()
            try:
                keys = await self.rebuilds.run(self.ledger.recount)
            except Exception:  # noqa: BLE001 - the teams stay refused (fail closed) until a pass succeeds
                log.exception("recounting the teams' usage failed; trying again in %ss", _RETRY_AFTER_FAILURE)
                await asyncio.sleep(_RETRY_AFTER_FAILURE)
                self._due.set()
                continue
            self.passes += 1
            if self.ledger.recounts_due():
                self._due.set()  # more fell due while this pass ran
            self._counted.set()
            if keys:
                self.changed(keys)

    async def wait(self, names: Iterable[str], *, timeout: float = RECOUNT_WAIT) -> bool:
        """Until no team of `names` is being recounted; False when `timeout` seconds passed first."""
        names = tuple(names)
        try:
            async with asyncio.timeout(timeout):
                while any(self.ledger.recounting(name) for name in names):
                    self._counted.clear()
                    await self._counted.wait()
        except TimeoutError:
            return False
        return True
