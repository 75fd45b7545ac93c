"""How long the event loop stalls, measured all the time: a timer's lateness.

Neighbours: `commands.serve` runs `watch` as a background task and hands each lateness to
`webhook.metrics` (`draquota_event_loop_stall_seconds`, `..._max_seconds`).

Everything `serve` does shares one event loop: while one callback runs (a review priced,
a cache event applied, a scrape rendered), every other ready review waits. A timer due
every `PERIOD` fires late by how long the loop was busy past its due time, so each tick
measures the stall a review arriving at that moment would have waited; a stall of length
L shows as a lateness of at least L - `PERIOD`. Ten wake-ups a second cost nothing
measurable.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["PERIOD", "watch"]

PERIOD = 0.1


async def watch(observe: Callable[[float], None], *, period: float = PERIOD) -> None:
    """Tell `observe` each tick's lateness in seconds, until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + period
        await asyncio.sleep(period)
        observe(max(0.0, loop.time() - due))
