"""Hypothesis without its per-example deadline, for every property and fuzz test; and no
asyncio task left pending by a test.

Hypothesis fails an example that takes over 200 ms of wall-clock time by default: a
latency bar that a busy CI machine trips whatever the code does (tests never time). Hangs
and blow-ups are caught by CPU-time and memory bounds instead (bounds.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import settings

settings.register_profile("dra-quota", deadline=None)
settings.load_profile("dra-quota")


# -- asyncio tasks a test leaves behind ---------------------------------------------------------


def _test_loops(request: pytest.FixtureRequest) -> list[asyncio.AbstractEventLoop]:
    """The event loops an async test and its async fixtures run on: the test's (its
    `asyncio` mark's loop_scope, else the configured default) and the session's, where
    async fixtures run by default (asyncio_default_fixture_loop_scope)."""
    marker = request.node.get_closest_marker("asyncio")
    if marker is None:
        return []
    scope = (marker.kwargs.get("loop_scope") or request.config.getini("asyncio_default_test_loop_scope")
             or "function")
    # pytest-asyncio's runner fixtures: requested here, before the test's, so a
    # function-scoped loop closes (cancelling what is left) only after the check below.
    runners = {request.getfixturevalue(f"_{s}_scoped_runner") for s in (scope, "session")}
    return [runner.get_loop() for runner in runners]


def leaked_tasks(loop: asyncio.AbstractEventLoop, before: set[asyncio.Task[Any]]) -> list[asyncio.Task[Any]]:
    """Tasks on `loop` that were not there in `before`, neither finished nor cancelled:
    left running by whoever made them, to be cancelled unseen when the loop closes."""
    return [t for t in asyncio.all_tasks(loop) if t not in before and not t.done() and not t.cancelling()]


@pytest.fixture(autouse=True)
def no_leaked_tasks(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves asyncio tasks pending after its fixtures are torn down:
    a task nobody awaits or cancels hides its exceptions and outlives what it used."""
    loops = _test_loops(request)
    before = {loop: asyncio.all_tasks(loop) for loop in loops}
    yield
    leaked = [t for loop in loops for t in leaked_tasks(loop, before[loop])]
    if leaked:
        message = f"{len(leaked)} asyncio task(s) left pending: " + "; ".join(map(repr, leaked))
        for task in leaked:  # not left to disturb the next test on a shared loop
            task.cancel()
        pytest.fail(message, pytrace=False)
