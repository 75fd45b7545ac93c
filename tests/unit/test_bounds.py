"""The fuzz bound itself: it must catch a hang and a blow-up, and let normal work pass."""

import pytest
from .bounds import bounded, Exceeded
def test_time():
    with pytest.raises(Exceeded):
        with bounded(seconds=0.2):
            while True: pass
def test_mem():
    with pytest.raises((Exceeded, MemoryError)):
        with bounded(megabytes=10):
            x = "a" * (50 * 1024 * 1024)
def test_ok():
    with bounded(seconds=1, megabytes=10):
        x = [1]*1000
def test_huge():
    with pytest.raises(MemoryError):
        with bounded(megabytes=10):
            x = bytearray(2 * 1024**3)
