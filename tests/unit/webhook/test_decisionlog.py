"""webhook.decisionlog: a namespace's denials past the first of an interval are counted, then told."""

from __future__ import annotations

import asyncio
import logging

import pytest

from runtime.logbounds import Sampler
from webhook.decisionlog import DenialLog


async def test_what_an_interval_held_back_is_told_once_it_is_over_without_another_denial(
    caplog: pytest.LogCaptureFixture
) -> None:
    log = logging.getLogger("webhook.server")
    denials = DenialLog(log, Sampler(per_interval=2, interval=0.05))
    with caplog.at_level(logging.INFO, logger="webhook.server"):
        assert [denials.admit("mallory") for _ in range(5)] == [True, True, False, False, False]
        assert denials.admit("alice")

        async def told() -> None:
            while not any(getattr(r, "suppressed", 0) for r in caplog.records):
                await asyncio.sleep(0.01)

        await asyncio.wait_for(told(), timeout=10)
    (summary,) = [r for r in caplog.records if hasattr(r, "suppressed")]
    assert summary.getMessage() == ("suppressed 3 denials in namespace mallory (0 s interval: the first 2 of each "
                                    "are logged)")
    assert (summary.levelno, getattr(summary, "namespace")) == (logging.INFO, "mallory")


async def test_at_debug_every_denial_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("webhook.server")
    denials = DenialLog(log, Sampler(per_interval=2, interval=60))
    with caplog.at_level(logging.DEBUG, logger="webhook.server"):
        assert all(denials.admit("mallory") for _ in range(5))
    assert not [r for r in caplog.records if hasattr(r, "suppressed")]
