"""How long the event loop stalls, measured all the time: a timer's lateness, and the
cyclic collector's passes.

Neighbours: `commands.serve` runs `watch` and `time_collections` as background tasks and
hands each lateness to `webhook.metrics` (`draquota_event_loop_stall_seconds`,
`..._max_seconds`, `..._cpu_max_seconds`), each collection's length too
(`draquota_gc_pause_seconds`).

Everything `serve` does shares one event loop: while one callback runs (a review priced,
a cache event applied, a scrape rendered), every other ready review waits. A timer due
every `PERIOD` fires late by how long the loop was busy past its due time, so each tick
measures the stall a review arriving at that moment would have waited; a stall of length
L shows as a lateness of at least L - `PERIOD`. Ten wake-ups a second cost nothing
measurable.

On a shared node a timer also runs late while the kernel gives the core to other
processes: that is no work of ours. So each tick also tells the part of its lateness the
loop's own thread could have held the CPU for: the lateness, at most the thread's CPU time
since the previous tick (`time.thread_time`). A stall our code caused shows whole in both
figures; one the node's other processes caused, in the first only.

A pass of the cyclic collector holds the loop like any callback, and nothing else names
it: a full one walks every object not frozen (`kube.rebuilds` says when they come), so
under a flood of connections they were the longest ticks (bench/connections.py). Each
pass is timed by `gc.callbacks`: two clock reads and an observation per pass, dozens a
second.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable

__all__ = ["PERIOD", "time_collections", "watch"]

PERIOD = 0.1


async def watch(observe: Callable[[float, float], None], *, period: float = PERIOD) -> None:
    """Tell `observe` each tick's lateness in seconds and the part of it the loop's thread
    was on the CPU for (module doc), until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        due, cpu = loop.time() + period, time.thread_time()
        await asyncio.sleep(period)
        late = max(0.0, loop.time() - due)
        observe(late, min(late, time.thread_time() - cpu))


async def time_collections(observe: Callable[[int, float], None]) -> None:
    """Tell `observe` each cyclic collection's generation and seconds, until cancelled."""
    started = 0.0

    def timed(phase: str, info: dict[str, int]) -> None:
        nonlocal started
        if phase == "start":
            started = time.perf_counter()
        else:
            observe(info["generation"], time.perf_counter() - started)

    gc.callbacks.append(timed)
    try:
        await asyncio.Event().wait()
    finally:
        gc.callbacks.remove(timed)
