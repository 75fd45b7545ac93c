"""serve's shutdown (commands/shutdown.py `shut_down`, `cancel`): its order, and that every
background loop ends when cancelled.

A task that loses its cancellation keeps `serve` from exiting after SIGTERM: Python 3.11's
`asyncio.wait_for` returns its inner future's result, dropping the cancellation, when the
two land in the same turn of the loop. The leader's annotation writers waited for a
wake-up that way, and a failed patch wakes every idle writer: two e2e runs hung there.
The end to end proof is tests/e2e/test_serve.py's SIGTERM while annotations are in flight.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from commands.shutdown import cancel, shut_down
from controllers.annotator import Annotator
from controllers.kueue import AdmissionCheckController
from controllers.requeue import Requeuer
from kube.quotawriter import Reservations

from ..controllers.test_annotator import Api, due
from ..controllers.test_kueue_caches import caches
from ..controllers.test_kueue_controller import Recorder


def annotator_loop() -> tuple[Coroutine[Any, Any, None], Callable[[], None]]:
    writer = Annotator(Api(), due, lambda c, current: True,  # type: ignore[arg-type]
                       leading=lambda: False, concurrency=4)
    return writer.run(), writer._wake.set


def requeue_loop() -> tuple[Coroutine[Any, Any, None], Callable[[], None]]:
    requeuer = Requeuer(Api(), leading=lambda: False, interval=0)  # type: ignore[arg-type]
    # A namespace freed already: its second pass is due later, so the loop waits with a timer.
    requeuer.quota_freed("team")
    return requeuer.run(), lambda: requeuer.quota_freed("team")


def admission_check_loop() -> tuple[Coroutine[Any, Any, None], Callable[[], None]]:
    kc, _, _ = caches()
    api = Api()
    controller = AdmissionCheckController(api, kc, Reservations(api, kc.ledger, ttl=60),  # type: ignore[arg-type]
                                          Recorder(), leading=lambda: False)
    return controller.run(), controller.wake


@pytest.mark.parametrize("loop", [annotator_loop, requeue_loop, admission_check_loop])
async def test_a_loop_cancelled_as_its_wake_up_lands_ends(
        loop: Callable[[], tuple[Coroutine[Any, Any, None], Callable[[], None]]]) -> None:
    run, wake = loop()
    task = asyncio.create_task(run)
    for _ in range(3):
        await asyncio.sleep(0)  # turns of the loop, not time: the loop is waiting for a wake-up
    wake()
    await asyncio.sleep(0)  # the wake-up is delivered in this turn ...
    task.cancel()  # ... and the cancellation right behind it
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(10):  # a hang fails the test, it never paces it
            await task


async def test_the_writers_stop_while_reviews_are_answered_and_the_rest_after_them() -> None:
    order: list[str] = []

    async def forever(name: str) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            order.append(name)

    writers = [asyncio.create_task(forever(f"writer {i}")) for i in range(2)]
    rest = [asyncio.create_task(forever("reflector"))]

    async def drain() -> None:
        # The leader's writes pass through our own webhooks: none is left when the
        # listener closes. What the reviews read is still running.
        assert all(t.done() for t in writers) and not any(t.done() for t in rest)
        order.append("listener closed")

    await asyncio.sleep(0)
    await shut_down(writers, rest, drain, patience=10)
    assert order == ["writer 0", "writer 1", "listener closed", "reflector"]
    assert all(t.cancelled() for t in (*writers, *rest))


async def test_a_task_that_lost_its_cancellation_is_named_and_cancelled_again(
        caplog: pytest.LogCaptureFixture) -> None:
    async def drops_one() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            pass  # as 3.11's wait_for does when its inner future completed in the same turn
        await asyncio.Event().wait()

    task = asyncio.create_task(drops_one(), name="claim annotations")
    await asyncio.sleep(0)
    with caplog.at_level(logging.ERROR, logger="commands.shutdown"):
        await cancel([task], patience=0.01)
    assert task.cancelled()
    assert "claim annotations still running" in caplog.text and "drops_one" in caplog.text
