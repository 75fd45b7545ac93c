"""Durations the end-to-end tests measure and never assert: tests never time.

A latency bar in a test fails on a busy machine whatever the code does (test_fleet's
p99 once read 5.651 s at load average 5). The tests keep their correctness assertions
and hand each duration here with :func:`record`, beside the target it used to be asserted
against; the session's terminal summary lists them with the load average at the time
each was measured, and bench/e2e_timings.py (which runs these tests) prints them beside
their targets and keeps them in bench/results/ (``DRA_QUOTA_TIMINGS`` names the file).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

TIMINGS_ENV = "DRA_QUOTA_TIMINGS"


@dataclass(frozen=True, slots=True)
class Figure:
    test: str
    name: str
    seconds: float
    target: float | None  # what the figure should stay under on a quiet machine, if anything
    load: tuple[float, float, float]


FIGURES: list[Figure] = []


def record(name: str, seconds: float, *, target: float | None = None) -> None:
    """Keep one measured duration of the running test (never asserted)."""
    test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
    FIGURES.append(Figure(test, name, seconds, target, os.getloadavg()))


def summary() -> list[str]:
    return [render(f) for f in FIGURES]


def render(figure: Figure) -> str:
    target = "" if figure.target is None else (
        f" (target <= {figure.target:g}s: {'met' if figure.seconds <= figure.target else 'MISSED'})")
    load = " ".join(f"{x:.1f}" for x in figure.load)
    return f"{figure.test.rsplit('::', 1)[-1]}: {figure.name} {figure.seconds:.3f}s{target}, load average {load}"


def write_if_asked() -> Path | None:
    """The figures as JSON where ``DRA_QUOTA_TIMINGS`` says (bench/e2e_timings.py sets it)."""
    path = os.environ.get(TIMINGS_ENV)
    if not path:
        return None
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps([asdict(f) for f in FIGURES], indent=1) + "\n")
    return out
