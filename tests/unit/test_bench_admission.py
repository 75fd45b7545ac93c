"""bench/admission.py's harness measures what it says: a small run of each cheap part.

- (a) sends the generated claim mix through the app's own route handler, each admission
  persisted as `serve` persists it (`kube.quotawriter` on the simulated API server):
  every review is answered 200 (the harness asserts it), the allowed ones are written to
  the status and their claims then reach the claim cache annotated, so the record stays
  small; and the handler path costs more CPU per review than the Admitter alone, which it
  includes;
- the open-loop generator counts queueing: against a server that answers one request at
  a time in 20 ms (50/s), 100/s offered for a second builds a backlog whose wait shows
  in the latencies (measured from each request's due time), while a closed loop (one at
  a time) would report only the 20 ms service time.
The cluster sections (b)-(e) need the control plane and minutes: `python bench/admission.py --quick`.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parents[2]
SERVICE_S = 0.02


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_admission", ROOT / "bench" / "admission.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


bench = load()


def test_in_process_reviews_go_through_the_apps_handler() -> None:
    out = bench.section_a(bench.generate_slices(20), 100, lease_period=0.0)  # the exact path
    assert out["devices"] > 0
    for row in (out["one_at_a_time"], out["16_at_a_time"]):
        assert row["reviews"] == 100 and 0 < row["allowed"] <= 100
        # Each persisted (one at a time: a write each; together, some share one).
        assert 0 < row["status_writes"] <= row["allowed"]
        assert 0 < row["reviews_per_cpu_s"] < out["admitter_only_admissions_per_cpu_s"]
    assert out["one_at_a_time"]["status_writes"] == out["one_at_a_time"]["allowed"]
    # Every claim of a group reached the cache annotated before the next group's writes
    # settled: what is left is at most the last group's entries.
    assert out["largest_record_at_end"] <= 16


def test_in_process_reviews_with_leases_admit_with_fewer_writes() -> None:
    """(a) measures `serve`'s default, leases on: admissions under a lease write nothing."""
    out = bench.section_a(bench.generate_slices(20), 100, lease_period=5.0)
    row = out["one_at_a_time"]
    assert row["reviews"] == 100 and 0 < row["allowed"] <= 100
    assert row["status_writes"] < row["allowed"]  # the exact path writes once per admission


async def test_the_open_loop_generator_sees_the_queue_a_closed_loop_hides() -> None:
    lock = asyncio.Lock()

    async def one_at_a_time(request: web.Request) -> web.Response:
        await request.read()
        async with lock:
            await asyncio.sleep(SERVICE_S)  # the simulated service time
        return web.json_response({"response": {"allowed": True}})

    app = web.Application()
    app.router.add_post("/validate", one_at_a_time)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    bodies = [("/validate", b"{}")]
    try:
        async with aiohttp.ClientSession() as session:
            closed = await bench.closed_loop(session, base, bodies * 10)
            under = await bench.open_loop(session, base, bodies, 25, 0.4)
            over = await bench.open_loop(session, base, bodies, 100, 1.0)
    finally:
        await runner.cleanup()
    # Lower bounds only (a busy machine makes latencies longer, never shorter; how short
    # they are is the benchmark's to print): each request waits at least its service time,
    assert len(closed.latencies) == 10 and min(closed.latencies) >= SERVICE_S * 1000
    assert len(under.latencies) == 10 and under.failed == 0
    # and 100 requests due over 1 s, served one per 20 ms, leave the last waiting about 1 s
    # after its due time: the queue shows, which a closed loop's 20 ms never would.
    assert len(over.latencies) == 100 and over.allowed == 100 and over.failed == 0
    assert bench.percentile(over.latencies, 0.99) > 600
