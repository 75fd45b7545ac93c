"""Time in the unit tests: one fake clock, and waiting on a condition instead of sleeping.

`FakeClock` is for product code that takes a `clock=` callable
(`webhook.connections.Connections`, `controllers.leader.LeaderElector`,
`kube.events.EventRecorder`, ...): a test advances it instead of sleeping, so what it
proves does not depend on how busy the machine is. `until` waits for what a test expects;
its timeout only turns a hang into a failure, it never paces the test.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class FakeClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


async def until(condition: Callable[[], bool], what: str = "the condition", *, timeout: float = 10) -> None:
    """Return once `condition()` holds, looking every 10 ms: code under test that polls
    files or retries on its own timer needs real time to get there."""
    try:
        async with asyncio.timeout(timeout):
            while not condition():
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"not within {timeout:g} s: {what}") from None
