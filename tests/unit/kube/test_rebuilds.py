"""kube.rebuilds and runtime.slicing.in_slices: big rebuilds give the loop back, and the
cyclic collector stays off what they build."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest

from kube.rebuilds import OFF, Rebuilds, collect_young
from quota.raw import Obj
from quota.work import pause_point
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
    assert seen == [(young, middle, OFF)] * 2
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


async def test_the_youngest_generation_is_collected_on_a_clock() -> None:
    collected: list[int] = []

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collected.append(info["generation"])

    gc.callbacks.append(callback)
    gc.disable()  # no collection but the clock's
    task = asyncio.create_task(collect_young(0.001))
    try:
        await until(lambda: 0 in collected, "a young collection by the clock")
    finally:
        task.cancel()
        gc.enable()
        gc.callbacks.remove(callback)
