"""runtime.stalls: a stall of the event loop shows in the metrics.

No bound on time is asserted: a blocking call of known length is made on the loop, and
the longest stall reported must be at least that length less one tick's period (the
lower bound the module documents); the CPU figure holds it when the call worked on the
CPU (a spin of that much CPU time), not when it slept.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable

import pytest

from devcluster.kube import poll
from runtime.metricnames import EVENT_LOOP_STALL, EVENT_LOOP_STALL_CPU_MAX, EVENT_LOOP_STALL_MAX, GC_PAUSE
from runtime.stalls import time_collections, watch
from webhook.metrics import Metrics

pytestmark = pytest.mark.asyncio(loop_scope="session")
PERIOD = 0.05
BLOCK = 0.5


async def stalled(block: Callable[[], None]) -> Metrics:
    """The metrics of a stall watch around one call of `block` on the loop."""
    metrics = Metrics()

    def ticks() -> float:
        return metrics.registry.get_sample_value(f"{EVENT_LOOP_STALL}_count") or 0.0

    async def ticked(after: float) -> bool:
        return ticks() > after

    task = asyncio.create_task(watch(metrics.stalled, period=PERIOD))
    try:
        await poll(lambda: ticked(0), timeout=30, what="the first tick")
        before = ticks()
        block()  # the stall: nothing else on this loop runs meanwhile
        await poll(lambda: ticked(before), timeout=30, what="a tick after the stall")
    finally:
        task.cancel()
    return metrics


async def test_a_blocking_call_shows_as_a_stall_of_at_least_its_length_less_a_period() -> None:
    metrics = await stalled(lambda: time.sleep(BLOCK))
    longest = metrics.registry.get_sample_value(EVENT_LOOP_STALL_MAX)
    assert longest is not None and longest >= BLOCK - PERIOD, longest
    count = metrics.registry.get_sample_value(f"{EVENT_LOOP_STALL}_count") or 0.0
    over_quarter = count - (metrics.registry.get_sample_value(f"{EVENT_LOOP_STALL}_bucket", {"le": "0.25"}) or 0.0)
    assert over_quarter >= 1, "the histogram holds the stall too"
    # Asleep, the loop's thread held no CPU: not a stall of ours (a loaded node's queue looks the same).
    ours = metrics.registry.get_sample_value(EVENT_LOOP_STALL_CPU_MAX)
    assert ours is not None and ours < BLOCK / 2, ours


async def test_a_stall_on_the_cpu_shows_in_the_cpu_figure_too() -> None:
    def spin() -> None:
        until = time.thread_time() + BLOCK  # CPU time: however loaded the machine, this thread works BLOCK
        while time.thread_time() < until:
            pass

    metrics = await stalled(spin)
    ours = metrics.registry.get_sample_value(EVENT_LOOP_STALL_CPU_MAX)
    assert ours is not None and ours >= BLOCK - PERIOD, ours


async def test_each_collection_shows_by_its_generation_and_the_hook_goes_with_the_task() -> None:
    metrics = Metrics()

    def passes(generation: int) -> float:
        return metrics.registry.get_sample_value(f"{GC_PAUSE}_count", {"generation": str(generation)}) or 0.0

    hooks = len(gc.callbacks)
    task = asyncio.create_task(time_collections(metrics.collected))
    await asyncio.sleep(0)  # the task hooks in as it starts
    full = passes(2)
    gc.collect()
    gc.collect(1)
    assert passes(2) == full + 1 and passes(1) >= 1
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert len(gc.callbacks) == hooks
    gc.collect()
    assert passes(2) == full + 1  # no longer hooked

