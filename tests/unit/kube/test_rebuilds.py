"""kube.rebuilds and runtime.slicing.in_slices: big rebuilds give the loop back, and the
cyclic collector stays off what they build."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from kube.rebuilds import OFF, Rebuilds
from quota.values.raw import Obj
from quota.values.work import pause_point
from runtime.slicing import in_slices

from ..clock import until
from ..runtime.test_slicing import Ticker


@pytest.fixture(autouse=True)
def _thresholds() -> Iterator[None]:
    """Whatever a test does, the collector is left as it was."""
    saved = gc.get_threshold()
    yield
    gc.set_threshold(*saved)
    gc.unfreeze()


def busy(pauses: int, out: list[int]) -> int:
    for i in range(pauses):
        out.append(i)
        pause_point()
    return len(out)


async def test_in_slices_gives_the_loop_back_and_returns_or_raises() -> None:
    with Ticker() as ticker:
        await asyncio.sleep(0)
        before = ticker.turns
        out: list[int] = []
        assert await in_slices(lambda: busy(5, out), slice_seconds=0.0) == 5
        assert ticker.turns - before >= 5  # a turn of the loop at each pause point

    def fails() -> None:
        pause_point()
        raise ValueError("bad list")

    with pytest.raises(ValueError, match="bad list"):
        await in_slices(fails, slice_seconds=0.0)


async def test_full_collections_stay_off_while_any_rebuild_runs_and_what_a_relist_built_is_frozen() -> None:
    rebuilds = Rebuilds(slice_seconds=0.0)
    young, middle, old = gc.get_threshold()
    frozen = gc.get_freeze_count()
    seen: list[tuple[int, int, int]] = []
    kept: list[Obj] = []

    async def fetch() -> list[Obj]:
        seen.append(gc.get_threshold())
        return [{"n": i} for i in range(3)]

    def replace(items: list[Obj]) -> None:
        kept.extend(items)
        seen.append(gc.get_threshold())
        pause_point()

    with rebuilds.quiet():  # a scrape under way meanwhile: the relist's end must not turn them back on
        await rebuilds.relist(fetch, replace)
        assert gc.get_threshold() == (young, middle, OFF)
    assert seen == [(young, OFF, OFF)] * 2  # the middle generation's off too while a relist runs
    assert gc.get_threshold() == (young, middle, old)
    assert rebuilds.freezes == 1 and gc.get_freeze_count() > frozen
    assert kept == [{"n": 0}, {"n": 1}, {"n": 2}]

    assert await rebuilds.run(lambda: gc.get_threshold()) == (young, middle, OFF)
    assert gc.get_threshold() == (young, middle, old) and rebuilds.freezes == 1  # a scrape freezes nothing


async def test_a_failed_relist_turns_full_collections_back_on() -> None:
    rebuilds = Rebuilds(slice_seconds=0.0)
    before = gc.get_threshold()

    async def fetch() -> list[Obj]:
        raise ConnectionError("gone")

    with pytest.raises(ConnectionError):
        await rebuilds.relist(fetch, lambda items: None)
    assert gc.get_threshold() == before and rebuilds.freezes == 0


@contextlib.contextmanager
def generations_collected() -> Iterator[list[int]]:
    """The generation of every collection meanwhile, with no collection but the clock's."""
    collected: list[int] = []

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collected.append(info["generation"])

    gc.callbacks.append(callback)
    gc.disable()
    try:
        yield collected
    finally:
        gc.enable()
        gc.callbacks.remove(callback)


@contextlib.asynccontextmanager
async def clock(rebuilds: Rebuilds, *, full_every: float) -> AsyncIterator[None]:
    task = asyncio.create_task(rebuilds.collect(period=0.001, full_every=full_every))
    await asyncio.sleep(0)  # the clock takes the full collections over as it starts
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def young_collections(collected: list[int], n: int) -> Callable[[], bool]:
    return lambda: collected.count(0) >= n


async def test_the_youngest_generation_is_collected_on_a_clock() -> None:
    with generations_collected() as collected:
        async with clock(Rebuilds(), full_every=0):
            await until(young_collections(collected, 1), "a young collection by the clock")


async def test_full_collections_come_from_the_clock_at_most_once_a_period() -> None:
    """CPython's own are off while the clock runs (its threshold back after); with a period
    longer than the test, none comes however many middle collections pass."""
    young, middle, old = gc.get_threshold()
    with generations_collected() as collected:
        async with clock(Rebuilds(), full_every=3600):
            assert gc.get_threshold() == (young, middle, OFF)
            # CPython would have made several full collections by then
            await until(young_collections(collected, (middle + 1) * (old + 1) * 3), "many young collections")
            assert collected.count(1) > old and 2 not in collected
        assert gc.get_threshold() == (young, middle, old)
        async with clock(Rebuilds(), full_every=0):
            await until(lambda: 2 in collected, "a full collection by the clock")


async def test_no_full_collection_while_a_rebuild_runs() -> None:
    young, middle, old = gc.get_threshold()
    rebuilds = Rebuilds()
    with generations_collected() as collected:
        with rebuilds.quiet():
            async with clock(rebuilds, full_every=0):
                await until(young_collections(collected, (middle + 1) * (old + 1) * 3), "many young collections")
                assert 2 not in collected
            assert gc.get_threshold() == (young, middle, OFF)  # the rebuild's to give back
        assert gc.get_threshold() == (young, middle, old)
        async with clock(rebuilds, full_every=0):
            with rebuilds.quiet():
                pass
            assert gc.get_threshold() == (young, middle, OFF)  # the clock's, after the rebuild too
            await until(lambda: 2 in collected, "a full collection once the rebuild is over")
        assert gc.get_threshold() == (young, middle, old)


async def test_no_middle_collection_while_a_relist_runs_what_it_built_is_frozen_instead() -> None:
    """Everything a relist builds survives its young collections: the middle generation
    would walk it all again every few; the freeze at the relist's end takes it unwalked."""
    young, middle, old = gc.get_threshold()
    rebuilds = Rebuilds()
    with generations_collected() as collected:
        async with clock(rebuilds, full_every=3600):
            async def fetch() -> list[Obj]:
                await until(young_collections(collected, (middle + 1) * 3), "many young collections")
                return []

            await rebuilds.relist(fetch, lambda items: None)
            assert 1 not in collected and rebuilds.freezes == 1
            assert gc.get_threshold() == (young, middle, OFF)  # the clock's full collections only
            collected.clear()
            await until(lambda: 1 in collected, "a middle collection once the relist is over")
    assert gc.get_threshold() == (young, middle, old)
