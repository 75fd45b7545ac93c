"""runtime.slicing: pricing in slices on the loop's thread; expensive calls in a bounded
slow lane. No timing in the assertions: each counts what the loop did while a call ran
(a ticker task's turns), which is zero when a call holds the loop to the end."""

from __future__ import annotations

import asyncio
import weakref
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from greenlet import greenlet

from quota.accounting.ledger import Ledger
from quota.admission.admitter import Admitter
from quota.cel import compile_selector
from quota.devices.inventory import Inventory
from quota.objects.claims import parse_claim, parse_device_class
from quota.pricing.pricer import Pricer
from quota.values.model import DeviceClassName
from quota.values.work import CLAIM_COST_BUDGET, pause_point, wait_point
from tests.unit.quota.cel.devices import activation
from runtime import slicing
from runtime.slicing import Busy, Slicer

from ..builders import exactly, make_class, make_claim, request
from ..quota.devices.test_selectors import D, node_slice

HEAVY = "lists.range(300).all(i, lists.range(300).all(j, i + j >= 0))"  # ~630,000 units: one evaluation


class Ticker:
    """Counts the loop's turns while it runs."""

    def __init__(self) -> None:
        self.turns = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            self.turns += 1
            await asyncio.sleep(0)

    def __enter__(self) -> Ticker:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *_: Any) -> None:
        assert self._task is not None
        self._task.cancel()


async def turns_during(slicer: Slicer, fn: Callable[[], Any]) -> tuple[Any, int]:
    with Ticker() as ticker:
        await asyncio.sleep(0)  # let it start
        before = ticker.turns
        result = await slicer.run(fn)
        return result, ticker.turns - before


async def test_a_cheap_call_is_answered_in_its_first_slice() -> None:
    slicer = Slicer()
    assert await slicer.run(lambda: 42) == 42
    assert slicer.slow_calls == 0


async def test_one_long_evaluation_gives_the_loop_back_many_times() -> None:
    selector = compile_selector(HEAVY)
    slicer = Slicer(first_slice=0.001, slice_seconds=0.001)
    (matched, cost), turns = await turns_during(slicer, lambda: selector.evaluate_with_cost(
        activation("d"), pause=pause_point))
    assert matched is True and cost > 500_000
    assert turns > 10 and slicer.slow_calls == 1


async def test_a_long_compile_gives_the_loop_back() -> None:
    expression = " && ".join(f"({'1' + ' + 1' * 150} > {i})" for i in range(12))  # ~4 KiB, new to the cache
    slicer = Slicer(first_slice=0.001, slice_seconds=0.001)
    compiled, turns = await turns_during(slicer, lambda: compile_selector(expression))
    assert compiled.expression == expression and turns > 5


def world() -> Admitter:
    inventory = Inventory()
    inventory.replace_all([node_slice(n, ["h100", "a100"]) for n in range(50)])
    classes = {DeviceClassName("gpu"): parse_device_class(make_class("gpu", f"device.driver == '{D}'"))}
    return Admitter(Pricer(inventory, classes), Ledger())


def expensive_claim(salt: int, requests: int = 4) -> Any:
    """Per device (the whole attribute map read) and a loop each: what a hostile tenant sends
    to hold the event loop."""
    selector = f"size(device.attributes['{D}']) > {-salt} && lists.range(300).all(x, x + {salt} >= 0)"
    return parse_claim(make_claim(f"c{salt}", *(request(f"r{i}", exactly("gpu", f"{selector} && {i} >= 0"))
                                                for i in range(requests))))


async def test_a_claim_past_its_budget_is_denied_with_the_budget_message_and_the_loop_kept_turning() -> None:
    admitter = world()
    slicer = Slicer()
    admission, turns = await turns_during(slicer, lambda: admitter.admit_claim(
        expensive_claim(1, requests=32), namespace_labels={}, dry_run=True))
    assert not admission.allowed
    assert f"exceeded the per-claim budget of {CLAIM_COST_BUDGET:,} CEL cost units" in admission.reason
    assert turns > 10


async def test_cheap_calls_finish_while_expensive_ones_are_in_the_slow_lane() -> None:
    admitter = world()
    # A first slice far longer than a known claim's pricing (microseconds), so that
    # only the expensive claims reach the slow lane however loaded the machine is.
    slicer = Slicer(first_slice=0.05, lane=1)
    cheap = parse_claim(make_claim("cheap", request("gpu", exactly("gpu"))))
    admitter.admit_claim(cheap, namespace_labels={}, dry_run=True)  # its selectors are known, as an honest claim's
    order: list[str] = []

    async def run(name: str, fn: Callable[[], Any]) -> None:
        await slicer.run(fn)
        order.append(name)

    expensive = [asyncio.create_task(run(f"expensive-{i}", lambda i=i: admitter.admit_claim(  # type: ignore[misc]
        expensive_claim(i + 2), namespace_labels={}, dry_run=True))) for i in range(3)]
    await asyncio.sleep(0)
    await run("cheap", lambda: admitter.admit_claim(cheap, namespace_labels={}, dry_run=True))
    await asyncio.gather(*expensive)
    assert order[0] == "cheap" and slicer.slow_calls == 3


async def test_the_slow_lane_queue_is_bounded() -> None:
    selector = compile_selector(HEAVY)
    slicer = Slicer(first_slice=0.0, lane=1, queue=1)
    work = lambda: selector.evaluate_with_cost(activation("d"), pause=pause_point)  # noqa: E731
    running = asyncio.create_task(slicer.run(work))
    await asyncio.sleep(0)
    waiting = asyncio.create_task(slicer.run(work))
    await asyncio.sleep(0)
    with pytest.raises(Busy, match="busy pricing 1 other expensive requests"):
        await slicer.run(work)
    await asyncio.gather(running, waiting)


async def test_a_cancelled_call_stops_its_work() -> None:
    finished: list[bool] = []

    def work() -> None:
        try:
            for _ in range(10_000_000):
                pause_point()
            finished.append(True)
        finally:
            finished.append(False)

    slicer = Slicer(first_slice=0.0, slice_seconds=0.0)
    task = asyncio.create_task(slicer.run(work))
    for _ in range(5):
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert finished == [False]  # unwound through its finally, never completed


@contextlib.asynccontextmanager
async def full_lane(slicer: Slicer) -> AsyncIterator[None]:
    """`slicer`'s slow lane taken and its queue full, as under a tenant's expensive
    reviews: calls that pause until the block ends."""
    released = asyncio.Event()

    def hog() -> None:
        while not released.is_set():
            pause_point()

    hogs = []
    for _ in range(1 + slicer.queue):  # one in the lane, the rest waiting
        hogs.append(asyncio.create_task(slicer.run(hog)))
        await asyncio.sleep(0)
    assert slicer.waiting == slicer.queue
    try:
        yield
    finally:
        released.set()
        await asyncio.gather(*hogs)


def paused() -> int:
    """Background work that pauses once (it will not finish in a first slice of 0 s)."""
    pause_point()
    return 7


async def test_a_waiting_call_past_a_full_lane_waits_its_turn_instead_of_being_refused() -> None:
    slicer = Slicer(first_slice=0.0, slice_seconds=0.0, lane=1, queue=1)
    async with full_lane(slicer):
        background = asyncio.create_task(slicer.run(paused, wait=True))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not background.done() and slicer.crowded == 1
        # It counts among the waiting: a review is refused as before.
        with pytest.raises(Busy, match="busy pricing 2 other expensive requests"):
            await slicer.run(paused)
    assert await background == 7
    assert (slicer.crowded, slicer.waiting) == (1, 0)


async def test_a_waiting_call_with_room_in_the_lane_is_not_crowded() -> None:
    slicer = Slicer(first_slice=0.0, slice_seconds=0.0, lane=1, queue=1)
    assert await slicer.run(paused, wait=True) == 7
    assert (slicer.slow_calls, slicer.crowded) == (1, 0)


async def test_calls_reuse_a_few_worker_greenlets(monkeypatch: pytest.MonkeyPatch) -> None:
    """A greenlet per call cost each review an mmap, a munmap and a page fault (CPython
    3.11 maps a data stack for each new greenlet's frames): calls that end take turns on
    the same worker, one that raised included, and a cancelled one's worker is not reused."""
    made: list[greenlet] = []

    class Counted(greenlet):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(slicing, "greenlet", Counted)
    slicer = Slicer()

    def fails() -> None:
        raise ValueError("priced wrong")

    for i in range(50):
        assert await slicer.run(lambda i=i: i * 2) == i * 2  # type: ignore[misc]
        with pytest.raises(ValueError, match="priced wrong"):
            await slicer.run(fails)
    assert len(made) <= 1  # none when an earlier test left an idle worker

    ran_on: list[greenlet] = []

    def forever() -> None:
        ran_on.append(greenlet.getcurrent())
        while True:
            pause_point()

    paused = asyncio.create_task(Slicer(first_slice=0.0, slice_seconds=0.0).run(forever))
    for _ in range(3):
        await asyncio.sleep(0)
    paused.cancel()
    with pytest.raises(asyncio.CancelledError):
        await paused
    assert ran_on[0].dead  # the worker the cancelled call paused on unwound with it
    assert await slicer.run(lambda: greenlet.getcurrent()) is not ran_on[0]


async def test_an_idle_worker_keeps_nothing_of_its_last_call() -> None:
    """A worker waiting for its next call held the last one's value (a review's claim, a
    scrape's output) for as long as it stayed idle, and a relist's gc.freeze kept it."""

    class Priced:
        pass

    priced = await Slicer().run(Priced)
    gone = weakref.ref(priced)
    del priced
    assert gone() is None, "the idle worker still refers to the last call's value"


@pytest.mark.asyncio(loop_scope="session")
async def test_a_wait_point_gives_the_loop_back_at_once_and_a_pause_point_only_when_the_slice_is_up() -> None:
    """Work waiting on another call's (`quota.values.work.wait_point`) must not spin out its
    slice: the loop runs others at once. Without a slicer there is nothing to wait on."""
    ran: list[str] = []

    def work() -> None:
        pause_point()  # the slice (a minute of CPU) is not up: no turn for the others
        ran.append("paused")
        assert wait_point()
        ran.append("waited")

    async def other() -> None:
        while "paused" not in ran:
            await asyncio.sleep(0)
        ran.append("other")

    task = asyncio.ensure_future(other())
    await slicing.in_slices(work, slice_seconds=60.0)
    await task
    assert ran == ["paused", "other", "waited"]
    assert not wait_point()
