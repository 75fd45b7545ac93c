"""What ran in the event loop's long ticks: a stack sampler for `bench/stalls.py --why`.

A thread samples the loop thread's stack (`sys._current_frames`: under greenlet, the
running greenlet's) every millisecond or so (it gets the GIL at the loop thread's
switch interval at the latest) into a ring; when the probe sees a tick that held the
loop's CPU over `threshold`, the samples inside it are kept with the tick. The cyclic
collector's passes over `threshold` are kept with the stack that triggered them. At the
end `report` prints, per long tick, its most common stacks (our frames, innermost last).
Diagnostics only: the sampling itself costs the loop a GIL hand-over per sample.
"""

from __future__ import annotations

import collections
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import CodeType, FrameType

Stack = tuple[tuple[CodeType, int], ...]

_OURS = ("/quota/", "/kube/", "/runtime/", "/webhook/", "/controllers/", "/commands/", "/bench/")


def _stack(frame: FrameType | None, depth: int = 40) -> Stack:
    out: list[tuple[CodeType, int]] = []
    while frame is not None and len(out) < depth:
        out.append((frame.f_code, frame.f_lineno))
        frame = frame.f_back
    return tuple(reversed(out))


def _format(stack: Stack) -> str:
    lines = []
    for n, (code, line) in enumerate(stack):
        if any(p in code.co_filename for p in _OURS) or n >= len(stack) - 3:
            where = code.co_filename.split("/stalls/")[-1].split("site-packages/")[-1]
            lines.append(f"{where}:{line} {code.co_name}")
    return "\n        ".join(lines[-14:])


@dataclass(repr=False)
class Sampler:
    threshold: float = 0.05
    every: float = 0.001
    ring: collections.deque[tuple[float, Stack]] = field(default_factory=lambda: collections.deque(maxlen=4000))
    long: list[tuple[float, float, float, list[Stack]]] = field(default_factory=list)  # (end, cpu, late, samples)
    collections_: list[tuple[float, int, float, Stack]] = field(default_factory=list)
    steps: list[tuple[float, float, Stack, Stack, list[Stack]]] = field(default_factory=list)  # (when, seconds, from, to, samples)
    _gc_started: float = 0.0
    _gc_stack: Stack = ()
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        target = threading.get_ident()

        def sample() -> None:
            while not self._stop.is_set():
                frame = sys._current_frames().get(target)
                self.ring.append((time.time(), _stack(frame)))
                del frame
                time.sleep(self.every)

        threading.Thread(target=sample, daemon=True, name="tick sampler").start()

        # Each slice step (`runtime.slicing._Work`) timed between two pause points: a long
        # one is kept with the stacks of the pause points at both ends.
        from runtime import slicing
        sampler, work, step, pause = self, slicing._Work, slicing._Work.step, slicing._Work._pause

        def timed_step(this: slicing._Work[object], seconds: float) -> bool:
            this._since = (time.thread_time(), _stack(sys._getframe(), 16), time.time())  # type: ignore[attr-defined]
            try:
                return step(this, seconds)
            finally:
                sampler._stepped(this, _stack(sys._getframe(), 16), "end of the step")

        def timed_pause(this: slicing._Work[object]) -> None:
            sampler._stepped(this, _stack(sys._getframe(), 16), "pause point")
            pause(this)
            this._since = (time.thread_time(), this._since[1], time.time())  # type: ignore[attr-defined]

        work.step, work._pause = timed_step, timed_pause  # type: ignore[method-assign,assignment]

    def _stepped(self, work: object, here: Stack, what: str) -> None:
        since, there, wall = work._since  # type: ignore[attr-defined]
        now = time.thread_time()
        if now - since > self.threshold / 2:
            inside = [s for t, s in list(self.ring) if wall <= t <= time.time()]
            self.steps.append((time.time(), now - since, there, here, inside))
        work._since = (now, here, time.time())  # type: ignore[attr-defined]

    def stop(self) -> None:
        self._stop.set()

    def tick(self, start: float, end: float, late: float, cpu: float) -> None:
        """The probe's tick from `start` to `end` (wall clock): kept if it held the CPU long."""
        if cpu > self.threshold:
            self.long.append((end, cpu, late, [s for t, s in list(self.ring) if start <= t <= end]))

    def collected(self, phase: str, info: Mapping[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.thread_time()
            if info["generation"] >= 1:
                self._gc_stack = _stack(sys._getframe().f_back)
        elif (took := time.thread_time() - self._gc_started) > self.threshold / 2:
            self.collections_.append((time.time(), info["generation"], took, self._gc_stack))

    def report(self, windows: list[tuple[str, float, float]]) -> None:
        def window(t: float) -> str:
            return next((name for name, a, b in windows if a <= t <= b), "(between windows)")

        print(f"\n--why: {len(self.long)} ticks over {self.threshold * 1000:.0f} ms CPU")
        for end, cpu, late, samples in self.long:
            print(f"\n* {window(end)}: tick of {cpu * 1000:.0f} ms CPU (late {late * 1000:.0f} ms), "
                  f"{len(samples)} samples; collections in it: "
                  f"{[(g, round(s * 1000)) for t, g, s, _ in self.collections_ if end - cpu - 0.5 <= t <= end]}")
            counted = collections.Counter(_format(s) for s in samples)
            for text, n in counted.most_common(3):
                print(f"    {n} x\n        {text}")
        print(f"\n--why: {len(self.steps)} slice steps over {self.threshold * 500:.0f} ms between two pause points")
        for t, took, there, here, inside in self.steps:
            print(f"\n* {window(t)}: {took * 1000:.0f} ms from\n        {_format(there)}\n    to\n        {_format(here)}")
            for text, n in collections.Counter(_format(s) for s in inside).most_common(3):
                print(f"    sampled {n} x\n        {text}")
        print(f"\n--why: {len(self.collections_)} collections over {self.threshold * 500:.0f} ms")
        for t, generation, took, stack in self.collections_:
            print(f"\n* {window(t)}: generation {generation}, {took * 1000:.0f} ms, triggered in\n        "
                  f"{_format(stack)}")
