"""What held the event loop of a `serve` that a bench starts: every callback and every turn timed.

Diagnostics only, for bench/startup.py (and any bench that starts `serve` through
devcluster.served with the environment passed on):

    WHY_CODE=$PWD python bench/startup.py --workdir DIR --serve-path $PWD/bench/loopwhy

`--serve-path` makes this directory the `serve` process's PYTHONPATH, so Python imports
this module as it starts; `WHY_CODE` names the checkout that process runs (put on its
path here). Only a process whose POD_NAME starts with "serve" (devcluster.served names
each after its log) is touched. In it, every loop callback is timed in the loop thread's
CPU (`time.thread_time`, two reads a callback), and so is every turn of the loop
(`BaseEventLoop._run_once`); `WHY_AFTER` seconds after the start (45 by default), and at
exit, /tmp/loopwhy-PID.txt lists each callback over `WHY_MS` (25) ms and each turn over
`WHY_ITER_MS` (40) ms with the callbacks over 2 ms that made it, each named by its task and
where that task stands now. Unlike a stack sampler (bench/longticks.py), it needs no
second thread taking the GIL, and it names whole callbacks: CPU a callback held, not
where a sample fell.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

_code = os.environ.get("WHY_CODE")


def _install(code: str) -> None:
    import asyncio.base_events as base_events
    import asyncio.events as events

    sys.path.insert(0, code)
    started = time.time()
    callback_over = float(os.environ.get("WHY_MS", "25")) / 1000
    turn_over = float(os.environ.get("WHY_ITER_MS", "40")) / 1000
    callbacks: list[tuple[float, float, str]] = []  # (at, CPU seconds, what)
    turns: list[tuple[float, float, float, list[tuple[float, str]]]] = []  # (at, CPU, wall, callbacks)
    this_turn: list[tuple[float, str]] = []

    def describe(callback: Callable[..., Any]) -> str:
        owner = getattr(callback, "__self__", None)
        if owner is not None and hasattr(owner, "get_stack"):
            frames = owner.get_stack(limit=30)
            return f"{owner.get_name()} now at " + " <- ".join(
                f"{f.f_code.co_filename.rsplit('/', 1)[-1]}:{f.f_lineno} {f.f_code.co_name}" for f in reversed(frames))
        return repr(callback)[:160]

    run_callback = events.Handle._run

    def timed_callback(handle: events.Handle) -> None:
        cpu = time.thread_time()
        try:
            run_callback(handle)
        finally:
            took = time.thread_time() - cpu
            if took > 0.002:
                what = describe(handle._callback)  # type: ignore[attr-defined]
                this_turn.append((took, what))
                if took > callback_over:
                    callbacks.append((time.time() - started, took, what))

    run_turn = base_events.BaseEventLoop._run_once  # type: ignore[attr-defined]

    def timed_turn(loop: base_events.BaseEventLoop) -> None:
        this_turn.clear()
        cpu, wall = time.thread_time(), time.time()
        run_turn(loop)
        took = time.thread_time() - cpu
        if took > turn_over:
            turns.append((wall - started, took, time.time() - wall, sorted(this_turn, reverse=True)[:6]))

    events.Handle._run = timed_callback  # type: ignore[method-assign,assignment]
    base_events.BaseEventLoop._run_once = timed_turn  # type: ignore[attr-defined]
    written: list[bool] = []

    def report() -> None:
        if written:
            return
        written.append(True)
        with open(f"/tmp/loopwhy-{os.getpid()}.txt", "w") as out:
            out.write(f"callbacks over {callback_over * 1000:.0f} ms of CPU:\n")
            for at, took, what in callbacks:
                out.write(f"* at {at:.2f} s: {took * 1000:.0f} ms: {what}\n")
            out.write(f"\nturns of the loop over {turn_over * 1000:.0f} ms of CPU:\n")
            for at, took, wall, top in turns:
                out.write(f"* at {at:.2f} s: {took * 1000:.0f} ms ({wall * 1000:.0f} ms wall), the callbacks over 2 ms:\n")
                for each, what in top:
                    out.write(f"    {each * 1000:.1f} ms {what}\n")

    timer = threading.Timer(float(os.environ.get("WHY_AFTER", "45")), report)
    timer.daemon = True
    timer.start()
    atexit.register(report)


if _code and os.environ.get("POD_NAME", "").startswith("serve"):
    _install(_code)
