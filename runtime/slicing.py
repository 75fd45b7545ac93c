"""Pricing in slices: no review's pricing holds the event loop for long.

One tenant's expensive selectors must not delay everyone else's answers.

Neighbours: `webhook.endpoints` runs every synchronous handler through `Slicer.run`,
and `webhook.claimreview` its pricing calls; the leader's Kueue decisions
(`controllers.kueue`) and the refinement of stored claims (`controllers.refine`) too. The
domain (`quota.values.work`) only calls a pause hook at its pause points: every
`quota.values.work.PAUSE_EVERY` CEL cost units of an evaluation, every 256 device groups of a
match, every token and AST node while compiling; and a wait hook where it waits on
another call's work (a partition another review is rebuilding), which ends the slice
at once. `quota.values.work` budgets bound the total;
this module bounds how long the loop is held at once.

How: `run(fn)` calls `fn` in a greenlet (a stack of its own on the loop's thread, no
thread), one of a few workers that take calls in turn (`_Workers`: a new greenlet per
call cost every review an mmap and a munmap). The hook switches back to `run` when the
slice's time is up; `run` awaits, then switches in again. A single CEL evaluation (up
to 1,000,000 units, 100-200 ms in Python) or a 10 KiB compile (~200 ms) pauses in the
middle, which generators could not do without rewriting the evaluator. No thread
touches the caches: everything runs on the loop's thread, one greenlet at a time, and
the domain mutates a shared cache only between pause points (a match walks a snapshot
of its partition, `quota.devices.selectors`).

Lanes: a call whose `fn` finishes within `FIRST_SLICE` (honest claims: well under a
millisecond once their selectors are known) returns at once. One that does not waits
for the slow lane: at most `SLOW_LANE` such calls run at a time, each giving the loop
back every `SLICE`, so cheap reviews arriving meanwhile are answered between slices
and never queue behind expensive ones. At most `SLOW_LANE_QUEUE` wait; past that a
review's call is refused at once (`Busy`) rather than held until its webhook deadline.
A background caller's call (`run(..., wait=True)`: the leader's annotations,
`controllers.annotator`; stored claims' pricing, `controllers.refine`) has no deadline
and nobody to retry it: it waits its turn in the lane however full, counted in
`crowded`, and is never refused. It still counts among the waiting, so reviews are
refused as early as ever. A call cancelled while paused (the review's deadline) kills
its worker, unwinding it.

Background work (`in_slices`: a relist's rebuild, a scrape, `kube.rebuilds`) takes
no lane and is never refused: it gives the loop back every `SLICE` from the start, so
reviews are answered between its slices and nothing a tenant sends can queue it out.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

from greenlet import GreenletExit, greenlet

from quota.values.work import pausing

__all__ = ["FIRST_SLICE", "SLICE", "SLOW_LANE", "SLOW_LANE_QUEUE", "Busy", "Slicer", "in_slices"]

log = logging.getLogger(__name__)

T = TypeVar("T")

FIRST_SLICE = 0.005  # seconds: what any review may take before it yields the loop
SLICE = 0.002  # seconds: each slow-lane turn
SLOW_LANE = 1  # slow-lane calls running at once
SLOW_LANE_QUEUE = 32  # slow-lane calls waiting at most
IDLE_WORKERS = 8  # worker greenlets kept for the next calls (`_Workers`)


class Busy(Exception):
    """The slow lane is full: the call is refused without running further."""

    def __init__(self, queue: int) -> None:
        super().__init__(f"dra-quota is busy pricing {queue} other expensive requests; retry shortly (claims whose "
                         "selectors are cheap to evaluate are not held back by this)")


class _Work(Generic[T]):
    """`fn` run slice by slice on a worker greenlet (`_workers`) of its own while it runs."""

    def __init__(self, fn: Callable[[], T]) -> None:
        self._fn = fn
        self._glet: greenlet | None = None  # the worker, from the first step until `fn` ends
        self._deadline = 0.0
        self._value: object = None
        self._error: BaseException | None = None
        self._done = False

    def call(self) -> None:
        """On the worker: `fn` under this call's pause hook, its value or exception kept."""
        with pausing(self._pause, self._yield):
            try:
                self._value = self._fn()
            except GreenletExit:
                raise  # `close`: the worker unwinds and dies
            except BaseException as err:  # noqa: BLE001 - re-raised on the caller's side, in `step`
                self._error = err

    def _pause(self) -> None:
        if time.thread_time() >= self._deadline:
            self._yield()

    @staticmethod
    def _yield() -> None:
        """The loop back now (`quota.values.work.wait_point`: this call waits on another's)."""
        parent = greenlet.getcurrent().parent
        assert parent is not None
        parent.switch()

    def step(self, seconds: float) -> bool:
        """Run for about `seconds` of this thread's CPU time; True once `fn` returned (its
        exception propagates). CPU, not wall time: where other processes take the cores
        (a loaded node), a review preempted by the kernel has not used its slice, and a
        cheap one must not land in the slow lane behind expensive ones for that."""
        self._deadline = time.thread_time() + seconds
        if self._glet is None:
            self._glet = _workers.take()
            signal = self._glet.switch(self)
        else:
            signal = self._glet.switch()
        if signal is not _DONE:
            return False  # paused
        self._done = True
        _workers.give_back(self._glet)
        self._glet = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return True

    @property
    def value(self) -> T:
        assert self._done
        return cast(T, self._value)

    def close(self) -> None:
        """Unwind `fn` if it is paused; its worker dies with it (never reused half-way)."""
        if self._glet is not None:
            glet, self._glet = self._glet, None
            if not glet.dead:
                glet.throw(GreenletExit)


_DONE = object()  # what a worker switches back with once its call has ended


def _serve(work: _Work[Any]) -> None:
    """A worker's life: run each call given to it, then wait for the next one."""
    while True:
        work.call()
        parent = greenlet.getcurrent().parent
        assert parent is not None
        del work  # an idle worker keeps nothing of its last call (a review's claim, a scrape)
        work = parent.switch(_DONE)


class _Workers(threading.local):
    """This thread's idle worker greenlets.

    Why: CPython 3.11 gives each new greenlet's frames a data stack of their own, mapped
    at its first frame and unmapped when it ends (an mmap and a munmap, and a page
    fault, for every greenlet): with a greenlet per call that was 15 us a review on an
    idle core and more on a loaded one, for reviews whose whole pricing takes less. A
    worker that ran a call to its end is clean (its `pausing` undone) and takes the next.
    """

    def __init__(self) -> None:
        self.idle: list[greenlet] = []

    def take(self) -> greenlet:
        here = greenlet.getcurrent()
        while self.idle:
            worker = self.idle.pop()
            if not worker.dead:
                worker.parent = here  # it switches back to whoever runs its call
                return worker
        return greenlet(_serve, parent=here)

    def give_back(self, worker: greenlet) -> None:
        if len(self.idle) < IDLE_WORKERS:
            self.idle.append(worker)


_workers = _Workers()


class Slicer:
    """Runs synchronous pricing in slices, expensive calls in a bounded slow lane."""

    def __init__(self, *, first_slice: float = FIRST_SLICE, slice_seconds: float = SLICE, lane: int = SLOW_LANE,
                 queue: int = SLOW_LANE_QUEUE) -> None:
        self.first_slice = first_slice
        self.slice_seconds = slice_seconds
        self.queue = queue
        self._lane = asyncio.Semaphore(lane)
        self._waiting = 0
        self.slow_calls = 0  # calls that went to the slow lane (tests and metrics read it)
        # Waiting calls that found the slow lane full (a review's would have been refused):
        # what a background caller's work built meanwhile includes an attack's garbage.
        self.crowded = 0

    @property
    def waiting(self) -> int:
        return self._waiting

    async def run(self, fn: Callable[[], T], *, wait: bool = False) -> T:
        """`fn()`, given the loop back between slices once past its first (module doc).

        `wait`: a background caller's; past a full slow lane it waits its turn (counted
        in `crowded`) instead of being refused with `Busy`."""
        work = _Work(fn)
        try:
            if work.step(self.first_slice):
                return work.value
            if self._waiting >= self.queue:
                if not wait:
                    raise Busy(self._waiting)
                self.crowded += 1
            self.slow_calls += 1
            log.debug("pricing did not finish in its first slice: slow lane (%d waiting)", self._waiting)
            self._waiting += 1
            try:
                await self._lane.acquire()
            finally:
                self._waiting -= 1
            try:
                return await _finish(work, self.slice_seconds)
            finally:
                self._lane.release()
        finally:
            work.close()


async def in_slices(fn: Callable[[], T], *, slice_seconds: float = SLICE) -> T:
    """`fn()` run to the end, giving the loop back every `slice_seconds` (module doc:
    background work); `fn`'s exception propagates, cancelling unwinds it."""
    work = _Work(fn)
    try:
        return await _finish(work, slice_seconds)
    finally:
        work.close()


async def _finish(work: _Work[T], slice_seconds: float) -> T:
    while True:
        await asyncio.sleep(0)
        if work.step(slice_seconds):
            return work.value
