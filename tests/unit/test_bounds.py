"""The fuzz bound itself: it must catch a hang and a blow-up, and let normal work pass."""

from __future__ import annotations

import pytest

from .bounds import Exceeded, bounded


def test_a_hang_is_stopped() -> None:
    with pytest.raises(Exceeded, match="time bound"):
        with bounded(seconds=0.2):
            while True:
                pass


def test_a_large_allocation_fails_the_bound() -> None:
    with pytest.raises((Exceeded, MemoryError)):
        with bounded(megabytes=10):
            blob = "a" * (50 * 1024 * 1024)
            assert blob


def test_a_runaway_allocation_raises_memory_error_instead_of_swapping() -> None:
    with pytest.raises(MemoryError):
        with bounded(megabytes=10):
            bytearray(2 * 1024**3)


def test_ordinary_work_passes() -> None:
    with bounded(seconds=1, megabytes=10):
        assert sum([1] * 1000) == 1000
