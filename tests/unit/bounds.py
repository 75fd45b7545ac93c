"""Per-example limits for fuzz tests: a hang or a memory blow-up fails the example.

Hypothesis' `deadline` only reports slowness after the example returns, so a hang
would hang the suite; `bounded` arms a timer instead. It counts the process's CPU time
(ITIMER_PROF, SIGPROF), not the wall clock: the code under test is CPU-bound, and on a
shared CI machine other processes' load must not fail a bound meant for our work. Memory is measured with
tracemalloc (the peak of Python allocations made inside the block), and the
address-space limit is lowered for the block as a safety net so that a runaway
allocation raises MemoryError in the test instead of taking the machine down.
Main thread only (signals); pytest runs tests there.
"""

from __future__ import annotations

import os
import resource
import signal
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["Exceeded", "bounded", "fuzz_examples"]

MiB = 1024 * 1024


class Exceeded(AssertionError):
    """The block ran past its time or memory bound."""


def _address_space() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    raise Exceeded("time bound exceeded")


@contextmanager
def bounded(*, seconds: float = 5.0, megabytes: int = 256) -> Iterator[None]:
    """Fail (Exceeded) when the body uses over `seconds` of CPU or allocates over `megabytes`."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    # Generous on purpose: tracemalloc gives the precise verdict below; this only stops
    # a multi-gigabyte allocation before the kernel's OOM killer does.
    ceiling = _address_space() + 4 * megabytes * MiB
    if hard != resource.RLIM_INFINITY:
        ceiling = min(ceiling, hard)
    previous = signal.signal(signal.SIGPROF, _on_alarm)
    started_tracing = not tracemalloc.is_tracing()
    if started_tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    resource.setrlimit(resource.RLIMIT_AS, (ceiling, hard))
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
        _, peak = tracemalloc.get_traced_memory()
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        if started_tracing:
            tracemalloc.stop()
    if peak > megabytes * MiB:
        raise Exceeded(f"memory bound exceeded: peak {peak // MiB} MiB > {megabytes} MiB")


def fuzz_examples(default: int) -> int:
    """Examples per fuzz test: `default` in the suite, DRA_QUOTA_FUZZ_EXAMPLES for a long
    run (bench/fuzz.py finds the suites by their calls to this function)."""
    return int(os.environ.get("DRA_QUOTA_FUZZ_EXAMPLES", str(default)))
