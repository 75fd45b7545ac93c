"""Which denials `webhook.server` logs: the first of each namespace's in each interval, then a count.

Neighbours: `webhook.server.build_app` keeps one `DenialLog` per app and asks it before
logging each denial; `runtime.logbounds.Sampler` decides, told the monotonic time. A
namespace's first `DENIALS_PER_INTERVAL` denials of an interval are logged (each line's
message cut by the handler's `runtime.logbounds.CutLongMessages`); the rest only count,
and one INFO line says how many once the interval is over, so a tenant's flood of
denials costs the log a constant per interval, not a line per request, and another
namespace's denials are logged as before. The AdmissionReview answers, the metrics and
the Events are not sampled here.
"""

from __future__ import annotations

import asyncio
import logging
import time

from runtime.logbounds import Sampler

__all__ = ["DenialLog"]


class DenialLog:
    """The sampler, and the timer that tells an interval's count when no later denial does."""

    def __init__(self, log: logging.Logger, sampler: Sampler | None = None) -> None:
        self._log = log
        self.sampler = sampler if sampler is not None else Sampler()
        self._timer: asyncio.TimerHandle | None = None

    def admit(self, namespace: str) -> bool:
        """Whether to log this denial in `namespace`; tells the count its last interval held back.

        At DEBUG every denial is logged (each line still cut): an operator who asked for
        every line, or a test counting the denials in the log, gets them all."""
        if self._log.isEnabledFor(logging.DEBUG):
            return True
        logged, held_back = self.sampler.admit(namespace, time.monotonic())
        if held_back:
            self._told(namespace, held_back)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.sampler.interval, self._expire)
        return logged

    def _expire(self) -> None:
        self._timer = None
        for namespace, held_back in self.sampler.expired(time.monotonic()):
            self._told(namespace, held_back)
        if self.sampler.active():
            self._timer = asyncio.get_running_loop().call_later(self.sampler.interval, self._expire)

    def _told(self, namespace: str, held_back: int) -> None:
        self._log.info("suppressed %d denials in namespace %s (%d s interval: the first %d of each are logged)",
                       held_back, namespace, round(self.sampler.interval), self.sampler.per_interval,
                       extra={"namespace": namespace, "suppressed": held_back})
