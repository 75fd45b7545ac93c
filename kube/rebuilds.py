"""Big rebuilds of the caches, in slices, with the cyclic collector kept off what they build.

Neighbours: every `kube.watching.Reflector` of `commands.serve` hands its lists to
`Rebuilds.run` (its `rebuild`), and `webhook.metricsserver` each scrape; the work runs
in slices through `runtime.slicing.in_slices` and pauses where the domain says it may
(`quota.values.work.pause_point`: `quota.devices.inventory`, `quota.accounting.ledger`, `kube.claimstore`,
`webhook.usagemetrics`). How each store stays atomic while its relist runs in slices
is theirs to say (`kube.watching`): build aside, swap in one step.

The collector. CPython's full collection walks every object not frozen in one piece,
about 0.6 us an object here: after a relist of 150,000 claims (2.2 million new objects)
that was 1.4 s, and it comes soon after, as the oldest generation is collected once the
objects promoted since the last full collection exceed a quarter of those it kept
(bench/stalls.py). So:
- while any rebuild runs, full collections are off (the oldest generation's threshold
  raised); young collections go on and keep collecting the reviews' garbage;
- while a relist runs (`rebuilding`, which freezes what it built), so are the middle
  generation's: everything a relist builds survives its young collection, and the
  middle one walked all of it again once ten young ones had promoted it, about 220 ms
  of claims being staged at a time: 27 ms of CPU in one piece of the loop at 150,000
  claims, the longest callback of a start-up (bench/startup.py with bench/loopwhy). The freeze at its end takes what they promoted without a walk; what the
  middle collections would have freed meanwhile is a cycle that outlived one young
  collection and died before the freeze (a request's, as above), frozen with the rest;
- once a relist is swapped in (`freeze=True`), everything alive is frozen
  (`gc.freeze`), as `serve` freezes its caches once they first synced: no later
  collection walks the new caches again. Reference counting still frees whatever of
  them a later event replaces; what freezing costs is that a reference cycle frozen
  and dropped later is never collected (the caches hold none; a connection or a
  request in flight at that moment may), nor is a cycle that died while full
  collections were off, promoted to the oldest generation meanwhile (a request's
  garbage during the rebuild: a small, one-off cost per relist). So only lists freeze,
  which are rare (the first ones, then a 410 Gone), and a drain of stored claims that
  never met a full slow lane (`controllers.refine`); a scrape only keeps full collections
  off while it runs;
- the youngest generation is collected on a clock (`Rebuilds.collect`, every
  `YOUNG_EVERY`). CPython collects it once allocations less deallocations since the
  last collection pass 700; work that frees old objects as it makes new ones (stored
  claims priced after ready, each replacing its bound; a scrape rendering claims again)
  keeps that count low while the generation grows: 184,000 objects, 0.2 s in one
  collection (bench/stalls.py). On a clock, a collection walks what one period made;
- full collections come from that clock too, at most one every `FULL_EVERY`, never
  while a rebuild runs. CPython starts one once a quarter as many objects as the
  oldest generation holds have been promoted since the last; after a freeze that
  generation holds little but the connections open now, which live seconds (deadlines
  of 10 s, idle 120 s), so a flood of connections (bench/connections.py: about 600
  held, 40 tracked objects each) promoted that quarter every 3-7 s, and each full
  collection walked all of them: 25-90 ms on a loaded node, the longest ticks of the
  loop after the flood's own work. They freed little: up to 5,000 objects a pass, the
  cycles of bodies cut off midway, which `webhook.server` now breaks (a closed
  connection leaves none: `webhook.connections`); since, 0-64. Bounded by time, they
  cost at most one such tick a minute, and cyclic garbage still goes within a minute of
  reaching the oldest generation: nothing more is frozen, so memory stays bounded by the
  cyclic garbage one minute makes.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

from quota.values.raw import Obj
from quota.values.work import drop
from runtime.slicing import SLICE, in_slices

__all__ = ["FULL_EVERY", "OFF", "YOUNG_EVERY", "Rebuilds"]

T = TypeVar("T")

OFF = 1 << 30  # the oldest generation's threshold while a rebuild runs: never reached
YOUNG_EVERY = 0.02  # seconds between two collections of the youngest generation
FULL_EVERY = 60.0  # seconds at least between two full collections (module doc)


class Rebuilds:
    """Runs rebuilds in slices; full collections stay off while any runs (module doc)."""

    def __init__(self, *, slice_seconds: float = SLICE) -> None:
        self.slice_seconds = slice_seconds
        self._running = 0
        self._saved = 0  # the oldest generation's threshold before the first rebuild began
        self._relists = 0  # `rebuilding` under way: the middle generation's collections off
        self._middle = 0  # its threshold before the first of them began
        self.freezes = 0  # relists whose heap was frozen (tests and the bench read it)

    async def relist(self, fetch: Callable[[], Awaitable[list[Obj]]], replace: Callable[[list[Obj]], None]) -> None:
        """A reflector's `rebuild` (`kube.watching.Rebuild`): a rebuild from the first page
        fetched (each page's objects are promoted as the list grows) until `replace` swapped
        the list in, in slices."""
        with self.rebuilding():
            items = await fetch()

            def apply() -> None:
                replace(items)
                drop(items)  # the raw objects too, in pieces (`quota.values.work.drop`)

            await in_slices(apply, slice_seconds=self.slice_seconds)

    async def run(self, fn: Callable[[], T]) -> T:
        """`fn()` in slices, full collections off meanwhile (a scrape: nothing frozen)."""
        with self.quiet():
            return await in_slices(fn, slice_seconds=self.slice_seconds)

    @contextlib.contextmanager
    def rebuilding(self) -> Iterator[None]:
        """Full and middle collections off meanwhile; what is alive frozen once it is
        done, before they are back on (module doc)."""
        with self.quiet():
            self._relists += 1
            if self._relists == 1:
                young, self._middle, old = gc.get_threshold()
                gc.set_threshold(young, OFF, old)
            try:
                yield
                self.freeze()
            finally:
                self._relists -= 1
                if self._relists == 0:
                    young, _, old = gc.get_threshold()
                    gc.set_threshold(young, self._middle, old)

    def freeze(self) -> None:
        """Freeze what is alive (inside `quiet`, before full collections are back on)."""
        gc.freeze()
        self.freezes += 1

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """Full collections off meanwhile."""
        self._enter()
        try:
            yield
        finally:
            self._leave()

    async def collect(self, *, period: float = YOUNG_EVERY, full_every: float = FULL_EVERY) -> None:
        """Until cancelled, the collector on a clock (module doc): the youngest generation
        every `period` seconds, the middle one after as many of those as its threshold
        says, as CPython would, and the oldest when CPython would, but at most once every
        `full_every` seconds and never while a rebuild runs."""
        old = self._take_full_collections()
        last_full = time.monotonic()
        try:
            while True:
                await asyncio.sleep(period)
                gc.collect(0)
                if gc.get_count()[1] > gc.get_threshold()[1]:
                    gc.collect(1)
                now = time.monotonic()
                if not self._running and gc.get_count()[2] > old and now - last_full >= full_every:
                    gc.collect(2)
                    last_full = now
        finally:
            self._give_full_collections_back(old)

    def _take_full_collections(self) -> int:
        """CPython's own full collections off (for `collect`); the threshold they had."""
        young, middle, old = gc.get_threshold()
        if self._running:  # what a rebuild's end restores is off too
            old, self._saved = self._saved, OFF
        gc.set_threshold(young, middle, OFF)
        return old

    def _give_full_collections_back(self, old: int) -> None:
        if self._running:
            self._saved = old
        else:
            young, middle, _ = gc.get_threshold()
            gc.set_threshold(young, middle, old)

    def _enter(self) -> None:
        if self._running == 0:
            young, middle, self._saved = gc.get_threshold()
            gc.set_threshold(young, middle, OFF)
        self._running += 1

    def _leave(self) -> None:
        self._running -= 1
        if self._running == 0:
            young, middle, _ = gc.get_threshold()
            gc.set_threshold(young, middle, self._saved)
