"""The unit suite's own checks (conftest.py): a test that leaves an asyncio task pending fails."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

LEAKS = '''
import asyncio

import pytest


async def test_leaves_a_task_on_its_loop():
    asyncio.create_task(asyncio.sleep(3600), name="forgotten")


@pytest.mark.asyncio(loop_scope="session")
async def test_leaves_a_task_on_the_session_loop():
    asyncio.create_task(asyncio.sleep(3600), name="forgotten-too")


@pytest.fixture
async def server():
    task = asyncio.create_task(asyncio.sleep(3600))
    yield
    task.cancel()


async def test_cancels_what_it_starts(server):
    asyncio.create_task(asyncio.sleep(3600)).cancel()  # cancelled, not awaited: not a leak
    task = asyncio.create_task(asyncio.sleep(3600))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_awaits_what_it_starts():
    await asyncio.create_task(asyncio.sleep(0))


def test_not_async():
    pass
'''


def test_a_test_that_leaves_a_task_pending_fails_and_others_pass(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(Path(__file__).with_name("conftest.py").read_text())
    pytester.makeini("[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = session\n")
    pytester.makepyfile(test_leaks=LEAKS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=5, errors=2)
    result.stdout.fnmatch_lines([
        "*ERROR at teardown of test_leaves_a_task_on_its_loop*",
        "*1 asyncio task(s) left pending: <Task pending name='forgotten'*",
        "*ERROR at teardown of test_leaves_a_task_on_the_session_loop*",
        "*1 asyncio task(s) left pending: <Task pending name='forgotten-too'*",
    ])
