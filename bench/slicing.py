"""Expensive claims in flight: an honest review's latency and the longest event-loop stall.

The attack: a 6.3 KB dryRun claim of 32 requests x 8 subrequests, each with its own
salted, per-device, looping selector, held `serve`'s loop for ~57 s before pricing ran
in slices. This starts the real aiohttp app (`webhook.server.build_app` with
`webhook.endpoints`, reservations persisted as `serve` persists them, on
bench/admission.py's in-process API stand-in: no namespace here has a DeviceQuota, so
none is written) in a child process on a loopback socket, over a generated inventory,
and measures, per phase:
- honest reviews (a claim with a seen selector, one every 20 ms) p50/p99/max, client side;
- the longest stall of the child's event loop (a 1 ms ticker's overshoot);
- what the attackers' reviews were answered (the budget's message, a timeout, busy);
with 0 and then N attackers, each keeping one expensive dryRun review in flight; then
the same attack with slicing off (`--no-slicing`: one slice of unbounded length), for
the before figure. Plain HTTP on 127.0.0.1 (TLS changes neither the loop nor pricing).

    python bench/slicing.py [--nodes 1000] [--attackers 4] [--seconds 10]

Not a timed test. Prints the load average beside the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))
from admission import claim, persisted, review  # noqa: E402
from inventory import generate_device_classes, generate_slices  # noqa: E402

from quota.accounting.ledger import Ledger  # noqa: E402
from quota.admission.admitter import Admitter  # noqa: E402
from quota.admission.policy import AdminAccessPolicy  # noqa: E402
from quota.devices.inventory import Inventory  # noqa: E402
from quota.objects.claims import parse_device_class  # noqa: E402
from quota.pricing.pricer import Pricer  # noqa: E402
from quota.values.model import DeviceClassName  # noqa: E402
from runtime.slicing import Slicer  # noqa: E402
from webhook.claimreview import ClaimContext  # noqa: E402
from webhook.endpoints import endpoints  # noqa: E402
from webhook.server import build_app  # noqa: E402

D = "gpu.nvidia.com"
JSON = dict[str, Any]
HONEST_EVERY = 0.02  # seconds between two honest reviews


def honest_spec() -> JSON:
    return {"devices": {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": "gpu.nvidia.com", "count": 1,
        "selectors": [{"cel": {"expression": f"device.attributes['{D}'].productName == 'NVIDIA H100 80GB HBM3'"}}]}}]}}


def attack_spec(salt: int) -> JSON:
    """32 requests x 8 subrequests, each selector new (salted), read per device (the
    whole attribute map) with a loop: nothing cached helps, grouping cannot."""
    def selector(r: int, s: int) -> JSON:
        expr = (f"size(device.attributes['{D}']) > 0 && "
                f"lists.range(40).all(x, x + {salt * 256 + r * 8 + s} >= 0)")
        return {"cel": {"expression": expr}}

    return {"devices": {"requests": [
        {"name": f"r{r}", "firstAvailable": [
            {"name": f"s{s}", "deviceClassName": "gpu.nvidia.com", "selectors": [selector(r, s)]} for s in range(8)]}
        for r in range(32)]}}


# -- the server (child process) -------------------------------------------------------------------


def serve(port: int, nodes: int, slicing: bool, ready: Any) -> None:
    inventory = Inventory()
    inventory.replace_all(generate_slices(nodes, 8))
    gc.collect()
    gc.freeze()  # as `serve` does once its caches synced
    classes = {DeviceClassName(c["metadata"]["name"]): parse_device_class(c) for c in generate_device_classes()}
    slicer = Slicer() if slicing else Slicer(first_slice=float("inf"))
    admitter = Admitter(Pricer(inventory, classes), Ledger())
    ctx = ClaimContext(admitter, lambda ns: {}, AdminAccessPolicy, persisted(admitter)[0], slicer=slicer)
    app = build_app(endpoints(ctx), ready=lambda: True)
    stall = {"max": 0.0, "cpu": 0.0, "gc": 0.0, "gc_started": 0.0}

    def collected(phase: str, _: dict[str, int]) -> None:
        # The cyclic collector stops the loop too; told apart so a stall can be read.
        if phase == "start":
            stall["gc_started"] = time.perf_counter()
        else:
            stall["gc"] = max(stall["gc"], time.perf_counter() - stall["gc_started"])

    gc.callbacks.append(collected)

    async def ticker() -> None:
        # Wall time between two turns, and the process's CPU time in it: on a shared
        # machine the OS also takes the CPU away; the CPU figure is what our code held.
        while True:
            started, cpu = time.perf_counter(), time.process_time()
            await asyncio.sleep(0.001)
            stall["max"] = max(stall["max"], time.perf_counter() - started - 0.001)
            stall["cpu"] = max(stall["cpu"], time.process_time() - cpu)

    async def read_stall(_: web.Request) -> web.Response:
        longest, cpu, collection = stall["max"], stall["cpu"], stall["gc"]
        stall["max"] = stall["cpu"] = stall["gc"] = 0.0
        return web.json_response({"stall_ms": longest * 1000, "stall_cpu_ms": cpu * 1000, "gc_ms": collection * 1000,
                                  "slow_calls": slicer.slow_calls})

    app.router.add_get("/stall", read_stall)

    async def main() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        task = asyncio.create_task(ticker())
        ready.set()
        try:
            await asyncio.Event().wait()
        finally:
            task.cancel()

    asyncio.run(main())


# -- the clients ------------------------------------------------------------------------------------


async def post(session: aiohttp.ClientSession, url: str, body: JSON) -> tuple[float, JSON]:
    started = time.perf_counter()
    async with session.post(url, json=body, params={"timeout": "5s"}) as response:
        answer = await response.json()
    return time.perf_counter() - started, answer["response"]


def kind_of(response: JSON) -> str:
    message = (response.get("status") or {}).get("message", "")
    if response["allowed"]:
        return "allowed"
    for key, name in (("per-claim budget", "denied: claim budget"), ("per-review budget", "denied: review budget"),
                      ("webhook timeout", "denied: timeout"), ("busy pricing", "denied: busy")):
        if key in message:
            return name
    return f"denied: {message[:60]}"


async def phase(url: str, attackers: int, seconds: float) -> JSON:
    latencies: list[float] = []
    answers: Counter[str] = Counter()
    stop = time.perf_counter() + seconds
    connector = aiohttp.TCPConnector(limit=attackers + 4)
    async with aiohttp.ClientSession(connector=connector) as session:
        await session.get(url + "/stall")  # reset

        async def attack(i: int) -> None:
            salt = i * 100_000
            while time.perf_counter() < stop:
                salt += 1
                _, response = await post(session, url + "/validate",
                                         review(claim(attack_spec(salt), "team-a"), namespace="team-a", dry_run=True))
                answers[kind_of(response)] += 1

        async def honest() -> None:
            while time.perf_counter() < stop:
                took, response = await post(session, url + "/validate",
                                            review(claim(honest_spec(), "team-b"), namespace="team-b", dry_run=True))
                assert response["allowed"], response
                latencies.append(took)
                await asyncio.sleep(HONEST_EVERY)

        await asyncio.gather(honest(), *(attack(i) for i in range(attackers)))
        async with session.get(url + "/stall") as response:
            server = await response.json()
    latencies.sort()
    return {"attackers": attackers, "honest_n": len(latencies),
            "honest_p50_ms": round(statistics.median(latencies) * 1000, 2),
            "honest_p99_ms": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] * 1000, 2),
            "honest_max_ms": round(latencies[-1] * 1000, 2),
            "longest_stall_ms": round(server["stall_ms"], 2), "longest_stall_cpu_ms": round(server["stall_cpu_ms"], 2),
            "longest_gc_ms": round(server["gc_ms"], 2),
            "slow_lane_calls": server["slow_calls"],
            "attack_answers": dict(answers)}


def run(nodes: int, attackers: int, seconds: float, slicing: bool, port: int) -> list[JSON]:
    ready = multiprocessing.Event()
    child = multiprocessing.Process(target=serve, args=(port, nodes, slicing, ready), daemon=True)
    child.start()
    try:
        if not ready.wait(300):
            raise SystemExit("the server did not start")
        url = f"http://127.0.0.1:{port}"

        async def phases() -> list[JSON]:
            out = [await phase(url, 0, seconds / 2)]
            out.append(await phase(url, attackers, seconds))
            return out

        return asyncio.run(phases())
    finally:
        child.terminate()
        child.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--attackers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--port", type=int, default=18943)
    parser.add_argument("--before", action=argparse.BooleanOptionalAction, default=True,
                        help="also run the attack with slicing off (the before figure)")
    args = parser.parse_args()
    results: JSON = {"nodes": args.nodes, "devices": args.nodes * 8}
    for slicing in (True, False) if args.before else (True,):
        rows = run(args.nodes, args.attackers, args.seconds, slicing, args.port)
        results["sliced" if slicing else "budgets only"] = rows
        for row in rows:
            print(f"{'sliced      ' if slicing else 'budgets only'} attackers={row['attackers']}: honest n={row['honest_n']} "
                  f"p50={row['honest_p50_ms']} ms p99={row['honest_p99_ms']} ms max={row['honest_max_ms']} ms; "
                  f"longest loop stall {row['longest_stall_ms']} ms wall, {row['longest_stall_cpu_ms']} ms CPU "
                  f"(longest GC {row['longest_gc_ms']} ms); "
                  f"slow-lane calls {row['slow_lane_calls']}; "
                  f"attack answers {row['attack_answers']}  (load average {os.getloadavg()[0]:.2f})")
    out = Path(__file__).resolve().parent / "results"
    out.mkdir(exist_ok=True)
    (out / "slicing.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
