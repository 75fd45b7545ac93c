"""runtime.stalls: a stall of the event loop shows in the metrics (issues 15 and 16).

No bound on time is asserted: a blocking call of known length is made on the loop, and
the longest stall reported must be at least that length less one tick's period (the
lower bound the module documents).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from devcluster.kube import poll
from runtime.metricnames import EVENT_LOOP_STALL, EVENT_LOOP_STALL_MAX
from runtime.stalls import watch
from webhook.metrics import Metrics

pytestmark = pytest.mark.asyncio(loop_scope="session")
PERIOD = 0.05
BLOCK = 0.5


async def test_a_blocking_call_shows_as_a_stall_of_at_least_its_length_less_a_period() -> None:
    metrics = Metrics()

    def ticks() -> float:
        return metrics.registry.get_sample_value(f"{EVENT_LOOP_STALL}_count") or 0.0

    async def ticked(after: float) -> bool:
        return ticks() > after

    task = asyncio.create_task(watch(metrics.stalled, period=PERIOD))
    try:
        await poll(lambda: ticked(0), timeout=30, what="the first tick")
        before = ticks()
        time.sleep(BLOCK)  # the stall: nothing else on this loop runs meanwhile
        await poll(lambda: ticked(before), timeout=30, what="a tick after the stall")
    finally:
        task.cancel()
    longest = metrics.registry.get_sample_value(EVENT_LOOP_STALL_MAX)
    assert longest is not None and longest >= BLOCK - PERIOD, longest
    over_quarter = ticks() - (metrics.registry.get_sample_value(f"{EVENT_LOOP_STALL}_bucket", {"le": "0.25"}) or 0.0)
    assert over_quarter >= 1, "the histogram holds the stall too"
