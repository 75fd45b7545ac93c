"""Hypothesis without its per-example deadline, for every property and fuzz test.

Hypothesis fails an example that takes over 200 ms of wall-clock time by default: a
latency bar that a busy CI machine trips whatever the code does (tests never time). Hangs
and blow-ups are caught by CPU-time and memory bounds instead (bounds.py).
"""

from __future__ import annotations

from hypothesis import settings

settings.register_profile("dra-quota", deadline=None)
settings.load_profile("dra-quota")
