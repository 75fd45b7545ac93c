"""`dra-quota serve`'s shutdown: the order that keeps every write and every review answered.

Neighbours: `commands.serve` calls `shut_down` once SIGTERM or SIGINT arrived (or a vital
task died) with the leader's writers, its listeners' drain and the rest of its tasks.
"""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import Awaitable, Callable, Sequence

__all__ = ["cancel", "shut_down"]

log = logging.getLogger(__name__)


async def shut_down(writers: Sequence[asyncio.Task[None]], rest: Sequence[asyncio.Task[None]],
                    drain: Callable[[], Awaitable[None]], *, patience: float) -> None:
    """Stop in the order that keeps every write and every review answered.

    1. The leader's writers (the controller and its Lease, claim annotations, requeues):
       their writes pass through our own webhooks (the claim-annotation guard's policy is
       Fail), so they end while our listener still answers: closing it first failed them
       with 500s. The Lease is released here, so another replica leads at once.
    2. `drain`: the listener closes and the reviews in flight finish (the grace).
    3. The rest: the reflectors those reviews read, the Event recorder they feed.
    """
    await cancel(writers, patience)
    await drain()
    await cancel(rest, patience)


async def cancel(tasks: Sequence[asyncio.Task[None]], patience: float) -> None:
    """Cancel `tasks` and wait until they end.

    One still running `patience` seconds after its cancellation lost it (Python 3.11's
    `wait_for` drops a cancellation that races its inner future; a library may do the
    same) or is stuck in its clean-up: its stack is logged and it is cancelled again, so
    a lost cancellation delays the exit instead of hanging it.
    """
    for task in tasks:
        task.cancel()
    pending = {task for task in tasks if not task.done()}
    while pending:
        _, pending = await asyncio.wait(pending, timeout=patience)
        for task in pending:
            stack = io.StringIO()
            task.print_stack(file=stack)
            log.error("%s still running %gs after it was cancelled; cancelling it again. %s",
                      task.get_name(), patience, stack.getvalue())
            task.cancel()
